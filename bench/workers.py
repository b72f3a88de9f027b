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

Isolated like bench/restart.py: a temp CLUSTERBOT_HOME with its own store and a registry copy whose
`local` cluster is in the simulator's zone, removed at the end.
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

import yaml

if TYPE_CHECKING:
    from ops.context import Context
    from ops.gcp.tpu import TpuApi

TPU_TYPE = "v4-8"
CLUSTER = "local"
TARGET_RATIO = 1.3
READY_TIMEOUT_S = 120.0  # for one request to be READY on the simulator (its latency is a few seconds)
VARIANTS = ("add-worker", "threads")

Say = Callable[[str], None]


class BenchError(Exception):
    pass


# -- isolation -------------------------------------------------------------------------------------
def isolate(home: Path) -> Path:
    """Point this process (and its children) at a private home, store and registry copy whose `local`
    cluster lives in the simulator's zone."""
    from ops.registry import DEFAULT_REGISTRY
    from ops.sim import LOCAL_REGION, LOCAL_ZONE

    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text())
    local = raw["clusters"][CLUSTER]
    local.update(region=LOCAL_REGION, zone=LOCAL_ZONE)
    registry = home / "clusters.yaml"
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    for key in list(os.environ):
        if key.startswith(("RAY_AUTH", "CLUSTERBOT_")) or key == "RAY_ADDRESS":
            del os.environ[key]
    os.environ.update(
        CLUSTERBOT_HOME=str(home),
        CLUSTERBOT_REGISTRY=str(registry),
        CLUSTERBOT_STORE=str(home / "store"),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return registry


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
    with SimServer(latency=latency) as sim:
        for poll_s in args.poll_s:
            ctx = Context(
                tpu_factory=lambda c, p=poll_s: TpuApi(tpu_clients(sim.address), c.project, poll_s=p)
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
    p.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the temp CLUSTERBOT_HOME")
    args = p.parse_args(argv)
    if args.rounds < 1 or not 2 <= args.count <= 16:
        p.error("--rounds must be at least 1 and --count 2 to 16")
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
    isolate(home)
    doc: dict[str, Any] = {"benchmark": "workers", "rounds": args.rounds, "cpus": os.cpu_count()}
    error: str | None = None
    code = 0
    started = time.monotonic()
    try:
        part = provisioning(args, say)
        rows = summarize_provisioning(part)
        doc["provision"] = {**part, "figures": rows}
        print(render_provisioning(part, rows, args.rounds))
        loads = part["loads"]
        print(
            f"1-min load average during part 1: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores"
        )
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
