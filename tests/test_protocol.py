"""The protocol engine with the recorder chat: consent paths, rights, double clicks, timers, persistence.

Windows are driven: the engine's clock is a ManualClock the test moves (15-minute windows pass in no
time); a few stories run on the real clock end to end.

The operation here is the restart's spec (parameters, texts) with a `look` that reports a fixed set of
jobs and an `execute` that counts its runs; the engine around it (lock, store, journal, timers) is the
real one. The real restart through the engine is in test_bot_restart.py. Operations declared only here
(an announce-only one on no cluster, a full-ceremony one on a cluster) show that an operation is a
plug-in: the engine, the rules and the adapters know none by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from bot.adapters.recorder import ManualClock, Recorder
from bot.config import BotConfig, Rights, Windows
from bot.operations import restart
from bot.protocol import rules
from bot.protocol.engine import Engine, Look, Outcome, Spec
from bot.protocol.model import (
    AdminOnly,
    Affected,
    ClusterParams,
    Operation,
    Params,
    State,
    Texts,
    User,
    Vote,
)
from ops import journal
from ops.context import Context
from ops.errors import Refused
from ops.jobs import Job
from ops.locks import current_lock
from ops.registry import load_registry
from ops.restart import Settings
from ops.store import LocalStore, read_model

ALICE = User(id="alice", name="alice")
BOB = User(id="bob", name="bob")
CAROL = User(id="carol", name="carol")
ADMIN = User(id="root", name="root", roles=["infra-admin"])
MALLORY = User(id="mallory", name="mallory")


def job(owner: str | None, n: int = 0) -> Job:
    return Job(submission_id=f"raysubmit_{owner}_{n}", status="RUNNING", owner=owner,
               owner_source="metadata" if owner else "unknown", entrypoint="sleep 1")  # fmt: skip


class Fixture:
    def __init__(
        self, tmp_path: Path, jobs: list[Job], windows: Windows, clock: ManualClock | None = None
    ) -> None:
        self.clock = clock
        self.store = LocalStore(tmp_path / "store")
        self.registry = load_registry()
        self.jobs = jobs
        self.runs: list[str] = []
        self.config = BotConfig(rights=Rights(admin_roles=["infra-admin"]), windows=windows,
                                owners={"alice": "alice", "bob": "bob", "carol": "carol"})  # fmt: skip
        self.chat = Recorder()

    def spec(self) -> Spec:
        def execute(engine, op, lease, progress):  # noqa: ANN001, ANN202
            self.runs.append(op.op_id)
            progress("step one")
            if lease is not None:
                lease.release()
            return Outcome("all went well", owners=[j.owner for j in self.jobs if j.owner])

        look = lambda *a: Look(list(self.jobs), [])  # noqa: E731
        return dataclasses.replace(restart.spec(Settings(lease_s=30)), look=look, execute=execute)

    def engine(self, specs: dict[str, Spec] | None = None) -> Engine:
        ctx = Context(self.store, self.registry)
        return Engine(ctx, self.config, self.chat, specs or {"restart": self.spec()},
                      **({"clock": self.clock} if self.clock else {}))  # fmt: skip


FAST = Windows(
    confirm_s=5, consent_s=3, grace_s=0.3, tick_s=0.05, delay_choices_min=[10, 30], max_delay_s=3600
)


@contextlib.asynccontextmanager
async def running(fx: Fixture) -> AsyncIterator[Engine]:
    """The engine started (its clock ticking) for the test, closed after it."""
    engine = fx.engine()
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def until(predicate, timeout: float = 10.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await asyncio.sleep(0.02)


# The people's windows (15 min consent, 10 min to confirm, 2 min grace), on a clock the test drives.
DRIVEN = Windows(tick_s=0.05)


async def later(engine: Engine, seconds: float) -> None:
    """Time passes on the engine's (manual) clock, and the engine looks at its deadlines."""
    engine.clock.advance(seconds)
    await engine.tick()


@pytest.fixture
def fx(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path, [job("alice"), job("bob"), job("bob", 1)], FAST)


@pytest.fixture
def driven(tmp_path: Path) -> Fixture:
    return Fixture(tmp_path, [job("alice"), job("bob"), job("bob", 1)], DRIVEN, ManualClock())


async def test_all_ok_then_confirm_runs_once(fx: Fixture) -> None:
    async with running(fx) as engine:
        r = await engine.request(ALICE, "restart", "local")
        assert r.ok, r.text
        op_id = next(iter(engine.ops))
        announcement = fx.chat.new_posts()[0]
        assert announcement.mentions == ["bob"]  # alice's own job needs no consent
        assert "@bob: 2 jobs, not answered yet" in announcement.text  # a vote, not a job state
        assert (
            r.text == f"announced `{op_id}` in #infra (https://chat.test/infra/1): Confirm there to go ahead"
        )
        assert current_lock(fx.store, "local").op_id == op_id

        assert (await engine.act(BOB, op_id, "ok")).text == "OK counted"
        assert "@bob: 2 jobs, OK" in fx.chat.text(engine.ops[op_id].message_id)
        assert (await engine.act(BOB, op_id, "ok")).text == "already counted: OK"  # double click
        assert engine.ops[op_id].state == State.AWAITING  # the requester has not confirmed
        await engine.act(ALICE, op_id, "confirm")
        await until(lambda: len(fx.chat.new_posts()) == 2)  # the report follows the DONE state
        assert engine.ops[op_id].state == State.DONE and fx.runs == [op_id]
        report = fx.chat.new_posts()[-1]
        assert "bob" in report.mentions and "all went well" in report.text
        assert current_lock(fx.store, "local") is None


async def test_a_click_answered_before_its_edit_is_recorded_first_and_shown_after(fx: Fixture) -> None:
    """Discord's clicks: the answer does not wait for the announcement's edit; the click is already in
    the store when it is answered, and the edit follows."""
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        edits = len(fx.chat.log)
        assert (await engine.act(BOB, op_id, "ok", show_later=True)).text == "OK counted"
        assert len(fx.chat.log) == edits  # answered before the edit
        saved = read_model(fx.store, f"bot/ops/{op_id}.json", Operation)
        assert saved is not None and saved[0].affected["bob"].vote == Vote.OK
        assert any(e["event"] == "ok" for e in journal.read(fx.store, f"bot/journal/{op_id}"))
        await until(lambda: len(fx.chat.log) > edits)
        assert "@bob: 2 jobs, OK" in fx.chat.text(engine.ops[op_id].message_id)


async def test_lazy_consent_when_the_window_passes_without_objection(driven: Fixture) -> None:
    async with running(driven) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(ALICE, op_id, "confirm")
        await later(engine, DRIVEN.consent_s - 1)
        assert engine.ops[op_id].state == State.AWAITING  # bob has not answered, window open
        await later(engine, 1)
        assert engine.ops[op_id].state == State.GRACE
        await later(engine, DRIVEN.grace_s - 1)
        assert engine.ops[op_id].state == State.GRACE and driven.runs == []
        await later(engine, 1)
        await until(lambda: engine.ops[op_id].state == State.DONE)
        assert driven.runs == [op_id]


async def test_an_objection_blocks_until_withdrawn(driven: Fixture) -> None:
    async with running(driven) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(ALICE, op_id, "confirm")
        await engine.act(BOB, op_id, "object")
        await later(engine, DRIVEN.consent_s + 3600)  # the window passes: an objection still blocks
        assert engine.ops[op_id].state == State.AWAITING
        assert "objection by bob" in driven.chat.text(engine.ops[op_id].message_id)
        assert "@bob: 2 jobs, objects" in driven.chat.text(engine.ops[op_id].message_id)
        assert (await engine.act(BOB, op_id, "ok")).text == "objection withdrawn: OK counted"
        assert engine.ops[op_id].state == State.GRACE
        await later(engine, DRIVEN.grace_s)
        await until(lambda: engine.ops[op_id].state == State.DONE)


async def test_a_delay_holds_the_restart_for_a_checkpoint(driven: Fixture) -> None:
    async with running(driven) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(BOB, op_id, "delay", "10")
        await engine.act(ALICE, op_id, "confirm")
        await later(engine, 10 * 60 - 1)
        assert engine.ops[op_id].state == State.AWAITING
        assert "delayed until" in driven.chat.text(engine.ops[op_id].message_id)
        assert "@bob: 2 jobs, delayed 10 min" in driven.chat.text(engine.ops[op_id].message_id)
        await later(engine, 1)
        assert engine.ops[op_id].state == State.GRACE


async def test_admin_override_passes_an_objection(fx: Fixture) -> None:
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(BOB, op_id, "object")
        refused = await engine.act(ALICE, op_id, "override")
        assert not refused.ok and "admin" in refused.text
        await engine.act(ADMIN, op_id, "override")
        await engine.act(ALICE, op_id, "confirm")
        await until(lambda: engine.ops[op_id].state == State.DONE)


async def test_wrong_people_are_refused_politely_and_nothing_changes(fx: Fixture) -> None:
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        before = engine.ops[op_id]
        for user, action in ((BOB, "confirm"), (MALLORY, "ok"), (MALLORY, "object"), (MALLORY, "cancel"),
                             (CAROL, "delay"), (BOB, "override")):  # fmt: skip
            r = await engine.act(user, op_id, action, "10")
            assert not r.ok and r.ephemeral, (user, action)
        assert engine.ops[op_id] == before


async def test_cancel_during_grace(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [job("alice")], FAST.model_copy(update={"grace_s": 30}))
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(ALICE, op_id, "confirm")  # only her own job: her confirmation suffices
        await until(lambda: engine.ops[op_id].state == State.GRACE)
        assert [b.action for b in fx.chat.posts[engine.ops[op_id].message_id].buttons] == ["cancel"]
        assert not (await engine.act(BOB, op_id, "cancel")).ok
        await engine.act(ALICE, op_id, "cancel")
        assert engine.ops[op_id].state == State.CANCELLED
        assert fx.runs == [] and current_lock(fx.store, "local") is None


async def test_second_request_is_told_who_holds_the_cluster(fx: Fixture) -> None:
    async with running(fx) as engine:
        first, second = await asyncio.gather(engine.request(ALICE, "restart", "local"),
                                             engine.request(BOB, "restart", "local"))  # fmt: skip
        assert sorted([first.ok, second.ok]) == [False, True]
        loser = second if first.ok else first
        assert "local is busy: restart" in loser.text and " since " in loser.text  # as anyone later
        assert "wait for it to finish" not in loser.text
        assert len(engine.ops) == 1


async def test_unconfirmed_requests_expire_and_free_the_cluster(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], DRIVEN, ManualClock())
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await later(engine, DRIVEN.confirm_s - 1)
        assert engine.ops[op_id].state == State.AWAITING
        await later(engine, 1)
        assert engine.ops[op_id].state == State.EXPIRED
        assert current_lock(fx.store, "local") is None and fx.runs == []
        ping = fx.chat.new_posts()[-1]  # a new message: edits notify nobody
        assert ping.mentions == ["alice"] and "expired" in ping.text and "nothing was done" in ping.text


async def test_unconfirmed_requests_expire_on_the_real_clock(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST.model_copy(update={"confirm_s": 0.5}))
    async with running(fx) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await until(lambda: engine.ops[op_id].state == State.EXPIRED)
        assert current_lock(fx.store, "local") is None and fx.runs == []


async def test_bad_input_and_protection(fx: Fixture) -> None:
    engine = fx.engine()
    r = await engine.request(ALICE, "restart", "us-central3")
    assert not r.ok and "us-central2" in r.text
    r = await engine.request(ALICE, "restart", "big-run")
    assert not r.ok and "protected" in r.text
    r = await engine.request(ALICE, "restart", "big-run", {"override": True})
    assert not r.ok and "admins" in r.text
    assert not engine.ops and current_lock(fx.store, "big-run") is None


async def test_a_bot_killed_mid_consent_resumes_and_extends_the_window(driven: Fixture) -> None:
    engine = driven.engine()
    await engine.start()
    await engine.request(ALICE, "restart", "local")
    op_id = next(iter(engine.ops))
    deadline = engine.ops[op_id].consent_deadline
    await engine.tick()  # the bot notes it is alive
    await engine.close()  # the bot dies (its lease stops being renewed)
    driven.clock.advance(600)  # down for 10 minutes

    fresh = driven.engine()  # a new process: everything comes from the store
    await fresh.start()
    try:
        op = fresh.ops[op_id]
        # It was alive up to one liveness interval after its last note: down at least 600 - 30 s.
        assert op.state == State.AWAITING and op.downtime_s == 600 - engine.alive_s
        assert op.consent_deadline == deadline + timedelta(seconds=600 - engine.alive_s)
        await fresh.act(BOB, op_id, "ok")  # buttons keep working: the op id is all they carry
        await fresh.act(ALICE, op_id, "confirm")
        await later(fresh, DRIVEN.grace_s)
        await until(lambda: fresh.ops[op_id].state == State.DONE)
        assert driven.runs == [op_id]
    finally:
        await fresh.close()


async def test_a_bot_back_within_its_liveness_interval_extends_nothing(driven: Fixture) -> None:
    engine = driven.engine()
    await engine.start()
    await engine.request(ALICE, "restart", "local")
    op_id = next(iter(engine.ops))
    deadline = engine.ops[op_id].consent_deadline
    await engine.tick()
    await engine.close()
    driven.clock.advance(engine.alive_s - 1)
    fresh = driven.engine()
    await fresh.start()
    try:
        assert fresh.ops[op_id].downtime_s == 0 and fresh.ops[op_id].consent_deadline == deadline
    finally:
        await fresh.close()


@pytest.mark.parametrize(
    ("votes", "unreachable", "overridden", "past_window", "expected"),
    [
        ({}, 0, False, False, True),
        ({"bob": Vote.OK}, 0, False, False, True),
        ({"bob": Vote.DELAY}, 0, False, False, True),
        ({"bob": Vote.PENDING}, 0, False, False, False),
        ({"bob": Vote.PENDING}, 0, False, True, True),
        ({"bob": Vote.OK}, 2, False, False, False),  # unknown owners: only the window passes them
        ({"bob": Vote.OK}, 2, False, True, True),
        ({"bob": Vote.OBJECT}, 0, False, True, False),
        ({"bob": Vote.OBJECT}, 0, True, False, True),
        ({}, 1, True, False, True),
    ],
)
def test_consent_rules(
    votes: dict, unreachable: int, overridden: bool, past_window: bool, expected: bool
) -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    op = Operation(
        op_id="x", kind="restart", cluster="local", requester=ALICE, created_at=now,
        affected={k: Affected(chat_id=k, owners=[k], jobs=1, vote=v) for k, v in votes.items()},
        unreachable_jobs=unreachable, overridden_by="root" if overridden else None,
        consent_deadline=now - timedelta(seconds=1) if past_window else now + timedelta(minutes=5),
    )  # fmt: skip
    assert rules.consent(op, now)[0] is expected


def test_delays_are_bounded() -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    w = Windows(max_delay_s=40 * 60)
    op = Operation(op_id="x", kind="restart", cluster="local", requester=ALICE, created_at=now,
                   affected={"bob": Affected(chat_id="bob", owners=["bob"], jobs=1)})  # fmt: skip
    op, text = rules.apply(op, BOB, "delay", "30", now, w)
    assert op.not_before == now + timedelta(minutes=30) and op.affected["bob"].vote == Vote.DELAY
    assert not rules.consent(op, now)[0]
    again, text = rules.apply(op, BOB, "delay", "30", now, w)
    assert again == op and "10 min left" in text
    op, _ = rules.apply(op, BOB, "delay", "10", now, w)
    assert op.not_before == now + timedelta(minutes=40)
    assert rules.consent(op, now + timedelta(minutes=41))[0]


async def test_an_announcement_that_cannot_be_posted_leaves_nothing_behind(fx: Fixture) -> None:
    async def broken(message):  # noqa: ANN001, ANN202 - Discord down, say
        raise ConnectionError("chat unreachable")

    fx.chat.post = broken
    engine = fx.engine()
    r = await engine.request(ALICE, "restart", "local")
    assert not r.ok and "nothing was done" in r.text
    assert current_lock(fx.store, "local") is None
    assert [o.state for o in engine.ops.values()] == [State.FAILED]


async def test_what_the_look_could_not_see_is_on_the_announcement(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST)
    spec = fx.spec()
    spec.look = lambda *a: Look([], ["the head does not answer: no job can be listed or backed up"])
    engine = Engine(Context(fx.store, fx.registry), fx.config, fx.chat, {"restart": spec})
    await engine.request(ALICE, "restart", "local")
    text = fx.chat.new_posts()[0].text
    assert "0 running or pending job(s)" in text and "note: the head does not answer" in text
    await engine.cancel(ALICE)
    assert current_lock(fx.store, "local") is None


async def test_rights_per_command_and_per_cluster(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST)
    fx.config.rights = Rights(admin_roles=["infra-admin"], commands={"restart": ["researcher"]},
                              clusters={"us-east5": ["v6e-team"]})  # fmt: skip
    engine = fx.engine()
    r = await engine.request(MALLORY, "restart", "local")
    assert not r.ok and "researcher" in r.text
    researcher = User(id="rita", name="rita", roles=["researcher"])
    r = await engine.request(researcher, "restart", "us-east5")
    assert not r.ok and "v6e-team" in r.text
    assert not engine.ops
    r = await engine.request(researcher, "restart", "local")
    assert r.ok, r.text
    await engine.cancel(researcher)
    r = await engine.request(ADMIN, "restart", "local")  # admins may do everything
    assert r.ok, r.text
    await engine.cancel(ADMIN)


async def test_a_restart_started_from_the_cli_shows_as_holding_the_cluster(fx: Fixture) -> None:
    from ops.restart import Settings, start_restart

    ctx = Context(fx.store, fx.registry)
    run = start_restart(ctx, fx.registry.get("local"), "dave", True, Settings(lease_s=30))
    try:
        engine = fx.engine()
        r = await engine.request(ALICE, "restart", "local")
        assert not r.ok
        assert f"local is busy: restart {run.record.op_id} by dave since" in r.text
        assert not engine.ops
    finally:
        run.lease.release()


async def test_the_bot_notes_it_is_alive_once_per_interval_not_every_tick(driven: Fixture) -> None:
    from bot.protocol.engine import ALIVE_KEY, _Alive
    from ops.store import read_model

    engine = driven.engine()
    start = driven.clock()
    await engine.tick()
    for _ in range(5):  # ticks within the interval write nothing (GCS: one write per second per object)
        await later(engine, (engine.alive_s - 1) / 5)
    assert read_model(driven.store, ALIVE_KEY, _Alive)[0].at == start
    await later(engine, 1)
    assert read_model(driven.store, ALIVE_KEY, _Alive)[0].at == start + timedelta(seconds=engine.alive_s)


async def test_a_failed_liveness_write_does_not_hold_up_the_deadlines(tmp_path: Path) -> None:
    class Flaky(LocalStore):  # the real store, failing on the liveness object (a 429 from GCS, say)
        def put(self, key: str, data: bytes) -> str:
            if key.endswith("alive.json"):
                raise ConnectionError("429 rate limited")
            return super().put(key, data)

    fx = Fixture(tmp_path, [], DRIVEN, ManualClock())
    fx.store = Flaky(tmp_path / "store")
    engine = fx.engine()
    await engine.request(ALICE, "restart", "local")
    op_id = next(iter(engine.ops))
    await later(engine, DRIVEN.confirm_s)
    assert engine.ops[op_id].state == State.EXPIRED


async def test_a_burst_of_progress_lands_at_most_once_a_second_and_all_of_it(tmp_path: Path) -> None:
    import time

    writes: list[float] = []

    class Counting(LocalStore):  # the real store, noting when the operation's record is written
        def replace(self, key: str, data: bytes, version: str) -> str:
            if key.startswith("bot/ops/"):
                writes.append(time.monotonic())
            return super().replace(key, data, version)

    fx = Fixture(tmp_path, [job("alice")], FAST.model_copy(update={"grace_s": 0}))
    fx.store = Counting(tmp_path / "store")
    spec = fx.spec()

    def execute(engine, op, lease, progress):  # noqa: ANN001, ANN202 - resubmitting: ~20 lines a second
        progress(f"backed up 1 job(s) to {engine.store.url}")
        for i in range(60):
            progress(f"resubmitted job {i}")
            time.sleep(0.04)
        lease.release()
        return Outcome("all went well", owners=[])

    spec.execute = execute
    engine = Engine(Context(fx.store, fx.registry), fx.config, fx.chat, {"restart": spec})
    await engine.start()
    try:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        writes.clear()
        await engine.act(ALICE, op_id, "confirm")
        await until(lambda: len(fx.chat.new_posts()) == 2)
    finally:
        await engine.close()
    edits = [i for i, (kind, mid, _) in enumerate(fx.chat.log) if kind == "edit"]
    gaps = [b - a for a, b in zip(writes[2:], writes[3:], strict=False)]  # after grace and executing
    assert len(writes) <= 8 and all(g >= 0.95 for g in gaps), gaps
    assert len(edits) <= 8
    op = engine.ops[op_id]
    assert op.state == State.DONE and op.progress[-1] == "resubmitted job 59" and len(op.progress) == 61
    assert op.progress[0] == "backed up 1 job(s) to the store"
    assert edits[-1] < len(fx.chat.log) - 1 and fx.chat.log[-1][0] == "post"  # the report comes last
    assert "resubmitted job 59" in fx.chat.text(op.message_id)
    assert str(tmp_path) not in "".join(m.text for _, _, m in fx.chat.log)


async def test_the_requester_hears_when_someone_else_ends_their_request(driven: Fixture) -> None:
    async with running(driven) as engine:
        await engine.request(ALICE, "restart", "local")
        await engine.cancel(ALICE)  # her own cancel: nobody to tell
        assert len(driven.chat.new_posts()) == 1

        await engine.request(ALICE, "restart", "local")
        op_id = list(engine.ops)[-1]
        await engine.act(ADMIN, op_id, "cancel")
        ping = driven.chat.new_posts()[-1]
        assert ping.mentions == ["alice"] and "was cancelled by root" in ping.text

        await engine.request(ALICE, "restart", "local")
        await engine.unlock(ADMIN, "local")
        ping = driven.chat.new_posts()[-1]
        assert ping.mentions == ["alice"] and "root force-unlocked local" in ping.text


async def test_an_unlock_from_the_cli_ends_the_request_and_tells_the_requester(driven: Fixture) -> None:
    from ops.locks import unlock

    engine = driven.engine()
    await engine.request(ALICE, "restart", "local")
    op_id = next(iter(engine.ops))
    unlock(driven.store, "local", op_id, "carol")  # `python -m ops unlock --cluster local --op ... --yes`
    with contextlib.suppress(Exception):
        engine._leases[op_id].renew()  # the lease's next beat finds the lock gone

    await engine.tick()

    assert engine.ops[op_id].state == State.CANCELLED
    ping = driven.chat.new_posts()[-1]
    assert ping.mentions == ["alice"] and "its lock was cleared" in ping.text
    assert current_lock(driven.store, "local") is None
    await engine.close()


async def test_bob_asks_not_to_resubmit_then_changes_his_mind(driven: Fixture) -> None:
    async with running(driven) as engine:
        await engine.request(ALICE, "restart", "local")
        op_id = next(iter(engine.ops))
        await engine.act(BOB, op_id, "skip")
        op = engine.ops[op_id]
        assert op.skip_resubmit == {"raysubmit_bob_0": "bob", "raysubmit_bob_1": "bob"}
        assert rules.consent(op, driven.clock())[0]  # it counts as his OK
        assert "NOT resubmitted, on their owners' word: raysubmit_bob_0 (bob)" in driven.chat.text(
            op.message_id
        )
        await engine.act(BOB, op_id, "ok")
        assert engine.ops[op_id].skip_resubmit == {}
        assert not (await engine.act(CAROL, op_id, "skip")).ok  # not her jobs


async def test_force_unbacked_is_for_admins(fx: Fixture) -> None:
    engine = fx.engine()
    r = await engine.request(ALICE, "restart", "local", {"force_unbacked": True})
    assert not r.ok and "for admins" in r.text and not engine.ops


async def test_dave_links_his_ray_name_and_is_asked_about_his_jobs(tmp_path: Path) -> None:
    dave = User(id="4004", name="dave")
    fx = Fixture(tmp_path, [job("dave-ray")], DRIVEN, ManualClock())
    engine = fx.engine()
    assert (
        await engine.link(dave, "dave-ray")
    ).text == "linked: you are asked about the Ray jobs of dave-ray"
    r = await engine.link(MALLORY, "dave-ray")  # a name is not anyone's to take
    assert not r.ok and "linked to @4004" in r.text
    assert not (await engine.unlink(MALLORY, "dave-ray")).ok

    fresh = fx.engine()  # persisted in the store: a restarted bot knows it
    await fresh.request(ALICE, "restart", "local")
    announcement = fx.chat.new_posts()[0]
    assert announcement.mentions == ["4004"] and "@4004: 1 job, not answered yet" in announcement.text
    await fresh.cancel(ALICE)

    assert "no longer linked" in (await fresh.unlink(ADMIN, "dave-ray")).text
    assert fresh.owner_to_chat("dave-ray") is None
    assert (await fresh.link(MALLORY, "dave-ray")).ok


def test_rights_come_from_ids_not_names(fx: Fixture) -> None:
    fx.config.rights = Rights(admins=["42"], admin_roles=["9001"])
    engine = fx.engine()
    assert engine.is_admin(User(id="42", name="whoever"))
    assert not engine.is_admin(User(id="7", name="42"))  # a display name anyone can choose
    assert engine.is_admin(User(id="8", name="x", roles=["9001"]))


# -- operations are plug-ins: declared here only, the engine, the rules and the adapters unchanged -------


class Say(Params):
    text: str = Field(description="What to say in #infra")
    loud: Annotated[bool, AdminOnly("loud (mention everyone)")] = False


def say_spec(said: list[str], fail: bool = False) -> Spec:
    """An announce-only operation on no cluster with a parameter (build-image's shape)."""

    def look(engine, cluster, user, params):  # noqa: ANN001, ANN202
        assert cluster is None and isinstance(params, Say)
        return Look([], [])

    def execute(engine, op, lease, progress):  # noqa: ANN001, ANN202
        assert lease is None  # no cluster: nothing to lock
        progress("clearing my throat")
        if fail:
            raise Refused("lost my voice")
        said.append(op.params["text"])
        return Outcome(f"said {op.params['text']!r}", owners=[])

    return Spec("say", "announce", look, execute, params=Say, needs_cluster=False, summary="Say something")


class Drain(ClusterParams):
    minutes: int = Field(5, ge=1, le=60, description="How long to drain")


def drain_spec(fx: Fixture, fail: bool = False) -> Spec:
    """A full-ceremony operation on a cluster, with its own parameter and texts; its `execute` leaves the
    lock to the engine."""

    def execute(engine, op, lease, progress):  # noqa: ANN001, ANN202
        assert lease is not None and lease.record.phase == "executing"
        fx.runs.append(op.op_id)
        if fail:
            raise Refused("the drain got stuck")
        return Outcome(f"drained for {op.params['minutes']} min", owners=[j.owner for j in fx.jobs])

    texts = Texts(
        title=lambda op: f"drain {op.cluster} for {op.params['minutes']} min",
        lines=lambda op: ["jobs keep running; no new ones start"],
        owners=lambda mentions: f"your jobs waited: {mentions}",
    )
    look = lambda engine, cluster, user, params: Look(list(fx.jobs), [])  # noqa: E731
    return Spec("drain", "full", look, execute, params=Drain, lease_s=30, texts=texts)


async def test_an_announce_only_operation_on_no_cluster_goes_from_request_to_report(tmp_path: Path) -> None:
    said: list[str] = []
    fx = Fixture(tmp_path, [], FAST)
    engine = fx.engine({"say": say_spec(said)})
    r = await engine.request(ALICE, "say", None, {"text": "hello"})
    assert r.ok and r.text.startswith("say announced in #infra (https://chat.test/infra/1) and started"), (
        r.text
    )
    await until(lambda: len(fx.chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    assert op.state == State.DONE and said == ["hello"] and op.cluster is None
    assert op.op_id.startswith("say-") and op.params == {"text": "hello", "loud": False}
    announcement, report = fx.chat.new_posts()
    assert announcement.text.startswith("**alice** asks to **say** (") and "job(s)" not in announcement.text
    assert announcement.buttons == [] and announcement.mentions == []  # nobody to ask: announced only
    assert report.text == f"say is done (`{op.op_id}`), asked by alice\nsaid 'hello'"
    assert "clearing my throat" in fx.chat.text(op.message_id)
    assert fx.store.list("locks/") == []  # no cluster, no lock
    assert [e["event"] for e in journal.read(fx.store, f"bot/journal/{op.op_id}")] == ["announced", "done"]


async def test_an_announce_only_operation_that_fails_says_so_without_a_resume_command(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST)
    engine = fx.engine({"say": say_spec([], fail=True)})
    assert (await engine.request(ALICE, "say", None, {"text": "hello"})).ok
    await until(lambda: len(fx.chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    report = fx.chat.new_posts()[-1]
    assert op.state == State.FAILED and op.error == "lost my voice"
    assert report.text == f"say FAILED (`{op.op_id}`), asked by @alice: lost my voice\nit held no lock"
    assert report.mentions == ["alice"] and "--resume" not in report.text


async def test_an_operations_parameters_are_checked_against_its_model(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST)
    engine = fx.engine({"say": say_spec([])})
    r = await engine.request(ALICE, "say", "local", {"text": "hi"})
    assert not r.ok and r.text == "/say takes no cluster (it was given 'local')"
    r = await engine.request(ALICE, "say", None, {})
    assert not r.ok and r.text == "bad parameters for /say: text: Field required (parameters: text, loud)"
    r = await engine.request(ALICE, "say", None, {"text": "hi", "lodu": True})  # a typo is not a default
    assert not r.ok and "lodu: Extra inputs are not permitted" in r.text
    r = await engine.request(ALICE, "say", None, {"text": "hi", "loud": True})  # declared admin-only
    assert not r.ok and r.text == "loud (mention everyone) is for admins"
    assert not engine.ops and fx.chat.log == []
    assert (await engine.request(ADMIN, "say", None, {"text": "hi", "loud": True})).ok


async def test_a_full_ceremony_operation_declared_in_a_test_runs_on_a_cluster(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [job("alice"), job("bob")], FAST)
    async with running(fx) as engine:
        engine.specs = {"drain": drain_spec(fx)}
        r = await engine.request(ALICE, "drain", "local", {"minutes": "7"})  # chat words: validated to int
        assert r.ok, r.text
        (op_id,) = engine.ops
        assert op_id.startswith("local-") and engine.ops[op_id].params == {"override": False, "minutes": 7}
        lock = current_lock(fx.store, "local")
        assert lock.kind == "drain" and lock.lease_s == 30 and lock.phase == "announced"
        announcement = fx.chat.new_posts()[0]
        assert "asks to **drain local for 7 min**" in announcement.text and announcement.mentions == ["bob"]
        assert "jobs keep running; no new ones start" in announcement.text
        assert "skip" not in [b.action for b in announcement.buttons]  # it offers no "leave mine out"
        refused = await engine.act(BOB, op_id, "skip")
        assert not refused.ok and "has no such answer" in refused.text
        await engine.act(BOB, op_id, "ok")
        await engine.act(ALICE, op_id, "confirm")
        await until(lambda: len(fx.chat.new_posts()) == 2)
        report = fx.chat.new_posts()[-1]
        assert engine.ops[op_id].state == State.DONE and fx.runs == [op_id]
        assert report.text.startswith(f"drain local for 7 min is done (`{op_id}`), asked by alice\n")
        assert "drained for 7 min" in report.text and report.text.endswith("your jobs waited: @alice @bob")
        assert current_lock(fx.store, "local") is None  # the engine let go of it after execute

        r = await engine.request(ALICE, "drain", None, {})
        assert not r.ok and r.text.startswith("/drain needs a cluster; valid: ")
        r = await engine.request(ALICE, "drain", "local", {"minutes": 0})
        assert not r.ok and "minutes: Input should be greater than or equal to 1" in r.text
        r = await engine.request(ALICE, "drain", "big-run", {})  # the protocol's protection, for every kind
        assert not r.ok and "protected" in r.text


async def test_a_failed_operation_that_does_not_own_its_lock_gives_the_cluster_back(tmp_path: Path) -> None:
    fx = Fixture(tmp_path, [], FAST)
    async with running(fx) as engine:
        engine.specs = {"drain": drain_spec(fx, fail=True)}
        await engine.request(ALICE, "drain", "local", {})
        (op_id,) = engine.ops
        await engine.act(ALICE, op_id, "confirm")
        await until(lambda: len(fx.chat.new_posts()) == 2)
    report = fx.chat.new_posts()[-1]
    assert report.text.endswith("the drain got stuck\nlocal is not locked by it any more"), report.text
    assert "--resume" not in report.text and current_lock(fx.store, "local") is None


def test_an_operations_slash_command_comes_from_its_spec(fx: Fixture) -> None:
    from bot.adapters.cogs.operations import Operations, operation_command

    say = operation_command(say_spec([]))
    assert say.name == "say" and say.description == "Say something"
    assert [(p.name, p.required) for p in say.parameters] == [("text", True), ("loud", False)]
    assert say.parameters[1].default is False
    assert say.parameters[0].description == "What to say in #infra"
    drain = operation_command(drain_spec(fx))
    assert [p.name for p in drain.parameters] == ["cluster", "minutes", "override"]  # admin-only last
    assert drain.parameters[0].autocomplete and drain.parameters[1].type.name == "integer"
    restart = Operations.restart  # declared in one line from the registered restart
    assert [p.name for p in restart.parameters] == ["cluster", "preserve_jobs", "override", "force_unbacked"]
    assert restart.description == "Restart a cluster: announced in #infra, with consent"


async def test_a_restarted_bot_takes_each_operation_back_under_its_own_lease(driven: Fixture) -> None:
    engine = driven.engine({"drain": drain_spec(driven)})
    await engine.request(ALICE, "drain", "local", {})
    (op_id,) = engine.ops
    await engine.close()

    fresh = driven.engine({"drain": drain_spec(driven)})
    await fresh.start()
    try:
        assert fresh.ops[op_id].state == State.AWAITING
        assert current_lock(driven.store, "local").lease_s == 30  # drain's, not another kind's
    finally:
        await fresh.close()

    gone = driven.engine({"say": say_spec([])})  # a bot that runs no drain any more
    await gone.start()
    try:
        assert gone.ops[op_id].state == State.FAILED and "runs no 'drain'" in gone.ops[op_id].error
        assert current_lock(driven.store, "local") is None  # nothing is left holding the cluster
    finally:
        await gone.close()
