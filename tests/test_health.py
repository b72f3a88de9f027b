"""Health: the verdict rules on snapshots and an injected clock (pure), then the real thing on the
session's local cluster: its autoscaler launching into a stocked-out simulated zone (stuck once the
threshold passed, not any more when the stock-out lifts), a preempted TPU VM named in the evidence, a
stalled dashboard (unknown, and it delays no other cluster), a wrong token, a head that is not there.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from ops.context import Context
from ops.drivers.local import LocalDriver
from ops.health import KEEP, Point, Snapshot, Verdict, check, check_all, history, history_key, judge, record
from ops.ray_api import RayApi
from ops.registry import Cluster, HealthThresholds, Registry, TokenSource, load_registry
from ops.render import render_health, render_summary
from ops.sim.control import SimControl
from ops.status import count_workers, parse_cluster_status
from ops.store import LocalStore
from tests.localray import Env, wait_for

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
LIMITS = HealthThresholds()  # stuck after 30 min; churn: 3 deaths within 10 min of joining in 60 min
JOIN_TIMEOUT_S = 240.0
FAIL_TIMEOUT_S = 90.0


def snap(**fields: object) -> Snapshot:
    base: dict = dict(cluster="c", at=T0, head_up=True, reach="ok", min_workers=2, max_workers=8)
    return Snapshot(**(base | fields))


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


# -- pure: what Ray says, counted --------------------------------------------------------------------
def test_a_multi_host_slice_is_one_worker_of_its_type_not_a_host_plus_cpu_hosts() -> None:
    nodes = [
        {"node_id": "h", "is_head_node": True, "state": "ALIVE", "resources_total": {"CPU": 2}},
        {"node_id": "a0", "state": "ALIVE", "labels": {"ray.io/tpu-slice-name": "s1"},
         "resources_total": {"CPU": 1, "TPU": 4, "TPU-v4-16-head": 1, "s1": 1}},
        {"node_id": "a1", "state": "ALIVE", "labels": {"ray.io/tpu-slice-name": "s1"},
         "resources_total": {"CPU": 1, "TPU": 4, "s1": 1}},
        {"node_id": "c", "state": "ALIVE", "resources_total": {"CPU": 4}},
        {"node_id": "d0", "state": "DEAD", "resources_total": {"TPU": 4, "TPU-v4-8-head": 1},
         "start_time_ms": ms(T0), "end_time_ms": ms(T0 + timedelta(minutes=3))},
        {"node_id": "d1", "state": "DEAD", "resources_total": {"TPU": 4}},
    ]  # fmt: skip
    got = count_workers(nodes)
    assert got.alive == {"v4-16": 1, "cpu": 1}
    assert [(d.worker_type, d.ended - d.started) for d in got.deaths] == [("v4-8", timedelta(minutes=3))]
    assert {"a0", "s1"} <= set(got.alive_ids)


def test_the_autoscalers_report_gives_launches_failures_and_demand() -> None:
    # The shape the dashboard serves for Ray's v1 autoscaler (camel-cased keys), as recorded locally.
    data = {
        "clusterStatus": {
            "autoscalerReport": {
                "activeNodes": {}, "pendingLaunches": {"tpu-v4-8": 1}, "pendingNodes": [], "failedNodes": [],
                "nodeAvailabilitySummary": {"nodeAvailabilities": {"tpu-v4-8": {
                    "nodeType": "tpu-v4-8", "isAvailable": False, "lastCheckedTimestamp": T0.timestamp(),
                    "unavailableNodeInformation": {"category": "ResourceExhausted",
                                                   "description": "no more capacity in the zone"}}}},
            },
            "loadMetricsReport": {"resourceDemand": [[{"TPU-v4-8-head": 1.0, "CPU": 1.0}, 1]],
                                  "pgDemand": [], "requestDemand": []},
        }
    }  # fmt: skip
    got = parse_cluster_status(data)
    assert got.pending_launches == {"tpu-v4-8": 1}
    assert got.failed_launches == [
        "tpu-v4-8: ResourceExhausted at 03:00:00 UTC: no more capacity in the zone"
    ]
    assert got.demand == ["{'CPU': 1, 'TPU-v4-8-head': 1} * 1"]
    text = "Pending:\n tpu-v4-8, 1 launching\nRecent failures:\n tpu-v4-8: ResourceExhausted\nDemands:\n {'TPU': 4}: 1+ pending tasks/actors\n"  # noqa: E501
    v2 = parse_cluster_status({"autoscalingStatus": text})
    assert (v2.pending_launches, len(v2.failed_launches), len(v2.demand)) == ({"tpu-v4-8": 1}, 1, 1)


# -- pure: the verdicts ---------------------------------------------------------------------------------
def test_head_only_with_failing_launches_is_stuck_only_after_the_threshold() -> None:
    wanting = dict(workers={}, demand=["{'TPU-v4-8-head': 1} * 2"], failed_launches=["tpu-v4-8: stock-out"])
    points = [Point(at=T0 + timedelta(minutes=m), alive=0, verdict=Verdict.DEGRADED, short=True)
              for m in range(0, 30, 5)]  # fmt: skip
    early = judge(snap(at=T0 + timedelta(minutes=25), **wanting), points, LIMITS)
    assert early.verdict == Verdict.DEGRADED and "25 min" in early.evidence[0]
    late = judge(snap(at=T0 + timedelta(minutes=31), **wanting), points, LIMITS)
    assert late.verdict == Verdict.STUCK
    assert "head only since 03:00 UTC (31 min" in late.evidence[0]
    assert any("stock-out" in e for e in late.evidence) and "restart" in late.action
    # A new head started at 03:20: points of the old one say nothing of it.
    fresh = judge(snap(at=T0 + timedelta(minutes=31), head_started=T0 + timedelta(minutes=20), **wanting),
                  points, LIMITS)  # fmt: skip
    assert fresh.verdict == Verdict.DEGRADED
    # A check that was not short breaks the run; so does a gap longer than the threshold.
    broken = [
        *points[:3],
        Point(at=T0 + timedelta(minutes=15), alive=2, verdict=Verdict.HEALTHY),
        *points[4:],
    ]
    assert judge(snap(at=T0 + timedelta(minutes=31), **wanting), broken, LIMITS).verdict == Verdict.DEGRADED
    # A check 40 min ago and none since: Ray's node times bridge the gap when no worker died inside it.
    gap = [Point(at=T0 - timedelta(minutes=40), alive=0, verdict=Verdict.DEGRADED, short=True)]
    assert judge(snap(at=T0, **wanting), gap, LIMITS).verdict == Verdict.STUCK
    died = count_workers([{"node_id": "w", "state": "DEAD", "resources_total": {"TPU-v4-8-head": 1},
                           "start_time_ms": ms(T0 - timedelta(minutes=30)),
                           "end_time_ms": ms(T0 - timedelta(minutes=20))}]).deaths  # fmt: skip
    assert judge(snap(at=T0, deaths=died, **wanting), gap, LIMITS).verdict == Verdict.DEGRADED


def test_a_ray_read_that_failed_is_unknown_never_stuck_healthy_or_a_gap_in_a_stuck_run() -> None:
    """The dashboard answered but its state API or the autoscaler's report did not: without a worker
    count, head only is not shown; without the report, "nothing wanted" is not shown. Unknown, which
    resolves no alert, and which a run of short checks steps over."""
    nodes_unread = judge(snap(workers={}, errors={"ray nodes": "HTTP 500"}), [], LIMITS)
    assert nodes_unread.verdict == Verdict.UNKNOWN and "workers not counted" in nodes_unread.evidence
    report_unread = judge(snap(workers={"v4-8": 2}, errors={"autoscaler": "no answer in time"}), [], LIMITS)
    assert report_unread.verdict == Verdict.UNKNOWN and any("autoscaler" in e for e in report_unread.evidence)

    wanting = dict(workers={}, demand=["{'TPU-v4-8-head': 1} * 2"], failed_launches=["tpu-v4-8: stock-out"])
    points = [Point(at=T0 + timedelta(minutes=m), alive=0, verdict=Verdict.DEGRADED, short=True)
              for m in range(0, 30, 5)]  # fmt: skip
    points[3] = Point(at=T0 + timedelta(minutes=15), alive=0, verdict=Verdict.UNKNOWN, short=False)
    assert judge(snap(at=T0 + timedelta(minutes=31), **wanting), points, LIMITS).verdict == Verdict.STUCK


def test_below_min_without_wanting_is_degraded_and_at_min_is_healthy() -> None:
    assert judge(snap(workers={"v4-8": 1}), [], LIMITS).verdict == Verdict.DEGRADED
    ok = judge(snap(workers={"v4-8": 2}, preempted=["vm-1"]), [], LIMITS)
    assert ok.verdict == Verdict.HEALTHY and ok.action == ""
    assert any("vm-1" in e and "clean-preempted" in e for e in ok.evidence)


def test_preempted_vms_ray_still_counts_or_fails_on_are_stuck_and_named() -> None:
    counted = judge(snap(workers={"v4-8": 2}, preempted=["vm-1"], still_counted=["vm-1"]), [], LIMITS)
    assert counted.verdict == Verdict.STUCK and "vm-1" in counted.evidence[0] and "clean" in counted.action
    failing = judge(
        snap(workers={"v4-8": 2}, preempted=["vm-2"], failed_launches=["tpu-v4-8: quota"]), [], LIMITS
    )
    assert failing.verdict == Verdict.STUCK and "vm-2" in failing.evidence[0]


def test_workers_dying_soon_after_joining_is_churning() -> None:
    def death(joined_min: float, lived_min: float) -> dict:
        start = T0 + timedelta(minutes=joined_min)
        return {"node_id": f"n{joined_min}", "state": "DEAD", "resources_total": {"TPU-v4-8-head": 1},
                "start_time_ms": ms(start),
                "end_time_ms": ms(start + timedelta(minutes=lived_min))}  # fmt: skip

    now = T0 + timedelta(minutes=50)
    quick = count_workers([death(0, 4), death(10, 8), death(20, 2)]).deaths
    assert judge(snap(at=now, workers={"v4-8": 2}, deaths=quick), [], LIMITS).verdict == Verdict.CHURNING
    slow = count_workers([death(0, 4), death(10, 30), death(20, 2)]).deaths  # one lived long: not churn
    assert judge(snap(at=now, workers={"v4-8": 2}, deaths=slow), [], LIMITS).verdict == Verdict.HEALTHY
    later = T0 + timedelta(minutes=75)  # the first death left the 60-min lookback
    assert judge(snap(at=later, workers={"v4-8": 2}, deaths=quick), [], LIMITS).verdict == Verdict.HEALTHY

    # Why Ray says they died: idle nodes the autoscaler drained are scaling down, not churn.
    def why(node: dict, message: str) -> dict:
        return {**node, "state_message": message}

    idle = "Terminated due to idle (no Ray activity): idle for 60 s"
    drained = count_workers([why(death(0, 4), idle), death(10, 8), why(death(20, 2), "Expected termination")])
    assert (
        judge(snap(at=now, workers={"v4-8": 2}, deaths=drained.deaths), [], LIMITS).verdict == Verdict.HEALTHY
    )
    lost = count_workers([why(death(0, 4), "Terminated due to preemption"), death(10, 8),
                          why(death(20, 2), "Unexpected termination: health check failed")])  # fmt: skip
    churning = judge(snap(at=now, workers={"v4-8": 2}, deaths=lost.deaths), [], LIMITS)
    assert churning.verdict == Verdict.CHURNING
    assert any("(Unexpected termination: health check failed)" in line for line in churning.evidence)


def test_head_down_token_refused_and_unknown_come_from_what_could_be_read() -> None:
    down = judge(snap(head_up=False, reach="unreachable", errors={"ray": "connection refused"}), [], LIMITS)
    assert down.verdict == Verdict.HEAD_DOWN and "restart" in down.action
    refused = judge(snap(reach="refused", errors={"ray": "refused our token (HTTP 403)"}), [], LIMITS)
    assert refused.verdict == Verdict.TOKEN_REFUSED and "403" in refused.evidence[0]
    silent = judge(snap(head_up=True, reach="unreachable", errors={"ray": "no answer in 20s"}), [], LIMITS)
    assert silent.verdict == Verdict.UNKNOWN and any("no answer" in e for e in silent.evidence)
    no_cloud = judge(snap(workers={"v4-8": 2}, errors={"cloud": "DeadlineExceeded"}), [], LIMITS)
    assert no_cloud.verdict == Verdict.UNKNOWN
    still_degraded = judge(snap(workers={"v4-8": 1}, errors={"cloud": "DeadlineExceeded"}), [], LIMITS)
    assert still_degraded.verdict == Verdict.DEGRADED  # certain from Ray alone


def test_history_keeps_about_a_day_and_reads_oldest_first(tmp_path: Path) -> None:
    ctx = Context(store=LocalStore(tmp_path / "store"), registry=load_registry())
    for minutes in (0, 600, 1200, 1500, 1505):
        record(
            ctx, "c", Point(at=T0 + timedelta(minutes=minutes), alive=minutes % 7, verdict=Verdict.HEALTHY)
        )
    got = history(ctx, "c", T0 - timedelta(days=1))
    assert [p.at for p in got][0] >= T0 + timedelta(minutes=1505) - KEEP and len(got) == 4
    assert got == sorted(got, key=lambda p: p.at)
    assert [p.alive for p in history(ctx, "c", T0 + timedelta(minutes=1400))] == [1500 % 7, 1505 % 7]


def test_the_summary_is_one_compact_row_per_cluster() -> None:
    healthy = judge(snap(cluster="us-central2", workers={"v4-8": 3}, running_jobs=4), [], LIMITS)
    unread = judge(snap(cluster="big-run", reach="unreachable", errors={"ray": "timeout"}), [], LIMITS)
    table = render_summary([healthy, unread]).splitlines()
    assert table[0].split() == ["CLUSTER", "VERDICT", "WORKERS", "PREEMPTED", "DEMAND", "JOBS"]
    assert table[1].split() == ["us-central2", "healthy", "3/2/8", "0", "0", "4"]
    assert table[2].split() == ["big-run", "unknown", "?/2/8", "0", "?", "?"]
    assert "UNKNOWN" in render_health(unread)


# -- on the local cluster ----------------------------------------------------------------------------
def control(cluster: Cluster) -> SimControl:
    return SimControl(json.loads((LocalDriver(cluster).sim_dir / "sim.json").read_text())["control_url"])


def autoscaled(ctx: Context, cluster: Cluster) -> list:
    return ctx.tpu(cluster).list_nodes(cluster.zone, {"ray-cluster-name": cluster.ray_cluster_name})


def tpu_workers(cluster: Cluster) -> list[dict]:
    return [n for n in RayApi(cluster).nodes() if n["state"] == "ALIVE" and n["resources_total"].get("TPU")]


@pytest.fixture
def ctx(cluster: Cluster) -> Iterator[Context]:
    ctx = Context()
    yield ctx
    ctx.close()


@pytest.fixture
def fresh_history(cluster: Cluster) -> None:
    """No history for a test that judges churn or stuck on its own clock: no health point in the
    session's store (an earlier test's points, on a clock of its own, would interleave with this one's)
    and no dead worker in Ray's node history (a new head forgets an earlier test's preempted VMs). xdist
    runs files in any order. Ask for it before `ctx`, whose clients would reach the old simulator."""
    from ops.store import open_store

    open_store().delete(history_key(cluster.name))
    if any(n.get("state") == "DEAD" and not n.get("is_head_node") for n in RayApi(cluster).nodes()):
        driver = LocalDriver(cluster)
        driver.stop()
        driver.start()
        RayApi(cluster).wait_accepting(90)


@pytest.fixture
def stock_out(ctx: Context, cluster: Cluster) -> Iterator[SimControl]:
    """The local zone stocked out; afterwards the fault lifted and every autoscaled VM deleted, so later
    tests of the session find the cluster as it was."""
    sim = control(cluster)
    sim.add_fault("stock_out", zone=cluster.zone, times=None)
    try:
        yield sim
    finally:
        sim.clear_faults()
        api = RayApi(cluster)
        for job in api.job_details():
            if job.get("submission_id", "").startswith("health-test-") and job["status"] in (
                "PENDING",
                "RUNNING",
            ):
                api.stop(job["submission_id"])
        for node in autoscaled(ctx, cluster):
            ctx.tpu(cluster).delete_node(node.name)
        wait_for(lambda: not tpu_workers(cluster), 90, "the autoscaled workers to leave Ray", interval=1)


def test_launches_failing_on_a_stock_out_are_stuck_after_the_threshold_then_recover_and_a_preemption_is_named(
    fresh_history: None, ctx: Context, cluster: Cluster, stock_out: SimControl
) -> None:
    api = RayApi(cluster)
    sid = api.submit(entrypoint="true", submission_id=f"health-test-{time.time_ns()}",
                     entrypoint_resources={"TPU-v4-8-head": 1})  # fmt: skip
    t0 = datetime.now(UTC)
    first = wait_for(
        lambda: (h := check(ctx, "local", now=datetime.now(UTC))).snapshot.failed_launches and h,
        FAIL_TIMEOUT_S,
        "the autoscaler's launches to fail on the stock-out",
        interval=1,
    )
    assert first.snapshot.demand and first.verdict != Verdict.STUCK, render_health(first)
    assert first.snapshot.seconds < cluster.health.read_timeout_s

    stuck = check(ctx, "local", now=t0 + timedelta(minutes=31))
    assert stuck.verdict == Verdict.STUCK, render_health(stuck)
    assert "head only since" in stuck.evidence[0] and any("launches failing" in e for e in stuck.evidence)
    assert history(ctx, "local", t0)[-1].verdict == Verdict.STUCK  # recorded for the bot and the chart

    stock_out.clear_faults()
    recovered = wait_for(
        lambda: (h := check(ctx, "local", now=t0 + timedelta(minutes=32))).verdict != Verdict.STUCK and h,
        JOIN_TIMEOUT_S,
        "the cluster to recover once the stock-out lifted",
        interval=2,
    )
    assert recovered.verdict == Verdict.HEALTHY, render_health(recovered)
    wait_for(
        lambda: api.status(sid) == "SUCCEEDED", JOIN_TIMEOUT_S, "the job to run on its worker", interval=1
    )

    (vm,) = autoscaled(ctx, cluster)
    stock_out.preempt(vm.name)
    named = check(ctx, "local", now=t0 + timedelta(minutes=33))
    assert named.snapshot.preempted == [vm.node_id] and vm.node_id in "\n".join(named.evidence), (
        render_health(named)
    )


def test_a_stalled_dashboard_is_unknown_and_delays_no_other_cluster(
    ctx: Context, cluster: Cluster, stalled: psutil.Process
) -> None:
    quick = HealthThresholds(read_timeout_s=2)
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        port = silent.getsockname()[1]
        clusters = {"local": cluster.model_copy(update={"health": quick})}
        for name in ("silent-a", "silent-b"):
            clusters[name] = cluster.model_copy(update={
                "name": name, "ray_cluster_name": f"cb-{name}", "health": quick,
                "dashboard_url": f"http://127.0.0.1:{port}"})  # fmt: skip
        registry = Registry(image_repository="r", image_name="i", clusters=clusters)
        three = Context(store=ctx.store, registry=registry)
        started = time.monotonic()
        got = {h.snapshot.cluster: h for h in check_all(three, now=datetime.now(UTC))}
        took = time.monotonic() - started
        three.close()
    finally:
        silent.close()
    assert took < 2 * quick.read_timeout_s, f"the three checks took {took:.1f}s: they waited on each other"
    assert got["local"].verdict == Verdict.UNKNOWN, render_health(got["local"])
    assert any("a head is running" in e for e in got["local"].evidence)
    # No head of theirs runs on this machine (the driver knows): silent dashboards of dead heads.
    assert got["silent-a"].verdict == got["silent-b"].verdict == Verdict.HEAD_DOWN


def test_a_wrong_token_is_token_refused(
    ctx: Context, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CB_TEST_WRONG_TOKEN", "not-the-token")
    wrong = cluster.model_copy(update={"token": TokenSource(env="CB_TEST_WRONG_TOKEN"), "token_secret": None})
    other = Context(
        store=ctx.store, registry=Registry(image_repository="r", image_name="i", clusters={"local": wrong})
    )
    try:
        got = check(other, "local")
    finally:
        other.close()
    assert got.verdict == Verdict.TOKEN_REFUSED, render_health(got)
    assert "not-the-token" not in got.model_dump_json()


def test_a_head_that_is_not_running_is_head_down_and_the_cli_says_so(ops_env: Env, cluster: Cluster) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = cluster.model_copy(update={"name": "gone", "ray_cluster_name": "cb-gone",
                                      "dashboard_url": f"http://127.0.0.1:{port}"})  # fmt: skip
    ctx = Context(registry=Registry(image_repository="r", image_name="i", clusters={"gone": gone}))
    try:
        got = check(ctx, "gone")
    finally:
        ctx.close()
    assert got.verdict == Verdict.HEAD_DOWN, render_health(got)

    ok = ops_env.ops("health", "--cluster", "local", "--json")
    assert ok.code == 0, ok
    assert ok.json()["verdict"] == "healthy" and ok.json()["snapshot"]["cluster"] == "local"
    text = ops_env.ops("health", "--cluster", "local")
    assert text.code == 0 and text.out.startswith("local: HEALTHY"), text
