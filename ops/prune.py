"""Prune what finished operations leave in the store: records, job backups, packages and journals.

Every restart keeps its backups (with their working_dir packages) so that nothing is lost; they pile
up. `prune` deletes them once the operation has been finished for longer than the retention
(CLUSTERBOT_RETENTION_DAYS, 30 days by default). Finished means:

- a restart record (`operations/<cluster>/<op>/record.json`) at step done or abandoned, by its
  `finished_at`;
- an operation cleared by `ops unlock` before it had a record (its journal ends with `unlocked`);
- a bot operation (`bot/ops/<op>.json`, journal in `bot/journal/<op>/`) in a terminal state, by its
  last journal entry.

Never an unfinished one (any other step, an unreadable record), one whose cluster lock names it, or a
bot operation whose restart record is unfinished. The marker (the record) is deleted last, so a prune
stopped half-way is finished by the next one.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from ops.errors import BadInput
from ops.locks import current_lock
from ops.store import Store

FINISHED_STEPS = frozenset({"done", "abandoned"})  # ops.restart.Step
# bot/protocol/model.py TERMINAL, by value: ops/ does not import the bot.
TERMINAL_BOT_STATES = frozenset({"done", "failed", "cancelled", "expired"})
DEFAULT_RETENTION_DAYS = 30.0


class PrunedOp(BaseModel):
    op_id: str
    cluster: str
    source: str  # restart | unlocked | bot
    finished_at: datetime
    keys: int  # objects deleted (or that a dry run would delete)


class PruneResult(BaseModel):
    retention_days: float
    cutoff: datetime
    dry_run: bool
    pruned: list[PrunedOp]
    kept: dict[str, str]  # op id -> why it stays although old enough to look at (unfinished, locked)

    @property
    def deleted(self) -> int:
        return sum(p.keys for p in self.pruned)

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        lines = [
            f"{verb} {len(self.pruned)} finished operation(s) ({self.deleted} object(s)) finished before "
            f"{self.cutoff:%Y-%m-%d %H:%M} UTC (retention {self.retention_days:g} days)"
        ]
        lines += [
            f"  {p.op_id} ({p.source}, finished {p.finished_at:%Y-%m-%d}): {p.keys}" for p in self.pruned
        ]
        lines += [f"kept {op}: {why}" for op, why in self.kept.items()]
        return "\n".join(lines)


def retention_days(given: float | None = None) -> float:
    """The retention: `given` (a flag), else CLUSTERBOT_RETENTION_DAYS, else 30 days."""
    raw: Any = (
        given if given is not None else os.environ.get("CLUSTERBOT_RETENTION_DAYS", DEFAULT_RETENTION_DAYS)
    )
    try:
        days = float(raw)
    except ValueError:
        raise BadInput(f"CLUSTERBOT_RETENTION_DAYS={raw!r} is not a number of days", "e.g. 30") from None
    if days < 0:
        raise BadInput(f"a retention of {days:g} days is negative", "give 0 or more days")
    return days


def prune(
    store: Store, retention_days: float, dry_run: bool = False, now: datetime | None = None
) -> PruneResult:
    """Delete the finished operations older than `retention_days` (only list them when `dry_run`)."""
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    pruned: list[PrunedOp] = []
    kept: dict[str, str] = {}
    unfinished: set[str] = set()
    for (cluster, op_id), keys in _groups(store.list("operations/")).items():
        verdict = _restart_verdict(store, cluster, op_id, keys)
        if isinstance(verdict, str):
            unfinished.add(op_id)
            kept[op_id] = verdict
        elif verdict[1] < cutoff:
            pruned.append(_drop(store, cluster, op_id, verdict[0], verdict[1], _marker_last(keys), dry_run))
    for key in store.list("bot/ops/"):
        got = _bot_verdict(store, key, unfinished)
        if isinstance(got, tuple) and got[2] < cutoff:
            op_id, cluster, at = got
            keys = store.list(f"bot/journal/{op_id}/") + [key]  # the operation record last
            pruned.append(_drop(store, cluster, op_id, "bot", at, keys, dry_run))
        elif isinstance(got, str):
            kept.setdefault(key.removeprefix("bot/ops/").removesuffix(".json"), got)
    return PruneResult(
        retention_days=retention_days, cutoff=cutoff, dry_run=dry_run, pruned=pruned, kept=kept
    )


def _groups(keys: list[str]) -> dict[tuple[str, str], list[str]]:
    """`operations/<cluster>/<op>/...` keys by (cluster, op)."""
    out: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        parts = key.split("/")
        if len(parts) >= 4:
            out.setdefault((parts[1], parts[2]), []).append(key)
    return out


def _marker_last(keys: list[str]) -> list[str]:
    """The record (or, without one, the journal's last entry) goes last: it marks the rest as finished."""
    records = [k for k in keys if k.endswith("/record.json")]
    journal = sorted(k for k in keys if "/journal/" in k)
    markers = records or journal[-1:]
    return [k for k in keys if k not in markers] + markers


def _locked_by(store: Store, cluster: str, op_id: str) -> bool:
    held = current_lock(store, cluster)
    return held is not None and held.op_id == op_id


def _read_json(store: Store, key: str) -> dict[str, Any] | None:
    got = store.read(key)
    if got is None:
        return None
    try:
        data = json.loads(got.data)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _when(value: Any) -> datetime | None:
    try:
        at = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _last_entry_at(store: Store, scope: str) -> tuple[str, datetime] | None:
    keys = store.list(f"{scope}/journal/")
    entry = _read_json(store, max(keys)) if keys else None
    at = _when(entry.get("at")) if entry else None
    return None if entry is None or at is None else (str(entry.get("event")), at)


def _restart_verdict(store: Store, cluster: str, op_id: str, keys: list[str]) -> tuple[str, datetime] | str:
    """(how it finished, when) for a finished restart operation, else why it must stay."""
    if _locked_by(store, cluster, op_id):
        return f"its lock on {cluster} names it"
    scope = f"operations/{cluster}/{op_id}"
    if f"{scope}/record.json" in keys:
        record = _read_json(store, f"{scope}/record.json")
        if record is None:
            return "its record cannot be read"
        finished = _when(record.get("finished_at"))
        if record.get("step") not in FINISHED_STEPS or finished is None:
            return f"unfinished (step {record.get('step')})"
        return "restart", finished
    last = _last_entry_at(store, scope)
    if last is None or last[0] != "unlocked":
        return "unfinished (no record, not unlocked)"
    return "unlocked", last[1]


def _bot_verdict(store: Store, key: str, unfinished: set[str]) -> tuple[str, str, datetime] | str | None:
    """(op id, cluster, when it last moved) for a finished bot operation, else why it stays (None: open,
    not worth a line)."""
    op = _read_json(store, key)
    if op is None or not isinstance(op.get("op_id"), str) or not isinstance(op.get("cluster"), str):
        return "its record cannot be read"
    op_id, cluster = op["op_id"], op["cluster"]
    if op.get("state") not in TERMINAL_BOT_STATES:
        return None
    if op_id in unfinished:
        return "its restart is unfinished"
    if _locked_by(store, cluster, op_id):
        return f"its lock on {cluster} names it"
    created = _when(op.get("created_at"))
    last = _last_entry_at(store, f"bot/journal/{op_id}")
    times = [t for t in (created, last[1] if last else None) if t is not None]
    if not times:
        return "it has no time to age by"
    return op_id, cluster, max(times)


def _drop(
    store: Store, cluster: str, op_id: str, source: str, at: datetime, keys: list[str], dry_run: bool
) -> PrunedOp:
    if not dry_run:
        for key in keys:
            store.delete(key)
    return PrunedOp(op_id=op_id, cluster=cluster, source=source, finished_at=at, keys=len(keys))
