"""Add-worker benchmark: N queued resources requested at once against one, up to READY, on the TPU
simulator with provisioning latency injected (issue 7's benchmark).

Part `provision` (no Ray): an in-process `ops.sim.SimServer` with `Latency(admit_s, queue_s,
provision_s)` (default 0 + 1 + 2 s: the floor a request cannot beat), reached through the real
google-cloud-tpu clients, timed two ways per round, for 1 and for N (default 8) slices of v4-8:

- add-worker: `ops.workers.add_worker(ctx, "v4-8", "reserved", count=N, cluster="local", ...)` as the
  CLI calls it (cluster lock, ledger records, startup script, N threads each creating and waiting);
- threads: `TpuApi.provision(...)` directly in N threads (no lock, no ledger), so any difference between
  the two is ours above the TPU client.

With the `TpuApi` the Context hands out (its own default `poll_s`; add-worker alone, both variants
wait for the same poll there) and again with a short poll (both variants), since `wait_active` polls
at `poll_s` and a poll slower than the provisioning latency decides the figure. The ratio is
p50(N) / p50(1) per variant and poll (target <= 1.3). Every queued resource is deleted after its
measurement (outside the timing); the order 1-then-N alternates per round.

Part `join` (real Ray): the local cluster started by its driver on ports of its own (PORTS), its cloud
the TPU simulator beside the head (default latency, queue 1 s + provision 2 s), whose READY VMs start
Ray workers that join the head (ops/sim/workers.py). For 1 and for 2 v4-8 workers it times, from the
request (`add_worker` through the default Context: the TpuApi Ray's autoscaler and the CLI use), until
as many new nodes with `TPU-v4-8-head` are ALIVE in the head's `/api/v0/nodes`, and when add-worker
returned. On 2 cores a second join measures CPU contention (each raylet's start-up is CPU-bound), not
our code. Between measurements the workers are deleted and their nodes left ALIVE no more.

Isolated like bench/restart.py: a temp CLUSTERBOT_HOME with its own store and a registry copy whose
`local` cluster is in the simulator's zone on its own ports; the cluster started here is stopped on the
way out (`LocalDriver.stop()`: the simulator and every VM's workers too), on failure and SIGTERM too.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.isolation import isolate

if TYPE_CHECKING:
    from ops.context import Context
    from ops.gcp.tpu import TpuApi

# Below Linux's ephemeral range, clear of the local default (6379, 8265, 10001, 11365-11368, workers
# 20000-20999), the GCP tunnels (8266-8272), the restart bench (11100-11999), the bot bench
# (11200-11360) and the tests (12000-32499).
PORTS = {
    "gcs": 11000,
    "dashboard": 11001,
    "dashboard_agent_listen": 11002,
    "dashboard_agent_grpc": 11003,
    "metrics_export": 11004,
    "runtime_env_agent": 11005,
    "ray_client_server": 11006,
    "min_worker": 11010,
    "max_worker": 11090,
}
JOIN_TIMEOUT_S = 180.0  # for the workers of one request to join the head (raylets start slowly on 2 cores)
GONE_TIMEOUT_S = 60.0  # for deleted workers' nodes to leave ALIVE
TPU_TYPE = "v4-8"
CLUSTER = "local"
TARGET_RATIO = 1.3
READY_TIMEOUT_S = 120.0  # for one request to be READY on the simulator (its latency is a few seconds)
VARIANTS = ("add-worker", "threads")

Say = Callable[[str], None]


class BenchError(Exception):
    pass


# -- isolation -------------------------------------------------------------------------------------
def default_poll_s() -> float:
    """The poll interval of the TpuApi that Context hands out (its constructor's default)."""
    from ops.gcp.tpu import TpuApi

    return float(inspect.signature(TpuApi.__init__).parameters["poll_s"].default)


# -- part 1: N queued resources against one, up to READY ---------------------------------------------
def via_add_worker(ctx: Context, count: int, key: str) -> tuple[float, list[str]]:
    """Seconds for `add_worker(count=N)` to return with every slice READY; the queued resources' names."""
    from ops.workers import Settings, add_worker

    t0 = time.monotonic()
    result = add_worker(ctx, TPU_TYPE, "reserved", by="bench", count=count, cluster=CLUSTER, key=key,
                        reason="benchmark", settings=Settings(timeout_s=READY_TIMEOUT_S))  # fmt: skip
    elapsed = time.monotonic() - t0
    api = ctx.tpu(ctx.cluster(CLUSTER))
    names = [f"{api.parent(result.zone)}/queuedResources/{w.qr_id}" for w in result.workers]
    if not result.ok:
        delete_all(api, names)
        raise BenchError(f"add-worker did not get {count} ready: {result.summary()}")
    return elapsed, names


def via_threads(ctx: Context, count: int, key: str) -> tuple[float, list[str]]:
    """Seconds for `TpuApi.provision` in `count` threads to have every slice READY; their names."""
    from ops.gcp.tpu import LABEL_CLUSTER, LABEL_OWNER, Capacity, queued_resource_id

    cluster = ctx.cluster(CLUSTER)
    api = ctx.tpu(cluster)
    ids = [queued_resource_id(cluster.name, TPU_TYPE, key, i) for i in range(count)]
    labels = {LABEL_CLUSTER: cluster.name, LABEL_OWNER: "bench"}

    def one(qr_id: str) -> str:
        info = api.provision(cluster.zone, qr_id, TPU_TYPE, Capacity.RESERVED, labels,
                             timeout_s=READY_TIMEOUT_S)  # fmt: skip
        return info.name

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="bench-provision") as pool:
        names = list(pool.map(one, ids))
    return time.monotonic() - t0, names


def delete_all(api: TpuApi, names: list[str]) -> None:
    """Delete the measured queued resources (and their nodes), so the next measurement starts clean."""
    with ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="bench-delete") as pool:
        list(pool.map(api.delete_queued_resource, names))


def provisioning(args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Part 1: per poll interval and variant, the seconds for 1 and for N slices to be READY."""
    from ops.context import Context
    from ops.gcp.tpu import TpuApi, tpu_clients
    from ops.sim import Latency, SimServer

    latency = Latency(admit_s=args.admit_s, queue_s=args.queue_s, provision_s=args.provision_s, delete_s=0)
    floor = latency.admit_s + latency.queue_s + latency.provision_s
    timed = {"add-worker": via_add_worker, "threads": via_threads}
    own_poll = default_poll_s()  # there both variants wait for the same poll: add-worker alone is timed
    samples: dict[str, dict[str, dict[int, list[float]]]] = {}
    loads: list[float] = []
    from ops.registry import clusterbot_home, load_registry
    from ops.store import LocalStore

    local = load_registry().clusters[CLUSTER]
    seed = {local.project: {local.token_secret: "bench-token"}} if local.token_secret else None
    with SimServer(latency=latency, secrets=seed) as sim:  # the token add-worker's VMs carry
        for poll_s in args.poll_s:
            ctx = Context(
                # A store of its own: the token pinned here is this simulator's, not part 2's cluster's.
                store=LocalStore(clusterbot_home() / "provision-store"),
                tpu_factory=lambda c, p=poll_s: TpuApi(tpu_clients(sim.address), c.project, poll_s=p),
                cloud_endpoint=lambda c: sim.address,
            )
            try:
                for r in range(args.rounds):
                    counts = (1, args.count) if r % 2 == 0 else (args.count, 1)
                    for variant in VARIANTS if poll_s != own_poll else VARIANTS[:1]:
                        for count in counts:
                            loads.append(os.getloadavg()[0])
                            key = f"bench-{poll_s:g}-{variant}-{r}-{count}"
                            seconds, names = timed[variant](ctx, count, key)
                            delete_all(ctx.tpu(ctx.cluster(CLUSTER)), names)
                            per = samples.setdefault(f"{poll_s:g}", {}).setdefault(variant, {})
                            per.setdefault(count, []).append(seconds)
                            say(f"poll {poll_s:g}s round {r + 1} {variant} x{count}: {seconds:.2f} s")
            finally:
                ctx.close()
    return {"latency": latency.model_dump(), "floor_s": floor, "count": args.count, "samples": samples,
            "loads": loads}  # fmt: skip


def summarize_provisioning(part: dict[str, Any]) -> dict[str, Any]:
    """p50 and max per (poll, variant, count), and the ratio p50(N) / p50(1)."""
    n = part["count"]
    rows = {}
    for poll, variants in part["samples"].items():
        for variant, per in variants.items():
            one, many = per.get(1, []), per.get(n, [])
            if not one or not many:
                continue
            rows[f"{poll}|{variant}"] = {
                "poll_s": float(poll),
                "variant": variant,
                "one_p50": statistics.median(one),
                "one_max": max(one),
                "many_p50": statistics.median(many),
                "many_max": max(many),
                "ratio": statistics.median(many) / statistics.median(one),
                "ratio_max": max(many) / statistics.median(one),
            }
    return rows


def render_provisioning(part: dict[str, Any], rows: dict[str, Any], rounds: int) -> str:
    n, lat = part["count"], part["latency"]
    lines = [
        f"{n} queued resources ({TPU_TYPE}, reserved) at once against 1, up to READY, on the TPU simulator "
        f"(admit {lat['admit_s']:g} s + queue {lat['queue_s']:g} s + provision {lat['provision_s']:g} s = "
        f"floor {part['floor_s']:g} s); {rounds} round(s) each",
        f"{'poll':>6} {'variant':<11} {'1: p50':>8} {'max':>7} {f'{n}: p50':>8} {'max':>7} "
        f"{'ratio p50':>10} {'max/p50(1)':>11} {'1 over floor':>13}  target <= {TARGET_RATIO}",
    ]
    for row in rows.values():
        ok = "met" if row["ratio"] <= TARGET_RATIO else "NOT met"
        lines.append(
            f"{row['poll_s']:>5g}s {row['variant']:<11} {row['one_p50']:>7.2f}s {row['one_max']:>6.2f}s "
            f"{row['many_p50']:>7.2f}s {row['many_max']:>6.2f}s {row['ratio']:>10.2f} "
            f"{row['ratio_max']:>11.2f} {row['one_p50'] - part['floor_s']:>12.2f}s  {ok}"
        )
    slow = [r for r in rows.values() if r["one_p50"] - part["floor_s"] > r["poll_s"] / 2]
    if slow:
        worst = max(slow, key=lambda r: r["one_p50"])
        lines.append(
            f"at a {worst['poll_s']:g} s poll one slice takes {worst['one_p50']:.1f} s where the simulator "
            f"has it READY after {part['floor_s']:g} s: TpuApi.wait_active's fixed poll_s sets the "
            "figure, and a ratio of two figures both set by the poll says little"
        )
    return "\n".join(lines)


# -- part 2: from request to Ray node joined ---------------------------------------------------------
def tpu_heads(ctx: Context) -> set[str]:
    """Node ids of the ALIVE Ray nodes with the type's TPU-<type>-head (host 0 of a slice)."""
    head = f"TPU-{TPU_TYPE}-head"
    nodes = ctx.ray(ctx.cluster(CLUSTER)).nodes()
    return {
        n["node_id"] for n in nodes if n.get("state") == "ALIVE" and head in (n.get("resources_total") or {})
    }


def one_join(ctx: Context, count: int, key: str) -> dict[str, Any]:
    """Request `count` workers; seconds until each new TPU head node is ALIVE, and until add-worker
    returned (it sees READY at its own poll, the VM boots on READY: either may come first)."""
    from ops.workers import Settings, add_worker

    before = tpu_heads(ctx)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-add-worker") as pool:
        settings = Settings(timeout_s=JOIN_TIMEOUT_S)
        request = pool.submit(add_worker, ctx, TPU_TYPE, "reserved", by="bench", count=count,
                              cluster=CLUSTER, key=key, reason="benchmark", settings=settings)  # fmt: skip
        returned: list[float] = []
        request.add_done_callback(lambda _: returned.append(time.monotonic() - t0))
        joined: dict[str, float] = {}
        while len(joined) < count:
            for node_id in tpu_heads(ctx) - before - set(joined):
                joined[node_id] = time.monotonic() - t0
            if request.done() and request.exception() is not None:
                break
            if time.monotonic() - t0 > JOIN_TIMEOUT_S:
                break
            time.sleep(0.5)  # the state API has no events; each call costs the head CPU
        result = request.result(timeout=JOIN_TIMEOUT_S)
    api = ctx.tpu(ctx.cluster(CLUSTER))
    names = [f"{api.parent(result.zone)}/queuedResources/{w.qr_id}" for w in result.workers]
    return {"count": count, "joined_s": sorted(joined.values()), "nodes": list(joined), "ready": result.ok,
            "add_worker_s": returned[0] if returned else None, "names": names}  # fmt: skip


def settle(ctx: Context, names: list[str], nodes: list[str]) -> None:
    """Delete the workers and wait (bounded) until their Ray nodes are ALIVE no more."""
    delete_all(ctx.tpu(ctx.cluster(CLUSTER)), names)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while set(nodes) & tpu_heads(ctx):
        if time.monotonic() > deadline:
            raise BenchError(f"Ray nodes of deleted workers still ALIVE after {GONE_TIMEOUT_S:.0f}s")
        time.sleep(0.5)


def joining(args: argparse.Namespace, say: Say) -> dict[str, Any]:
    """Part 2: the local cluster with its simulator, 1 and 2 workers per round, request to joined."""
    from ops.context import Context

    ctx = Context()
    cluster = ctx.cluster(CLUSTER)
    driver = ctx.driver(cluster)
    runs: list[dict[str, Any]] = []
    loads: list[float] = []
    try:
        say(f"starting the local cluster on 127.0.0.1:{PORTS['dashboard']} with its TPU simulator")
        t = time.monotonic()
        driver.start()
        say(f"head up after {time.monotonic() - t:.1f}s")
        for r in range(args.rounds):
            for count in (1, 2) if r % 2 == 0 else (2, 1):
                loads.append(os.getloadavg()[0])
                run = one_join(ctx, count, f"bench-join-{r}-{count}")
                run["round"] = r + 1
                runs.append(run)
                settle(ctx, run["names"], run["nodes"])
                joined = ", ".join(f"{s:.2f}" for s in run["joined_s"])
                add = "-" if run["add_worker_s"] is None else f"{run['add_worker_s']:.2f}"
                say(f"round {r + 1} x{count}: joined at {joined} s; add-worker returned at {add} s")
                if len(run["joined_s"]) < count or not run["ready"]:
                    raise BenchError(f"{count} worker(s) requested, {len(run['joined_s'])} joined")
    finally:
        say(driver.stop())
        left = driver._our_processes()
        ctx.close()
        if left:
            say(f"WARNING: processes of the benchmark's cluster survived: {[p.pid for p in left]}")
        shutil.rmtree(driver.temp_dir, ignore_errors=True)
    return {"runs": runs, "loads": loads, "left": [p.pid for p in left]}


def summarize_joins(part: dict[str, Any]) -> dict[str, Any]:
    """p50 and max of the last join per count (1, 2), of add-worker's return, and the ratio."""
    rows: dict[str, Any] = {}
    for count in (1, 2):
        mine = [r for r in part["runs"] if r["count"] == count and len(r["joined_s"]) == count]
        if not mine:
            continue
        last = [r["joined_s"][-1] for r in mine]
        returned = [r["add_worker_s"] for r in mine if r["add_worker_s"] is not None]
        rows[str(count)] = {"joined_p50": statistics.median(last), "joined_max": max(last),
                            "add_worker_p50": statistics.median(returned) if returned else None}  # fmt: skip
    if "1" in rows and "2" in rows:
        rows["ratio"] = rows["2"]["joined_p50"] / rows["1"]["joined_p50"]
    return rows


def render_joins(part: dict[str, Any], rows: dict[str, Any], rounds: int) -> str:
    lines = [
        f"From request to Ray node joined (TPU-{TPU_TYPE}-head ALIVE in /api/v0/nodes), the local cluster "
        f"with its TPU simulator (queue 1 s + provision 2 s); {rounds} round(s) each",
        f"{'workers':>8} {'joined: p50':>12} {'max':>7} {'add-worker returned: p50':>25}",
    ]
    for count in ("1", "2"):
        if count in rows:
            row = rows[count]
            add = "-" if row["add_worker_p50"] is None else f"{row['add_worker_p50']:.2f}s"
            lines.append(f"{count:>8} {row['joined_p50']:>11.2f}s {row['joined_max']:>6.2f}s {add:>25}")
    if "ratio" in rows:
        lines.append(
            f"ratio 2/1 (p50 of the last join): {rows['ratio']:.2f}; on {os.cpu_count()} cores two raylets "
            "starting at once compete for CPU: this ratio measures contention, not our code"
        )
    loads = part["loads"]
    if loads:
        lines.append(f"1-min load average during part 2: {min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------
def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench workers",
        description="N TPU queued resources at once against one, up to READY, on the TPU simulator.",
    )
    p.add_argument("--rounds", type=int, default=3, help="measurements per figure (default 3)")
    p.add_argument("--count", type=int, default=8, help="queued resources requested at once (default 8)")
    p.add_argument("--admit-s", type=float, default=0.0, help="simulated admission latency (default 0)")
    p.add_argument("--queue-s", type=float, default=1.0, help="simulated queueing latency (default 1)")
    p.add_argument("--provision-s", type=float, default=2.0, help="simulated provisioning (default 2)")
    p.add_argument(
        "--poll-s",
        type=_floats,
        default=None,
        help="comma-separated TpuApi poll intervals (default: the Context's own, then 1)",
    )
    p.add_argument(
        "--parts",
        default="provision,join",
        help="comma-separated, of provision (N at once, no Ray) and join (Ray nodes joining); default both",
    )
    p.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the temp CLUSTERBOT_HOME")
    args = p.parse_args(argv)
    if args.rounds < 1 or not 2 <= args.count <= 16:
        p.error("--rounds must be at least 1 and --count 2 to 16")
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not args.parts or set(args.parts) - {"provision", "join"}:
        p.error("--parts: choose among provision, join")
    if args.poll_s is None:
        args.poll_s = sorted({default_poll_s(), 1.0}, reverse=True)
    if not args.poll_s or min(args.poll_s) <= 0:
        p.error("--poll-s: positive seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    say: Say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    home = Path(tempfile.mkdtemp(prefix="cb-bench-workers-"))
    from ops.sim import LOCAL_REGION, LOCAL_ZONE

    isolate(home, PORTS, region=LOCAL_REGION, zone=LOCAL_ZONE, min_workers=0)  # the simulator's zone
    doc: dict[str, Any] = {"benchmark": "workers", "rounds": args.rounds, "cpus": os.cpu_count()}
    error: str | None = None
    code = 0
    started = time.monotonic()
    try:
        if "provision" in args.parts:
            part = provisioning(args, say)
            rows = summarize_provisioning(part)
            doc["provision"] = {**part, "figures": rows}
            print(render_provisioning(part, rows, args.rounds))
            loads = part["loads"]
            print(f"1-min load average during part 1: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} "
                  "cores (shared machine: noisy)")  # fmt: skip
        if "join" in args.parts:
            part = joining(args, say)
            rows = summarize_joins(part)
            doc["join"] = {**part, "figures": rows}
            print(render_joins(part, rows, args.rounds))
            if part["left"]:
                code = 1
    except KeyboardInterrupt:
        error, code = "interrupted", 130
    except Exception as e:
        error, code = f"{type(e).__name__}: {e}", 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if args.keep or code == 1:
            say(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"benchmark wall time: {time.monotonic() - started:.0f} s")
    if error:
        print(f"incomplete: {error}")
    if args.json_out:
        doc["error"] = error
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")
        say(f"figures written to {args.json_out}")
    return code
