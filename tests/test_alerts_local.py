"""The health alerts on the real local cluster, its autoscaler and its TPU simulator, with the real
engine (the recorder chat) on an injected clock: demand for a v4-8 while the zone is stocked out keeps
the autoscaler's launches failing, and `stuck` is told in one message once the threshold passed; lift
the stock-out and it resolves. A preempted VM that holds quota while launches fail is stuck at once,
and the alert's Clean button deletes it through /clean-preempted."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from bot.adapters.recorder import ManualClock, Recorder
from bot.alerts.model import AlertSettings, target_of
from bot.alerts.monitor import Monitor
from bot.config import BotConfig, Rights, Windows
from bot.operations import registered
from bot.protocol.engine import Engine
from bot.protocol.model import User
from ops.context import Context
from ops.health import Health, Verdict
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.sim.control import SimControl
from ops.workers import Settings as WorkerSettings
from tests.localray import wait_for
from tests.test_health import autoscaled, ctx, fresh_history, stock_out, tpu_workers  # noqa: F401 - the same fixtures

FAIL_TIMEOUT_S = 120
JOIN_TIMEOUT_S = 180
BOB = User(id="bob", name="bob")


def monitor_for(context: Context, chat: Recorder, clock: ManualClock) -> Monitor:
    alerts = AlertSettings(clusters=["local"])
    config = BotConfig(rights=Rights(), windows=Windows(tick_s=0.05), alerts=alerts)
    specs = registered(worker_settings=WorkerSettings(timeout_s=30, lease_s=30))
    return Monitor(Engine(context, config, chat, specs, clock=clock))


def demand(cluster: Cluster) -> str:
    """A job that needs a v4-8's host 0: the autoscaler must launch one."""
    return RayApi(cluster).submit(entrypoint="true", submission_id=f"health-test-{time.time_ns()}",
                                  entrypoint_resources={"TPU-v4-8-head": 1})  # fmt: skip


async def until(predicate, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the chat"
        await asyncio.sleep(0.1)


def alert_posts(chat: Recorder, problem: str) -> list[str]:
    return [mid for kind, mid, m in chat.log if kind == "post" and f"local is {problem}" in m.text]


@pytest.mark.timeout(600)
async def test_stuck_on_a_stock_out_is_told_once_resolves_and_a_preempted_vm_is_cleaned_from_its_button(
    fresh_history: None,  # noqa: F811 - first: ctx then reaches the new head's simulator
    ctx: Context,  # noqa: F811
    cluster: Cluster,
    stock_out: SimControl,  # noqa: F811
) -> None:
    chat, clock = Recorder(), ManualClock(datetime.now(UTC))
    monitor = monitor_for(ctx, chat, clock)
    await monitor.engine.start()
    await monitor.start(schedule=False)
    sid = demand(cluster)
    checks = 0

    async def check() -> Health:
        nonlocal checks
        checks += 1
        [h] = await monitor.check()
        return h

    # Real time until the autoscaler has failed; the clock stays: nothing has lasted yet.
    deadline = time.monotonic() + FAIL_TIMEOUT_S
    while not (h := await check()).snapshot.failed_launches:
        assert time.monotonic() < deadline, "the autoscaler's launches did not fail on the stock-out"
        await asyncio.sleep(1)
    assert h.verdict != Verdict.STUCK and alert_posts(chat, "stuck") == []

    for _ in range(7):  # 5-minute checks: stuck once short for 30 minutes, told at once (no 3 more)
        clock.advance(300)
        h = await check()
    assert h.verdict == Verdict.STUCK, h.evidence
    [mid] = alert_posts(chat, "stuck")
    assert "head only since" in chat.text(mid) and "launches failing" in chat.text(mid)
    assert [b.action for b in chat.posts[mid].buttons] == ["restart", "silence", "silence", "silence"]
    clock.advance(300)
    await check()
    assert alert_posts(chat, "stuck") == [mid]  # one message, edited as it evolves

    stock_out.clear_faults()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while (h := await check()).verdict != Verdict.HEALTHY:
        assert time.monotonic() < deadline, f"not healthy after the stock-out lifted: {h.evidence}"
        await asyncio.sleep(2)
    assert chat.text(mid).startswith("✅ resolved: local was stuck for")
    assert any(m.text.startswith("✅ resolved: local was stuck") for m in chat.new_posts()[1:])
    await asyncio.to_thread(wait_for, lambda: RayApi(cluster).status(sid) == "SUCCEEDED", JOIN_TIMEOUT_S,
                            "the job on its v4-8")  # fmt: skip

    # A preempted VM holding quota while launches fail: stuck at once, with the Clean button.
    stock_out.add_fault("stock_out", zone=cluster.zone, times=None)
    (vm,) = autoscaled(ctx, cluster)
    stock_out.preempt(vm.name)
    await asyncio.to_thread(wait_for, lambda: not tpu_workers(cluster), JOIN_TIMEOUT_S,
                            "Ray to see the preempted v4-8 gone")  # fmt: skip
    demand(cluster)
    deadline = time.monotonic() + FAIL_TIMEOUT_S
    while not (h := await check()).snapshot.failed_launches or not h.snapshot.preempted:
        assert time.monotonic() < deadline, f"no failed launch beside the preempted VM: {h.evidence}"
        await asyncio.sleep(1)
    for _ in range(3):
        clock.advance(300)
        h = await check()
    assert h.verdict == Verdict.STUCK, h.evidence
    [alert] = [a for a in monitor.book.firing.values() if a.problem == "stuck"]
    assert alert.preempted == 1 and "clean" in [b.action for b in chat.posts[alert.message_id].buttons]

    r = await monitor.engine.act(BOB, target_of(alert), "clean")
    assert r.ok and "clean-preempted" in r.text, r.text
    await asyncio.to_thread(wait_for, lambda: not [n for n in autoscaled(ctx, cluster) if n.name == vm.name],
                            60, "the preempted VM to go")  # fmt: skip
    await until(lambda: any(vm.node_id in m.text and "deleted" in m.text for m in chat.new_posts()))
    await monitor.close()
    await monitor.engine.close()
