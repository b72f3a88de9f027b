"""Health benchmark (issue 9): a sweep of 7 clusters x 1,024 TPU VMs against one cluster's, and the
detection delay of a stuck cluster on an injected clock.

Cloud side: the TPU simulator's state and services (ops.sim) in a process of their own, on a gRPC
server with enough threads for every concurrent call, `--latency-ms` (default 50) per call
(`Latency.call_s`) and List* answers in pages of `--page-size` when the client asks for no size (Google
documents no default for ListNodes, GCP_API_FACTS.md 1.2: 100 here is our assumption; the real
google-cloud-tpu clients page through).
Each cluster has its own zone with 1,024 v4-8 VMs labelled as Ray's autoscaler labels them, a few
PREEMPTED.

Ray side: one dashboard stand-in per cluster (an HTTP server) answering what ops.health reads, from
answers recorded on the local cluster (bench/health_recorded.json), scaled to 1,024 worker nodes, with
the same latency per request (1,024 raylets do not fit on 2 cores).

Figures: the median of `--rounds` sweeps of one cluster (`ops.health.check`) and of all 7
(`ops.health.check_all`), their ratio (target <= 1.5), and the CPU each sweep cost the sweep's process
and the simulator's (on 2 shared cores, what the 7 clusters' sweep takes beyond the latency floor is
that CPU: compare it when the ratio moves); then a cluster that turns stuck (head only,
launches failing) between two checks of the bot's schedule (every 5 min, a verdict fires after it held
for 3 checks) on an injected clock: when the alert would fire, against threshold + one interval.
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import psutil
from google.cloud import tpu_v2alpha1 as tpu

RECORDED = Path(__file__).with_name("health_recorded.json")
CLUSTERS = 7
VMS = 1024
PREEMPTED = 8  # per cluster
PAGE_SIZE = 100  # ASSUMPTION: Google documents no default page size for ListNodes / ListQueuedResources
INTERVAL = timedelta(minutes=5)  # the bot's check interval (issue 9)
HOLD = 3  # checks in a row before a verdict fires (issue 9)
TARGET = 1.5


# -- the cloud: the simulator's services, with latency per call and pages ----------------------------------
def start_cloud(zones: list[str], latency_s: float, page_size: int) -> tuple[grpc.Server, str, Any]:
    from concurrent import futures

    from ops.sim import versions
    from ops.sim.lro import operations_handler
    from ops.sim.state import Latency, TpuState
    from ops.sim.tpu import check_for_operations, tpu_handler

    state = TpuState(
        zones={z: ("v4-8",) for z in zones},
        latency=Latency(queue_s=0, provision_s=0, call_s=latency_s),
        page_size=page_size,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    server.add_generic_rpc_handlers(
        (
            tpu_handler(state, versions.V2),
            tpu_handler(state, versions.V2ALPHA1),
            operations_handler(state.ops, check_for_operations(state)),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}", state


def serve_cloud(
    conn: Any, zones: dict[str, tuple[str, int, int]], project: str, latency_s: float, page: int
) -> None:
    """The cloud in a process of its own (so the simulator's own CPU, which Google's servers would spend,
    does not share the GIL with the checks): `zones` maps zone -> (Ray cluster name, VMs, preempted)."""
    server, address, state = start_cloud(list(zones), latency_s, page)
    for zone, (ray_cluster, vms, preempted) in zones.items():
        populate(state, project, zone, ray_cluster, vms, preempted)
    conn.send(address)
    conn.recv()  # until told to stop
    server.stop(0)
    state.close()


def populate(state: Any, project: str, zone: str, ray_cluster: str, vms: int, preempted: int) -> None:
    """`vms` READY v4-8 VMs of Ray's autoscaler in `zone`, the first `preempted` of them PREEMPTED."""
    from ops.sim import versions

    parent = f"projects/{project}/locations/{zone}"
    for i in range(vms):
        node = tpu.Node(
            accelerator_type="v4-8",
            runtime_version="tpu-ubuntu2204-base",
            labels={"ray-cluster-name": ray_cluster, "ray-node-id": f"{zone}-{i:04d}".replace("-", "")},
            scheduling_config=tpu.SchedulingConfig(preemptible=True),
        )
        state.create_node(parent, f"{ray_cluster}-w-{i:04d}", node, versions.V2)
    deadline = time.monotonic() + 30
    while sum(1 for n in state.list_nodes(parent)[0] if n.state == tpu.Node.State.READY) < vms:
        if time.monotonic() > deadline:
            raise SystemExit("the simulator did not make the VMs READY")
        time.sleep(0.05)
    for i in range(preempted):
        state.preempt(f"{parent}/nodes/{ray_cluster}-w-{i:04d}")


# -- Ray: a dashboard stand-in from recorded answers ---------------------------------------------------
class StandIn:
    """Answers /api/version, /api/v0/nodes, /api/jobs/ and /api/cluster_status from the recording, with
    `workers` alive v4-8 workers; `stuck` switches to head only with the stocked-out report."""

    def __init__(self, recorded: dict, workers: int, latency_s: float) -> None:
        self.recorded, self.workers, self.latency_s, self.stuck = recorded, workers, latency_s, False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                time.sleep(outer.latency_s)
                body = json.dumps(outer.answer(self.path)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self._nodes = {False: self._scaled(workers), True: self._scaled(0)}

    def _scaled(self, workers: int) -> dict:
        head, template = self.recorded["head"], self.recorded["worker"]
        nodes = [head]
        for i in range(workers):
            node = copy.deepcopy(template)
            node["node_id"] = f"{i:056x}"
            nodes.append(node)
        return {"result": True, "data": {"result": {"total": len(nodes), "result": nodes}}}

    def answer(self, path: str) -> Any:
        if path.startswith("/api/version"):
            return self.recorded["version"]
        if path.startswith("/api/v0/nodes"):
            return self._nodes[self.stuck]
        if path.startswith("/api/jobs"):
            return self.recorded["jobs"]
        if path.startswith("/api/cluster_status"):
            return self.recorded["cluster_status_stocked_out" if self.stuck else "cluster_status_healthy"]
        return {}

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


class StandInDriver:
    """What ops.health asks a driver: where the dashboard and the cloud are, whether a head exists."""

    def __init__(self, dashboard: str, cloud: str) -> None:
        self.dashboard, self.cloud = dashboard, cloud

    def dashboard_url(self) -> str:
        return self.dashboard

    def tpu_endpoint(self) -> str:
        return self.cloud

    def head_exists(self) -> bool:
        return True

    def close(self) -> None:
        pass


# -- the run ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from ops.context import Context
    from ops.health import Verdict, check, check_all
    from ops.registry import load_registry
    from ops.store import LocalStore

    latency = args.latency_ms / 1000
    recorded = json.loads(RECORDED.read_text())
    base = load_registry().clusters["local"]
    names = [f"bench-{i}" for i in range(CLUSTERS)]
    stuck_name = "bench-stuck"  # head only, its VMs gone: the detection part
    zone_of = {n: f"zone-{n}" for n in [*names, stuck_name]}
    spec = {zone_of[n]: (f"cb-{n}", VMS, PREEMPTED) for n in names} | {
        zone_of[stuck_name]: (f"cb-{stuck_name}", 0, 0)
    }
    t = time.monotonic()
    parent_end, child_end = multiprocessing.Pipe()
    cloud = multiprocessing.get_context("fork").Process(
        target=serve_cloud, args=(child_end, spec, base.project, latency, args.page_size), daemon=True
    )
    cloud.start()
    stand_ins: dict[str, StandIn] = {}
    try:
        if not parent_end.poll(120):
            raise SystemExit("the simulated cloud did not come up")
        address = parent_end.recv()
        clusters = {}
        for name in [*names, stuck_name]:
            clusters[name] = base.model_copy(
                update={
                    "name": name,
                    "ray_cluster_name": f"cb-{name}",
                    "zone": zone_of[name],
                    "min_workers": 1,
                    "max_workers": VMS,
                    "token_secret": None,  # the stand-in dashboards take no token
                    "token": None,
                }  # fmt: skip
            )
            stand_ins[name] = StandIn(recorded, VMS - PREEMPTED if name != stuck_name else 4, latency)
        print(f"set up {CLUSTERS} clusters x {VMS} TPU VMs in {time.monotonic() - t:.1f}s "
              f"({args.latency_ms:g} ms per call, pages of {args.page_size})")  # fmt: skip
        registry = load_registry().model_copy(update={"clusters": clusters})
        with tempfile.TemporaryDirectory(prefix="bench-health-") as home:
            ctx = Context(
                store=LocalStore(Path(home) / "store"),
                registry=registry,
                driver_factory=lambda c: StandInDriver(stand_ins[c.name].url, address),
            )
            try:
                check_all(ctx, names)  # warm, as a bot that checks every few minutes is: channels, imports
                sim = psutil.Process(cloud.pid)
                one, all7, cpu1, cpu7 = [], [], [], []
                for _ in range(args.rounds):
                    t, c = time.monotonic(), _cpu(sim)
                    h = check(ctx, names[0])
                    one.append(time.monotonic() - t)
                    cpu1.append(_cpu(sim, since=c))
                    t, c = time.monotonic(), _cpu(sim)
                    got = check_all(ctx, names)
                    all7.append(time.monotonic() - t)
                    cpu7.append(_cpu(sim, since=c))
                assert h.snapshot.alive == VMS - PREEMPTED and len(h.snapshot.preempted) == PREEMPTED, h
                assert all(g.snapshot.vms.get("READY") == VMS - PREEMPTED for g in got), [
                    g.snapshot.errors for g in got
                ]
                p1, p7 = statistics.median(one), statistics.median(all7)
                floor = (VMS // args.page_size + 1 + 1) * latency  # node pages + one queued-resource page
                c1 = tuple(statistics.median(x) for x in zip(*cpu1, strict=True))
                c7 = tuple(statistics.median(x) for x in zip(*cpu7, strict=True))
                print(f"one cluster's sweep: median {p1:.3f}s (latency floor of its cloud reads "
                      f"{floor:.2f}s); CPU {c1[0]:.2f}s in the sweep's process, {c1[1]:.2f}s in the "
                      f"simulator's")  # fmt: skip
                print(f"all {CLUSTERS} clusters: median {p7:.3f}s; ratio {p7 / p1:.2f} (target <= {TARGET}); "
                      f"CPU {c7[0]:.2f}s in the sweep's process, {c7[1]:.2f}s in the simulator's "
                      f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")  # fmt: skip
                detection(ctx, stand_ins[stuck_name], stuck_name, check, Verdict)
            finally:
                ctx.close()
        return 0 if p7 / p1 <= TARGET else 1
    finally:
        for s in stand_ins.values():
            s.close()
        parent_end.send("stop")
        cloud.join(10)
        if cloud.is_alive():
            cloud.kill()


def _cpu(sim: psutil.Process, since: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """CPU seconds of this process (every thread) and of the simulator's, since `since`."""
    times = sim.cpu_times()
    return time.process_time() - since[0], times.user + times.system - since[1]


def detection(ctx: Any, stand_in: StandIn, name: str, check: Callable, verdict: Any) -> None:
    """The bot's schedule on an injected clock: a check every INTERVAL, judged by the bot's own alert
    rules (bot/alerts/rules.py: HOLD checks in a row, a stuck verdict counted from when the cluster
    became short); the cluster turns stuck just after one check, the worst phase."""
    from bot.alerts.model import AlertSettings, Book
    from bot.alerts.rules import judge

    settings = AlertSettings(check_every_min=INTERVAL.total_seconds() / 60, fire_after=HOLD)
    threshold = timedelta(minutes=ctx.cluster(name).health.stuck_after_min)
    start = datetime.now(UTC) + timedelta(minutes=1)
    turns = start + INTERVAL * 2 + INTERVAL / 100
    book, fired, at = Book(), None, start
    while at < turns + threshold + INTERVAL * (HOLD + 2) and fired is None:
        stand_in.stuck = at >= turns
        h = check(ctx, name, now=at)
        changes = judge(book, h, False, at, settings)
        if any(c.kind == "post" and c.alert.problem == verdict.STUCK for c in changes):
            fired = at
        at += INTERVAL
    stand_in.stuck = False
    bound = (threshold + INTERVAL).total_seconds() / 60
    after = "never" if fired is None else f"{(fired - turns).total_seconds() / 60:.1f} min"
    print(f"stuck detection (threshold {threshold.total_seconds() / 60:g} min, checks every "
          f"{INTERVAL.total_seconds() / 60:g} min, {HOLD} in a row): the alert fired {after} after the "
          f"cluster turned stuck; bound threshold + one interval = {bound:g} min")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
