"""Cluster locks with leases, on both store backends (local directory, GCS on fake-gcs-server)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from ops import journal, locks
from ops.errors import Refused
from ops.locks import Lease, acquire, current_lock, force_unlock, take_over
from ops.store import Store
from tests.gcs_emulator import StoreFactory

WAIT_S = 10.0  # upper bound of every wait below


@pytest.fixture
def leases() -> list[Lease]:
    """Leases a test started renewing: their threads are stopped at the end whatever happens."""
    held: list[Lease] = []
    yield held
    for lease in held:
        lease.stop_renewing()


def wait_until(cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def test_acquire_free_cluster(store: Store) -> None:
    assert current_lock(store, "c1") is None
    lease = acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    assert not lease.lost
    held = current_lock(store, "c1")
    assert held is not None
    assert (held.op_id, held.kind, held.owner, held.lease_s) == ("op-1", "restart", "alice", 30)
    assert not held.expired()
    assert current_lock(store, "other") is None


def test_second_acquire_refused_names_owner_and_op(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    with pytest.raises(Refused) as e:
        acquire(store, "c1", "op-2", "restart", "bob", lease_s=30)
    assert "alice" in str(e.value) and "op-1" in str(e.value) and "restart" in str(e.value)
    assert current_lock(store, "c1").op_id == "op-1"


def test_release_then_acquire_again(store: Store) -> None:
    lease = acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    lease.release()
    assert current_lock(store, "c1") is None
    lease.release()  # twice is harmless
    again = acquire(store, "c1", "op-2", "scale", "bob", lease_s=30)
    assert current_lock(store, "c1").op_id == "op-2"
    again.release()
    assert current_lock(store, "c1") is None


def test_renew_after_release_does_not_relock(store: Store) -> None:
    lease = acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    lease.release()
    with pytest.raises(Refused):
        lease.renew()
    assert current_lock(store, "c1") is None


def test_renew_extends_heartbeat(store: Store) -> None:
    lease = acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    before = current_lock(store, "c1").heartbeat_at
    time.sleep(0.01)
    lease.renew()
    assert current_lock(store, "c1").heartbeat_at > before


def test_take_over_only_after_expiry(make_store: StoreFactory) -> None:
    old_store, new_store = make_store(), make_store()
    old = acquire(old_store, "c1", "op-1", "restart", "alice", lease_s=1.0)
    with pytest.raises(Refused) as e:
        take_over(new_store, "c1", "op-1", "bob", lease_s=30)
    assert "alice" in str(e.value) and "still alive" in str(e.value)
    with pytest.raises(Refused):
        take_over(new_store, "c1", "op-other", "bob", lease_s=30)  # not the operation holding it

    wait_until(lambda: current_lock(new_store, "c1").expired(), "the 1 s lease to expire")
    new = take_over(new_store, "c1", "op-1", "bob", lease_s=30)
    held = current_lock(new_store, "c1")
    assert (held.op_id, held.owner, held.lease_s) == ("op-1", "bob", 30)
    assert held.acquired_at == old.record.acquired_at  # the same operation continues

    with pytest.raises(Refused, match="lost the lock"):
        old.renew()
    assert old.lost
    old.release()  # a lost lease releases nothing
    assert current_lock(new_store, "c1").owner == "bob"
    new.renew()
    new.release()
    assert current_lock(new_store, "c1") is None


def test_take_over_of_free_or_released_lock_refused(store: Store) -> None:
    with pytest.raises(Refused):
        take_over(store, "c1", "op-1", "bob", lease_s=30)
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=30).release()
    with pytest.raises(Refused):
        take_over(store, "c1", "op-1", "bob", lease_s=30)


def test_start_renewing_keeps_short_lease_alive(make_store: StoreFactory, leases: list[Lease]) -> None:
    holder_store, other_store = make_store(), make_store()
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=1.0)
    leases.append(lease)
    lease.start_renewing()
    lease.start_renewing()  # a second call does not start a second thread
    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # 2.5 lease lengths
        held = current_lock(other_store, "c1")
        assert held is not None and not held.expired(), "the lease expired while being renewed"
        time.sleep(0.1)
    with pytest.raises(Refused, match="still alive"):
        take_over(other_store, "c1", "op-1", "bob", lease_s=30)
    assert not lease.lost

    lease.release()
    assert lease._thread is not None and not lease._thread.is_alive()
    assert current_lock(other_store, "c1") is None
    time.sleep(0.5)  # more than a renewal period: no renewal may land after the release
    assert current_lock(other_store, "c1") is None


def test_release_while_renewing_fast(store: Store, leases: list[Lease]) -> None:
    """The renewing thread and release() share the version: neither may make the other look lost."""
    for i in range(5):
        lease = acquire(store, "c1", f"op-{i}", "restart", "alice", lease_s=0.03)  # renews every 10 ms
        leases.append(lease)
        lease.start_renewing()
        time.sleep(0.05)
        lease.release()
        assert not lease.lost
        assert current_lock(store, "c1") is None


def test_renewing_thread_stops_when_lease_lost(make_store: StoreFactory, leases: list[Lease]) -> None:
    holder_store, admin_store = make_store(), make_store()
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=0.3)
    leases.append(lease)
    lease.start_renewing()
    released = force_unlock(admin_store, "c1")
    assert released is not None and released.op_id == "op-1"
    wait_until(lambda: not lease._thread.is_alive(), "the renewing thread to notice the lost lease")
    assert lease.lost
    assert current_lock(admin_store, "c1") is None


def test_force_unlock(make_store: StoreFactory) -> None:
    holder_store, admin_store = make_store(), make_store()
    assert force_unlock(admin_store, "c1") is None
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=30)
    released = force_unlock(admin_store, "c1")
    assert released is not None and (released.op_id, released.owner) == ("op-1", "alice")
    assert current_lock(admin_store, "c1") is None
    assert force_unlock(admin_store, "c1") is None
    with pytest.raises(Refused):
        lease.renew()
    assert lease.lost
    acquire(admin_store, "c1", "op-2", "restart", "bob", lease_s=30)
    assert current_lock(holder_store, "c1").op_id == "op-2"


class _RenewBetweenReadAndWrite:
    """A store proxy: just before the first compare-and-set, the holder renews its lease, so the
    compare-and-set sees a version it did not read."""

    def __init__(self, store: Store, lease: Lease) -> None:
        self._store, self._lease, self.interfered = store, lease, False
        self.url = store.url

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._store, name)

    def replace(self, key: str, data: bytes, version: str) -> str:
        if not self.interfered:
            self.interfered = True
            self._lease.renew()
        return self._store.replace(key, data, version)


def test_force_unlock_retries_when_holder_renews_meanwhile(make_store: StoreFactory) -> None:
    holder_store, admin_store = make_store(), make_store()
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=30)
    proxy = _RenewBetweenReadAndWrite(admin_store, lease)
    released = force_unlock(proxy, "c1")
    assert proxy.interfered
    assert released is not None and released.op_id == "op-1"
    assert current_lock(admin_store, "c1") is None
    with pytest.raises(Refused):
        lease.renew()


@pytest.mark.parametrize("initially", ["absent", "released"])
def test_concurrent_acquire_exactly_one_wins(make_store: StoreFactory, initially: str) -> None:
    n = 6
    stores = [make_store() for _ in range(n)]
    if initially == "released":
        acquire(stores[0], "c1", "op-0", "restart", "zed", lease_s=30).release()
    barrier = threading.Barrier(n, timeout=WAIT_S)
    won: list[int] = []
    refused: list[int] = []
    errors: list[BaseException] = []

    def attempt(i: int) -> None:
        try:
            barrier.wait()
            acquire(stores[i], "c1", f"op-{i}", "restart", f"user{i}", lease_s=30)
            won.append(i)
        except Refused:
            refused.append(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=attempt, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert len(won) == 1 and len(refused) == n - 1, (won, refused)
    assert current_lock(stores[0], "c1").op_id == f"op-{won[0]}"


def test_held_hint_for_expired_restart(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=0.05)
    wait_until(lambda: current_lock(store, "c1").expired(), "the lease to expire")
    with pytest.raises(Refused) as e:
        acquire(store, "c1", "op-2", "restart", "bob", lease_s=30)
    assert "--resume" in e.value.hint
    assert locks.current_lock(store, "c1").op_id == "op-1"


# -- phase, truthful refusals, and unlock ------------------------------------------------------------
def test_a_lock_records_its_phase(make_store: StoreFactory) -> None:
    bot_store, other = make_store(), make_store()
    lease = acquire(bot_store, "c1", "op-1", "restart", "alice", lease_s=30, holder="bot", phase="announced")
    assert current_lock(other, "c1").phase == "announced"
    with pytest.raises(Refused) as e:
        acquire(other, "c1", "op-2", "restart", "bob", lease_s=30)
    assert "waiting for consent in chat since" in e.value.reason and "op-1" in e.value.reason
    assert "alice" in e.value.reason and "#infra" in e.value.hint

    lease.set_phase("executing")
    held = current_lock(other, "c1")
    assert held.phase == "executing" and held.phase_since is not None
    with pytest.raises(Refused) as e:
        acquire(other, "c1", "op-2", "restart", "bob", lease_s=30)
    assert f"running on {held.host} (pid {held.pid}) since" in e.value.reason
    assert "waiting for consent" not in e.value.reason and e.value.hint == "wait for it to finish"

    force_unlock(other, "c1")
    with pytest.raises(Refused, match="lost the lock"):
        lease.set_phase("executing")  # compare-and-set: a lease that lost its lock writes nothing
    assert current_lock(other, "c1") is None


def test_cli_operations_and_old_records_are_executing(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    assert current_lock(store, "c1").phase == "executing"
    raw = json.loads(store.read("locks/c1.json").data)
    del raw["phase"], raw["phase_since"]  # a record written before the phase existed
    store.put("locks/c1.json", json.dumps(raw).encode())
    assert current_lock(store, "c1").phase == "executing"


def test_a_stopped_holder_is_told_as_stopped_with_the_ways_out(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=0.05, phase="announced")
    acquire(store, "c2", "op-2", "restart", "alice", lease_s=0.05)
    acquire(store, "c3", "op-3", "scale", "alice", lease_s=0.05)
    wait_until(lambda: all(current_lock(store, c).expired() for c in ("c1", "c2", "c3")), "the leases to end")
    refusals = {}
    for c in ("c1", "c2", "c3"):
        with pytest.raises(Refused) as e:
            acquire(store, c, "op-9", "restart", "bob", lease_s=30)
        refusals[c] = e.value
    assert "stopped while waiting for consent in chat" in refusals["c1"].reason
    assert (
        "--resume" not in refusals["c1"].hint and "unlock --cluster c1 --op op-1 --yes" in refusals["c1"].hint
    )
    assert "its process stopped (pid" in refusals["c2"].reason
    assert "--resume" in refusals["c2"].hint and "--abandon" in refusals["c2"].hint
    assert "unlock --cluster c2 --op op-2 --yes" in refusals["c2"].hint
    assert "--resume" not in refusals["c3"].hint and "unlock --cluster c3 --op op-3" in refusals["c3"].hint
    for r in refusals.values():
        assert "wait for it" not in str(r) and "running on" not in r.reason


def test_take_over_keeps_the_phase(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=0.05, phase="announced")
    wait_until(lambda: current_lock(store, "c1").expired(), "the lease to end")
    take_over(store, "c1", "op-1", "alice", lease_s=30)
    assert current_lock(store, "c1").phase == "announced"


def test_unlock_needs_the_id_of_the_operation_holding_the_lock(make_store: StoreFactory) -> None:
    holder_store, admin_store = make_store(), make_store()
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=30, phase="announced")
    before = admin_store.read("locks/c1.json").data
    with pytest.raises(Refused) as e:
        locks.unlock(admin_store, "c1", "op-0", by="carol")
    assert "op-0 does not hold the lock on c1" in e.value.reason and "op-1" in e.value.reason
    assert "--op op-1" in e.value.hint
    assert admin_store.read("locks/c1.json").data == before
    assert journal.read(admin_store, "operations/c1/op-0") == []

    released = locks.unlock(admin_store, "c1", "op-1", by="carol")
    assert (released.op_id, released.phase) == ("op-1", "announced")
    assert current_lock(admin_store, "c1") is None
    entries = journal.read(admin_store, locks.operation_scope("c1", "op-1"))
    assert [(x["event"], x["by"], x["phase"], x["owner"]) for x in entries] == [
        ("unlocked", "carol", "announced", "alice")
    ]
    with pytest.raises(Refused, match="lost the lock"):
        lease.renew()  # the live holder learns it lost the cluster
    with pytest.raises(Refused, match="c1 is not locked"):
        locks.unlock(admin_store, "c1", "op-1", by="carol")


def test_unlock_retries_when_holder_renews_meanwhile(make_store: StoreFactory) -> None:
    holder_store, admin_store = make_store(), make_store()
    lease = acquire(holder_store, "c1", "op-1", "restart", "alice", lease_s=30)
    proxy = _RenewBetweenReadAndWrite(admin_store, lease)
    assert locks.unlock(proxy, "c1", "op-1", by="carol").op_id == "op-1"
    assert proxy.interfered and current_lock(admin_store, "c1") is None
