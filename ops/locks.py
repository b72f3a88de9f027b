"""One operation per cluster: a lock record in the store, held under a lease that its holder renews.

The lock doubles as the marker of an unfinished operation: it is released only when the operation
ends (or is abandoned). A holder that dies stops renewing; once its lease has expired, `take_over`
lets a resume continue the same operation. A lock is never deleted (no conditional deletes on GCS):
releasing it writes a released record by compare-and-set.

The lock records its phase (announced: waiting for consent in chat; executing), so that whoever is
refused learns what really holds the cluster, and `unlock` lets a person clear any lock, given the
id of the operation holding it.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel

from ops import journal
from ops.errors import Refused
from ops.store import Conflict, Store, dump, read_model

Phase = Literal["announced", "executing"]


def now() -> datetime:
    return datetime.now(UTC)


def _clock(t: datetime) -> str:
    """12:03 UTC today, 2026-11-23 12:03 UTC on another day: short where it cannot mislead."""
    return f"{t:%H:%M} UTC" if t.date() == now().date() else f"{t:%Y-%m-%d %H:%M} UTC"


class LockRecord(BaseModel):
    cluster: str
    op_id: str
    kind: str
    owner: str
    host: str
    pid: int
    acquired_at: datetime
    heartbeat_at: datetime
    lease_s: float
    released: bool = False
    holder: str | None = None  # a long-lived holder (the bot) that may take its own locks back at once
    # announced: the bot holds the cluster while the owners are asked in chat; executing: the work
    # runs. Records written before the phase existed, and CLI operations, are executing.
    phase: Phase = "executing"
    phase_since: datetime | None = None  # when the phase began (None: at acquired_at)

    def expired(self, at: datetime | None = None) -> bool:
        return (at or now()) > self.heartbeat_at + timedelta(seconds=self.lease_s)

    def situation(self) -> str:
        """What the holder is doing, told from the phase and the lease."""
        if self.expired():
            waiting = " while waiting for consent in chat" if self.phase == "announced" else ""
            beat = _clock(self.heartbeat_at)
            return f"its process stopped{waiting} (pid {self.pid} on {self.host}, last heartbeat {beat})"
        since = _clock(self.phase_since or self.acquired_at)
        if self.phase == "announced":
            return f"waiting for consent in chat since {since}"
        return f"running on {self.host} (pid {self.pid}) since {since}"

    def describe(self) -> str:
        since = _clock(self.acquired_at)
        return f"{self.kind} {self.op_id} by {self.owner} since {since}: {self.situation()}"


def _key(cluster: str) -> str:
    return f"locks/{cluster}.json"


def current_lock(store: Store, cluster: str) -> LockRecord | None:
    """The lock held on `cluster` (expired or not), or None when it is free."""
    got = read_model(store, _key(cluster), LockRecord)
    return None if got is None or got[0].released else got[0]


class Lease:
    """A held lock. `renew()` extends it; a background thread does so while an operation runs.

    Writes are serialized by a mutex, so the renewing thread and `release()` never race each other on
    the version (which would look like a lost lock) and no renewal lands after the release."""

    def __init__(self, store: Store, record: LockRecord, version: str) -> None:
        self._store = store
        self.record = record
        self._version = version
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()
        self.lost = False

    def _write(self, **update: object) -> None:
        with self._mutex:
            if self.lost:
                raise Refused(f"lost the lock on {self.record.cluster}")
            if self.record.released:
                raise Refused(f"the lock on {self.record.cluster} was already released")
            record = self.record.model_copy(update={"heartbeat_at": now(), **update})
            try:
                self._version = self._store.replace(_key(record.cluster), dump(record), self._version)
            except Conflict:
                self.lost = True
                raise Refused(
                    f"lost the lock on {record.cluster}: another process took over operation "
                    f"{record.op_id} or it was force-unlocked"
                ) from None
            self.record = record

    def renew(self) -> None:
        self._write()

    def set_phase(self, phase: Phase) -> None:
        """Record that the operation moved on (announced -> executing), by compare-and-set like renew."""
        self._write(phase=phase, phase_since=now())

    def expire(self) -> None:
        """Keep the lock but end the lease now, so a failed operation can be resumed at once."""
        self.stop_renewing()
        self._write(heartbeat_at=now() - timedelta(seconds=self.record.lease_s + 1))

    def release(self) -> None:
        self.stop_renewing()
        with self._mutex:
            if self.lost or self.record.released:
                return
        self._write(released=True)

    def start_renewing(self) -> None:
        """Renew every third of the lease in a daemon thread until `release()` or `stop_renewing()`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.record.lease_s / 3):
                try:
                    self.renew()
                except Refused:
                    return
                except Exception:  # a store hiccup: try again next beat
                    continue

        self._thread = threading.Thread(target=loop, name=f"lease-{self.record.cluster}", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def acquire(
    store: Store,
    cluster: str,
    op_id: str,
    kind: str,
    owner: str,
    lease_s: float,
    holder: str | None = None,
    phase: Phase = "executing",
) -> Lease:
    """Take the free lock on `cluster` for a new operation; Refused says who holds it and what it does.

    The bot takes it `announced` while it asks for consent, then calls `Lease.set_phase("executing")`."""
    t = now()
    record = LockRecord(
        cluster=cluster,
        op_id=op_id,
        kind=kind,
        owner=owner,
        host=socket.gethostname(),
        pid=os.getpid(),
        acquired_at=t,
        heartbeat_at=t,
        lease_s=lease_s,
        holder=holder,
        phase=phase,
    )
    got = read_model(store, _key(cluster), LockRecord)
    try:
        if got is None:
            version = store.create(_key(cluster), dump(record))
        elif got[0].released:
            version = store.replace(_key(cluster), dump(record), got[1])
        else:
            raise held_refusal(got[0])
    except Conflict:
        held = current_lock(store, cluster)
        if held is None:
            raise Refused(f"{cluster} was locked at the same moment by someone else") from None
        raise held_refusal(held) from None
    return Lease(store, record, version)


def take_over(
    store: Store, cluster: str, op_id: str, owner: str, lease_s: float, holder: str | None = None
) -> Lease:
    """Continue operation `op_id` whose holder stopped renewing; refused while its lease is alive,
    unless `holder` names the same long-lived holder (the bot, restarted) that took the lock."""
    got = read_model(store, _key(cluster), LockRecord)
    if got is None or got[0].released or got[0].op_id != op_id:
        raise Refused(f"operation {op_id} does not hold the lock on {cluster}")
    old, version = got
    if not old.expired() and not (holder is not None and old.holder == holder):
        left = (old.heartbeat_at + timedelta(seconds=old.lease_s) - now()).total_seconds()
        raise Refused(
            f"{cluster} is locked by {old.describe()}: its holder is still alive",
            f"its lease expires in {max(left, 0):.0f}s if it has died; resume after that",
        )
    record = old.model_copy(
        update={
            "owner": owner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "heartbeat_at": now(),
            "lease_s": lease_s,
        }
    )
    try:
        version = store.replace(_key(cluster), dump(record), version)
    except Conflict:
        raise Refused(f"someone else resumed {op_id} at the same moment") from None
    return Lease(store, record, version)


_FORCE_TRIES = 20


def _mismatch(cluster: str, op_id: str, held: LockRecord) -> Refused:
    return Refused(
        f"{op_id} does not hold the lock on {cluster}: it is held by {held.describe()}",
        f"check it with `python -m ops status --cluster {cluster}`, then give --op {held.op_id}",
    )


def holding(store: Store, cluster: str, op_id: str) -> LockRecord:
    """The lock on `cluster` if operation `op_id` holds it; Refused when it is free or another holds it."""
    held = current_lock(store, cluster)
    if held is None:
        raise Refused(f"{cluster} is not locked", "nothing to unlock")
    if held.op_id != op_id:
        raise _mismatch(cluster, op_id, held)
    return held


def _release_held(store: Store, cluster: str, op_id: str | None) -> LockRecord | None:
    """Release the lock on `cluster` (only if `op_id` holds it, when given); returns what was released.

    A live holder may renew between our read and our write: read again and retry (a bounded number of
    times) instead of failing with the store's Conflict."""
    for _ in range(_FORCE_TRIES):
        got = read_model(store, _key(cluster), LockRecord)
        if got is None or got[0].released:
            return None
        held, version = got
        if op_id is not None and held.op_id != op_id:
            raise _mismatch(cluster, op_id, held)
        try:
            store.replace(_key(cluster), dump(held.model_copy(update={"released": True})), version)
        except Conflict:
            continue
        return held
    raise Refused(
        f"could not unlock {cluster}: its lock changed on each of {_FORCE_TRIES} tries",
        "try again",
    )


def force_unlock(store: Store, cluster: str) -> LockRecord | None:
    """Admin way out (the bot's /unlock): release whatever holds `cluster`. Returns what was released."""
    return _release_held(store, cluster, None)


def new_op_id(scope: str) -> str:
    """A new operation's id: its cluster (or, without one, its kind), the UTC time, a random suffix."""
    return f"{scope}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def operation_scope(cluster: str, op_id: str) -> str:
    """Where an operation's record, backups and journal live in the store."""
    return f"operations/{cluster}/{op_id}"


def unlock(store: Store, cluster: str, op_id: str, by: str) -> LockRecord:
    """A person's way out of any lock, live or dead, with or without an operation record: released
    only when `op_id` names the operation holding it (proof the caller looked), and journaled."""
    held = _release_held(store, cluster, op_id)
    if held is None:
        raise Refused(f"{cluster} is not locked", "nothing to unlock")
    journal.append(store, operation_scope(cluster, op_id), "unlocked", by=by, kind=held.kind,
                   owner=held.owner, phase=held.phase, host=held.host, pid=held.pid,
                   expired=held.expired())  # fmt: skip
    return held


def held_refusal(rec: LockRecord) -> Refused:
    """The refusal for anyone who finds `rec` holding the cluster: what it does, and the way out."""
    return Refused(f"{rec.cluster} is locked by {rec.describe()}", held_hint(rec))


def held_hint(rec: LockRecord) -> str:
    unlock_cmd = f"`python -m ops unlock --cluster {rec.cluster} --op {rec.op_id} --yes` clears the lock"
    if not rec.expired():
        if rec.phase == "announced":
            return "it starts once the owners agree in #infra, or is cancelled there"
        return "wait for it to finish"
    if rec.phase == "announced":
        return f"the bot takes it up again when it starts; {unlock_cmd}"
    if rec.kind == "restart":
        return (
            f"`python -m ops restart --cluster {rec.cluster} --resume` continues it, `--abandon` gives "
            f"it up; {unlock_cmd}"
        )
    return unlock_cmd
