"""The real restart through the engine, on the session's local Ray cluster, with the recorder as chat.

Stories: a head that does not answer refuses the request (an admin may force it, and the announcement
says the jobs are not backed up); bob asks not to resubmit his job, and the report says so; the lock
tells what the operation does (waiting for consent, then executing).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import psutil

from bot.adapters.recorder import ManualClock, Recorder
from bot.config import BotConfig, Rights, Windows
from bot.operations import registered
from bot.protocol.engine import Engine
from bot.protocol.model import State, User
from ops.context import Context
from ops.jobs import active_jobs
from ops.locks import LockRecord, current_lock
from ops.ray_api import RayApi
from ops.registry import Cluster, load_registry
from ops.restart import Settings
from ops.store import open_store, read_model
from tests.localray import Env, dashboard_process, wait_for

ALICE = User(id="1001", name="alice")
BOB = User(id="1002", name="bob")
ADMIN = User(id="1003", name="root", roles=["infra-admin"])
WINDOWS = Windows(tick_s=0.05)


def make_engine(ops_env: Env, clock: ManualClock | None = None, reach_deadline_s: float = 10) -> Engine:
    config = BotConfig(rights=Rights(admin_roles=["infra-admin"]), windows=WINDOWS,
                       owners={"alice": ALICE.id, "bob": BOB.id})  # fmt: skip
    settings = Settings(lease_s=3, reach_deadline_s=reach_deadline_s)
    ctx = Context(open_store(), load_registry(ops_env.registry))
    return Engine(ctx, config, Recorder(), registered(settings), **({"clock": clock} if clock else {}))


async def until(predicate, timeout: float) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await asyncio.sleep(0.05)


async def test_a_head_that_does_not_answer_refuses_the_request_unless_an_admin_forces_it(
    ops_env: Env, cluster: Cluster, stalled: psutil.Process
) -> None:
    engine = make_engine(ops_env, reach_deadline_s=1)
    chat: Recorder = engine.chat  # type: ignore[assignment]
    r = await engine.request(ALICE, "restart", "local")
    assert not r.ok and "did not answer" in r.text and "nothing was stopped" in r.text
    assert chat.log == [] and current_lock(engine.store, "local") is None and not engine.ops

    r = await engine.request(BOB, "restart", "local", {"force_unbacked": True})
    assert not r.ok and "for admins" in r.text and chat.log == []

    r = await engine.request(ADMIN, "restart", "local", {"force_unbacked": True})
    assert r.ok, r.text
    text = chat.new_posts()[0].text
    assert "jobs are NOT backed up" in text and "forced" in text
    assert "don't resubmit" not in text.lower()  # nothing is backed up: nothing to leave out
    await engine.cancel(ADMIN)
    assert current_lock(engine.store, "local") is None


async def test_bob_asks_not_to_resubmit_his_job_and_the_report_says_so(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    api = RayApi(cluster)
    alices = api.submit(entrypoint="sleep 900", metadata={"user": "alice"})
    bobs = api.submit(entrypoint="sleep 901", submission_id=f"ray-run-bob-once-{tmp_path.name[-6:]}")
    wait_for(lambda: api.status(alices) == "RUNNING", 60, "alice's job to run")

    clock = ManualClock()
    engine = make_engine(ops_env, clock)
    chat: Recorder = engine.chat  # type: ignore[assignment]
    await engine.start()
    try:
        r = await engine.request(ALICE, "restart", "local")
        assert r.ok, r.text
        (op_id,) = [o.op_id for o in engine.ops.values() if o.open]  # the store is the session's
        lock = current_lock(engine.store, "local")
        assert lock.phase == "announced" and "waiting for consent" in lock.describe()
        assert "Don't resubmit mine" in [b.label for b in chat.new_posts()[0].buttons]

        said = await engine.act(BOB, op_id, "skip")  # his eval job must not run twice
        assert "backed up but not resubmitted" in said.text
        assert f"@{BOB.id}: 1 job, OK, don't resubmit" in chat.text(engine.ops[op_id].message_id)
        await engine.act(ALICE, op_id, "confirm")
        assert engine.ops[op_id].state == State.GRACE  # bob's answer counts as his OK
        clock.advance(WINDOWS.grace_s)
        await engine.tick()
        await until(lambda: engine.ops[op_id].state in (State.DONE, State.FAILED), timeout=240)
        await engine.wait_executing(30)  # its report is posted after its state is saved
    finally:
        await engine.close()
    op = engine.ops[op_id]
    assert op.state == State.DONE, op.error
    report = chat.new_posts()[-1]
    assert f"left out (not resubmitted) on bob's word: {bobs}" in report.text
    assert report.mentions == [ALICE.id]  # only those whose jobs came back hear "resubmitted"
    olds = {(j.metadata or {}).get("clusterbot_resubmitted_from") for j in api.list_jobs()}
    running = {j.submission_id for j in active_jobs(api)}
    assert alices in olds and bobs not in olds and bobs not in running
    last = read_model(engine.store, "locks/local.json", LockRecord)[0]
    assert last.released and last.phase == "executing"


async def test_a_restart_run_from_the_cli_shows_in_infra_until_it_is_done(
    ops_env: Env, cluster: Cluster
) -> None:
    from ops.restart import start_restart

    engine = make_engine(ops_env)
    chat: Recorder = engine.chat  # type: ignore[assignment]
    await engine.start()
    try:
        run = start_restart(engine.ctx, cluster, "dave", True, Settings(lease_s=3))
        result = await asyncio.to_thread(run.run)  # dave's terminal, while the bot ticks
        assert result.step.value == "done"
        await until(lambda: any(m.text.endswith(": done") for m in chat.posts.values()), timeout=30)
    finally:
        await engine.close()
    posts = [(mid, m) for kind, mid, m in chat.log if kind == "post" and run.record.op_id in m.text]
    assert len(posts) == 1, chat.log  # one message per operation, edited as it goes
    mid, first = posts[0]
    assert "by dave, run outside the bot" in first.text
    assert chat.text(mid).endswith(": done")
    assert [kind for kind, m_id, _ in chat.log if m_id == mid][-1] == "edit"

    again = make_engine(ops_env)  # a restarted bot does not post it again
    await again.tick()
    assert again.chat.log == []  # type: ignore[attr-defined]


async def test_a_head_that_stops_answering_before_execution_fails_the_restart_and_frees_the_cluster(
    ops_env: Env, cluster: Cluster
) -> None:
    clock = ManualClock()
    engine = make_engine(ops_env, clock, reach_deadline_s=1)
    chat: Recorder = engine.chat  # type: ignore[assignment]
    await engine.start()
    dashboard = dashboard_process(cluster)
    try:
        r = await engine.request(ALICE, "restart", "local")
        assert r.ok, r.text
        (op_id,) = [o.op_id for o in engine.ops.values() if o.open]
        await engine.act(ALICE, op_id, "confirm")
        dashboard.send_signal(signal.SIGSTOP)  # between the announcement and the execution
        clock.advance(WINDOWS.grace_s)
        await engine.tick()
        await until(lambda: engine.ops[op_id].state in (State.DONE, State.FAILED), timeout=60)
        await engine.wait_executing(30)  # its report is posted after its state is saved
    finally:
        dashboard.send_signal(signal.SIGCONT)
        await engine.close()
    assert engine.ops[op_id].state == State.FAILED
    report = chat.new_posts()[-1]
    assert "did not answer" in report.text and "not locked by it any more" in report.text
    assert report.mentions == [ALICE.id]
    assert current_lock(engine.store, "local") is None
