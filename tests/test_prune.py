"""Pruning finished operations, on both store backends: what goes, and what always stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.protocol.model import Operation, State, User
from ops import journal
from ops.errors import BadInput
from ops.locks import acquire, unlock
from ops.prune import prune, retention_days
from ops.restart import RestartRecord, Step
from ops.store import LocalStore, Store, dump
from tests.localray import Env

NOW = datetime.now(UTC)


def a_restart(
    store: Store, op_id: str, step: Step, finished_days_ago: float | None, cluster: str = "c1"
) -> list[str]:
    """A restart record with a backed-up job, its working_dir package and a journal; returns its keys."""
    finished = NOW - timedelta(days=finished_days_ago) if finished_days_ago is not None else None
    record = RestartRecord(op_id=op_id, cluster=cluster, requested_by="alice", preserve_jobs=True,
                           created_at=NOW - timedelta(days=60), step=step, jobs=["raysubmit_1"],
                           finished_at=finished)  # fmt: skip
    scope = record.scope
    store.put(f"{scope}/jobs/raysubmit_1.json", b'{"env_vars": {"HF_TOKEN": "x"}}')
    store.put(f"{scope}/packages/_ray_pkg_abc.zip", b"PK\x03\x04 a package")
    journal.append(store, scope, "requested", by="alice")
    store.create(f"{scope}/record.json", dump(record))
    return store.list(f"{scope}/")


def a_bot_op(store: Store, op_id: str, state: State, created_days_ago: float = 60) -> None:
    op = Operation(op_id=op_id, kind="restart", cluster="c1", requester=User(id="1", name="alice"),
                   state=state, created_at=NOW - timedelta(days=created_days_ago))  # fmt: skip
    store.put(f"bot/ops/{op_id}.json", dump(op))
    journal.append(store, f"bot/journal/{op_id}", "announced", by="alice")


def test_finished_restarts_older_than_the_retention_go_with_their_backups(store: Store) -> None:
    old_done = a_restart(store, "op-done", Step.DONE, finished_days_ago=40)
    old_abandoned = a_restart(store, "op-abandoned", Step.ABANDONED, finished_days_ago=31)
    recent = a_restart(store, "op-recent", Step.DONE, finished_days_ago=29)
    unfinished = a_restart(store, "op-unfinished", Step.BACKED_UP, finished_days_ago=None)
    assert len(old_done) == 4

    dry = prune(store, 30, dry_run=True)
    assert sorted(p.op_id for p in dry.pruned) == ["op-abandoned", "op-done"]
    assert dry.deleted == 8 and "would delete 2 finished operation(s) (8 object(s))" in dry.summary()
    assert all(store.read(k) is not None for k in old_done + old_abandoned)  # a dry run deletes nothing

    result = prune(store, 30)
    assert sorted(p.op_id for p in result.pruned) == ["op-abandoned", "op-done"]
    assert {p.source for p in result.pruned} == {"restart"}
    assert store.list("operations/c1/op-done/") == [] and store.list("operations/c1/op-abandoned/") == []
    assert store.list("operations/c1/op-recent/") == recent
    assert store.list("operations/c1/op-unfinished/") == unfinished
    assert result.kept == {"op-unfinished": "unfinished (step backed_up)"}
    assert prune(store, 30).pruned == []  # nothing left to do: idempotent


def test_a_finished_operation_still_named_by_its_lock_stays(store: Store) -> None:
    keys = a_restart(store, "op-1", Step.DONE, finished_days_ago=40)
    lease = acquire(store, "c1", "op-1", "restart", "alice", lease_s=30)
    assert prune(store, 30).kept == {"op-1": "its lock on c1 names it"}
    assert store.list("operations/c1/op-1/") == keys
    lease.release()
    assert [p.op_id for p in prune(store, 30).pruned] == ["op-1"]


def test_an_unreadable_record_stays(store: Store) -> None:
    store.put("operations/c1/op-1/record.json", b"{not json")
    store.put("operations/c1/op-1/jobs/j.json", b"{}")
    assert prune(store, 0, now=NOW + timedelta(days=400)).kept == {"op-1": "its record cannot be read"}
    assert len(store.list("operations/c1/op-1/")) == 2


def test_an_unlocked_operation_without_a_record_goes_after_the_retention(store: Store) -> None:
    acquire(store, "c1", "op-1", "restart", "alice", lease_s=30, phase="announced")
    unlock(store, "c1", "op-1", by="carol")
    assert prune(store, 30).pruned == []  # unlocked just now
    result = prune(store, 30, now=NOW + timedelta(days=31))
    assert [(p.op_id, p.source) for p in result.pruned] == [("op-1", "unlocked")]
    assert store.list("operations/") == []


def test_bot_operations_in_a_terminal_state_go_open_ones_stay(store: Store) -> None:
    a_bot_op(store, "op-done", State.DONE)
    a_bot_op(store, "op-cancelled", State.CANCELLED)
    a_bot_op(store, "op-awaiting", State.AWAITING)
    a_bot_op(store, "op-failed", State.FAILED)
    a_restart(store, "op-failed", Step.CLUSTER_STOPPED, finished_days_ago=None)  # resumable from the CLI
    later = NOW + timedelta(days=31)
    assert prune(store, 30, now=NOW + timedelta(days=29)).pruned == []  # their journals moved today

    result = prune(store, 30, now=later)
    assert sorted((p.op_id, p.source) for p in result.pruned) == [("op-cancelled", "bot"), ("op-done", "bot")]
    assert store.list("bot/ops/") == ["bot/ops/op-awaiting.json", "bot/ops/op-failed.json"]
    assert store.list("bot/journal/op-done/") == [] and store.list("bot/journal/op-awaiting/") != []
    assert result.kept["op-failed"].startswith("unfinished")
    assert store.list("operations/c1/op-failed/") != []


def test_delete_of_an_absent_key_counts_as_deleted(store: Store) -> None:
    store.put("a/b.json", b"1")
    store.delete("a/b.json")
    store.delete("a/b.json")
    store.delete("never/there.json")
    assert store.read("a/b.json") is None and store.list("a/") == []


def test_local_prune_leaves_no_empty_directories(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    a_restart(store, "op-1", Step.DONE, finished_days_ago=40)
    prune(store, 30)
    assert list((tmp_path / "store").iterdir()) == []


def test_retention_comes_from_the_flag_then_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLUSTERBOT_RETENTION_DAYS", raising=False)
    assert retention_days() == 30
    monkeypatch.setenv("CLUSTERBOT_RETENTION_DAYS", "7")
    assert retention_days() == 7 and retention_days(2) == 2
    monkeypatch.setenv("CLUSTERBOT_RETENTION_DAYS", "a week")
    with pytest.raises(BadInput, match="a week"):
        retention_days()
    with pytest.raises(BadInput, match="negative"):
        retention_days(-1)


def test_ops_prune_from_the_terminal(ops_env: Env, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    a_restart(store, "op-old", Step.DONE, finished_days_ago=10)
    env = {"CLUSTERBOT_STORE": str(store.root), "CLUSTERBOT_RETENTION_DAYS": "12"}
    r = ops_env.ops("prune", "--dry-run", extra_env=env)
    assert r.code == 0, r
    assert "would delete 0 finished operation(s)" in r.out and "retention 12 days" in r.out

    r = ops_env.ops("prune", "--retention-days", "7", "--json", extra_env=env)
    assert r.code == 0, r
    assert [p["op_id"] for p in r.json()["pruned"]] == ["op-old"] and r.json()["dry_run"] is False
    assert store.list("operations/") == []

    r = ops_env.ops("prune", "--retention-days", "-3", extra_env=env)
    assert r.code == 2 and "negative" in r.err


class _GoesAwayAfter:
    """A store whose deletes fail after the first `n`: a prune stopped half-way."""

    def __init__(self, store: Store, n: int) -> None:
        self._store, self.left = store, n
        self.url = store.url

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._store, name)

    def delete(self, key: str) -> None:
        if self.left == 0:
            raise OSError("the store went away")
        self.left -= 1
        self._store.delete(key)


def test_a_prune_stopped_half_way_is_finished_by_the_next(store: Store) -> None:
    a_restart(store, "op-1", Step.DONE, finished_days_ago=40)
    with pytest.raises(OSError):
        prune(_GoesAwayAfter(store, 2), 30)  # type: ignore[arg-type]
    assert store.read("operations/c1/op-1/record.json") is not None  # the record goes last
    assert len(store.list("operations/c1/op-1/")) == 2
    assert [p.op_id for p in prune(store, 30).pruned] == ["op-1"]
    assert store.list("operations/") == []
