"""Restart benchmark: clusterbot's restart against the bare script an operator would run by hand.

On the local cluster with N running jobs (default 20, `sleep 3600`, several owners) it times, per run:

- clusterbot: the library's `start_restart(...).run()` in this process, default `Settings()` (what
  `python -m ops restart --yes` runs after its plan); its phases are the record's `durations` per step.
- bare: list the active jobs through RayApi (JobSubmissionClient), `LocalDriver.stop()`,
  `LocalDriver.start()` + wait until a submission is accepted, resubmit each job with the same
  submission id, entrypoint, metadata and runtime_env. No backup, no stopping jobs first, no record.

Before each restart the N jobs are made RUNNING again (bounded wait); the two variants alternate
which goes first. "Preserved" counts the jobs active right after a restart that descend from one of
the N: for clusterbot by metadata `clusterbot_resubmitted_from`, for bare by the benchmark's own
metadata tag (`bench_job`), which the bare script copies along with the rest of the metadata.

Isolated like tests/localray.py: a temp CLUSTERBOT_HOME with its own store and a registry copy whose
`local` cluster uses ports of its own (PORTS). The cluster started here is stopped with
`LocalDriver.stop()` on the way out, on failure and on Ctrl-C / SIGTERM too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

PORTS = {
    "gcs": 36379,
    "dashboard": 38265,
    "dashboard_agent_listen": 38266,
    "dashboard_agent_grpc": 38267,
    "metrics_export": 38268,
    "runtime_env_agent": 38269,
    "ray_client_server": 38270,
    "min_worker": 31000,
    "max_worker": 31999,
}
OWNERS = ("alice", "bob", "carol", "dave")
TAG = "bench_job"  # metadata key naming each benchmark job (j00, j01, ...)
ENTRYPOINT = "sleep 3600"
READY_TIMEOUT_S = 240.0  # for the N jobs to be RUNNING before a restart
ACCEPT_TIMEOUT_S = 120.0  # for a fresh head to accept a submission (clusterbot's own local bound)

# Table rows: (key, label). clusterbot's record step for each phase is in CB_STEPS.
PHASES = [
    ("backup", "backup (bare: list jobs)"),
    ("stop_jobs", "stop jobs"),
    ("stop", "stop cluster"),
    ("start", "start + accepting jobs"),
    ("resubmit", "resubmit jobs"),
    ("other", "other (lock, record, done)"),
]
CB_STEPS = {
    "backup": "backed_up",
    "stop_jobs": "jobs_stopped",
    "stop": "cluster_stopped",
    "start": "cluster_started",
    "resubmit": "resubmitted",
}


class BenchError(Exception):
    pass


# -- isolation -------------------------------------------------------------------------------------
def isolate(home: Path) -> Path:
    """Point this process (and its children) at a private home, store and registry copy."""
    from ops.registry import DEFAULT_REGISTRY

    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text())
    raw["clusters"]["local"]["local_ports"] = PORTS
    raw["clusters"]["local"]["dashboard_url"] = f"http://127.0.0.1:{PORTS['dashboard']}"
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


def check_ports_free() -> None:
    """Refuse to run next to anything already listening on the benchmark's head ports."""
    for name in ("gcs", "dashboard", "dashboard_agent_listen", "ray_client_server"):
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", PORTS[name])) == 0:
                raise BenchError(
                    f"something already listens on 127.0.0.1:{PORTS[name]} ({name}); "
                    "is another benchmark running?"
                )


# -- jobs ------------------------------------------------------------------------------------------
def job_spec(i: int) -> dict[str, Any]:
    """Job i: owner in metadata, or (every fifth) only in a `ray-run-<owner>-...` submission id."""
    owner, tag = OWNERS[i % len(OWNERS)], f"j{i:02d}"
    if i % 5 == 4:
        sid = f"ray-run-{owner}-bench-{tag}-{uuid.uuid4().hex[:6]}"
        return {"entrypoint": ENTRYPOINT, "submission_id": sid, "metadata": {TAG: tag}}
    return {"entrypoint": ENTRYPOINT, "metadata": {"user": owner, TAG: tag}}


def _status(d: Any) -> str:
    return str(getattr(d.status, "value", d.status))


def active_details(api: Any) -> list[Any]:
    """JobDetails of the running and pending jobs (ops.jobs.active_jobs decides which are active)."""
    from ops.jobs import active_jobs

    keep = {j.submission_id for j in active_jobs(api)}
    return [d for d in api.list_jobs() if d.submission_id in keep]


def _tag(d: Any) -> str | None:
    return (d.metadata or {}).get(TAG)


def ensure_jobs(cluster: Any, n: int, timeout: float) -> list[Any]:
    """Submit whichever of the n benchmark jobs is not active, then wait until all n are RUNNING."""
    from ops.ray_api import RayApi

    api = RayApi(cluster)
    present = {_tag(d) for d in active_details(api)}
    for i in range(n):
        if f"j{i:02d}" not in present:
            api.submit(**job_spec(i))
    wanted = {f"j{i:02d}" for i in range(n)}
    deadline = time.monotonic() + timeout
    while True:
        details = [d for d in active_details(api) if _tag(d) in wanted]
        running = {_tag(d) for d in details if _status(d) == "RUNNING"}
        if running == wanted:
            return details
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(running)} of {n} jobs RUNNING after {timeout:.0f}s")
        time.sleep(1.0)


def count_preserved(cluster: Any, before: list[Any]) -> dict[str, int]:
    """Jobs active after a restart that descend from one of `before`, by link and by tag; owners kept."""
    from ops.jobs import owner_of
    from ops.ray_api import RayApi

    old_by_id = {d.submission_id: d for d in before}
    old_by_tag = {_tag(d): d for d in before}
    linked, tagged, owner_kept = set(), set(), 0
    for d in active_details(RayApi(cluster)):
        meta = d.metadata or {}
        old = old_by_id.get(meta.get("clusterbot_resubmitted_from")) or old_by_tag.get(meta.get(TAG))
        if meta.get("clusterbot_resubmitted_from") in old_by_id:
            linked.add(meta["clusterbot_resubmitted_from"])
        if meta.get(TAG) in old_by_tag:
            tagged.add(meta[TAG])
        same_owner = (
            old is not None
            and owner_of(old.submission_id, old.metadata)[0] == owner_of(d.submission_id, meta)[0]
        )
        owner_kept += same_owner
    return {"linked": len(linked), "tagged": len(tagged), "owner_kept": owner_kept}


# -- the two restarts --------------------------------------------------------------------------------
def clusterbot_restart(cluster: Any, store: Any) -> dict[str, Any]:
    """The library's restart, timed as a whole; phases from the operation record's `durations`.
    The process has adopted the cluster's auth, as `python -m ops restart` does, so the GCS is read
    in-process."""
    from ops.restart import Step, start_restart

    events: list[tuple[float, str]] = []
    t0 = time.monotonic()
    run = start_restart(
        store, cluster, "bench", preserve_jobs=True,
        progress=lambda msg: events.append((round(time.monotonic() - t0, 2), msg)),
    )  # fmt: skip
    result = run.run()
    total = time.monotonic() - t0
    if result.step != Step.DONE:
        raise BenchError(f"clusterbot's restart ended at step {result.step.value}")
    phases = {key: result.durations.get(step, 0.0) for key, step in CB_STEPS.items()}
    phases["other"] = total - sum(phases.values())
    failed = [r.old_id for r in result.resubmitted if r.status != "submitted"]
    return {"total_s": total, "phases": phases, "op_id": result.op_id, "resubmit_failed": failed,
            "progress": events}  # fmt: skip


def bare_restart(cluster: Any) -> dict[str, Any]:
    """What an operator would do by hand: list, stop, start, wait until accepting, resubmit each."""
    from ops.drivers.local import LocalDriver
    from ops.ray_api import RayApi

    marks = [time.monotonic()]
    api = RayApi(cluster)
    jobs = [
        {"entrypoint": d.entrypoint, "submission_id": d.submission_id, "metadata": d.metadata or {},
         "runtime_env": d.runtime_env or None}
        for d in active_details(api)
    ]  # fmt: skip
    marks.append(time.monotonic())
    driver = LocalDriver(cluster)
    driver.stop()
    marks.append(time.monotonic())
    driver.start()
    api = RayApi(cluster)
    api.wait_accepting(ACCEPT_TIMEOUT_S)
    marks.append(time.monotonic())
    failed = []
    for kwargs in jobs:
        try:
            api.submit(**kwargs)
        except Exception:
            failed.append(kwargs["submission_id"])
    marks.append(time.monotonic())
    backup, stop, start, resubmit = (b - a for a, b in zip(marks, marks[1:], strict=False))
    phases = {"backup": backup, "stop_jobs": 0.0, "stop": stop, "start": start, "resubmit": resubmit,
              "other": 0.0}  # fmt: skip
    return {"total_s": marks[-1] - marks[0], "phases": phases, "resubmit_failed": failed}


# -- figures ------------------------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], n_jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"median": {}, "preserved_worst": {}, "totals": {}}
    for variant in ("clusterbot", "bare"):
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        out["totals"][variant] = [round(r["total_s"], 2) for r in mine]
        out["median"][variant] = {
            "total_s": statistics.median(r["total_s"] for r in mine),
            "phases": {k: statistics.median(r["phases"][k] for r in mine) for k, _ in PHASES},
        }
        out["preserved_worst"][variant] = min(r["preserved"] for r in mine)
    med = out["median"]
    if "clusterbot" in med and "bare" in med:
        out["ratio"] = med["clusterbot"]["total_s"] / med["bare"]["total_s"]
    out["targets"] = {"ratio_max": 1.2, "preserved": f"{n_jobs}/{n_jobs}"}
    return out


def render(summary: dict[str, Any], n_jobs: int, n_runs: int, loads: list[float]) -> str:
    med = summary["median"]
    variants = [v for v in ("clusterbot", "bare") if v in med]
    if not variants:
        return "no restart finished: no figures"

    def cell(v: str, key: str | None) -> str:
        value = med[v]["total_s"] if key is None else med[v]["phases"][key]
        return "-" if key in ("stop_jobs", "other") and v == "bare" else f"{value:.2f} s"

    lines = [
        f"Restart of the local cluster with {n_jobs} running jobs ({len(OWNERS)} owners): "
        f"medians of {n_runs} run(s) each",
        f"{'phase':<30}" + "".join(f"{v:>12}" for v in variants),
    ]
    for key, label in PHASES:
        lines.append(f"{label:<30}" + "".join(f"{cell(v, key):>12}" for v in variants))
    lines.append(f"{'total (wall)':<30}" + "".join(f"{cell(v, None):>12}" for v in variants))
    lines.append("")
    if "ratio" in summary:
        ok = "met" if summary["ratio"] <= 1.2 else "NOT met"
        lines.append(f"ratio clusterbot/bare (medians): {summary['ratio']:.2f}  (target <= 1.2: {ok})")
    for v in variants:
        kept = summary["preserved_worst"][v]
        lines.append(f"jobs preserved, worst run, {v}: {kept}/{n_jobs}  (target {n_jobs}/{n_jobs})")
    for v in variants:
        lines.append(f"totals per run, {v}: " + ", ".join(f"{t:.2f} s" for t in summary["totals"][v]))
    if loads:
        lines.append(
            f"1-min load average before each restart: {min(loads):.1f}-{max(loads):.1f} on "
            f"{os.cpu_count()} cores (shared machine: the figures are noisy)"
        )
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------
def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Wall time of clusterbot's restart against a bare operator script, on an isolated "
        "local Ray cluster with running jobs.",
    )
    p.add_argument("--runs", type=int, default=3, help="restarts per variant (default 3)")
    p.add_argument("--jobs", type=int, default=20, help="running jobs on the cluster (default 20)")
    p.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the temp CLUSTERBOT_HOME (store, logs)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        p.error("--runs and --jobs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    check_ports_free()
    home = Path(tempfile.mkdtemp(prefix="cb-bench-"))
    isolate(home)

    from ops.drivers.local import LocalDriver
    from ops.gcs_reader import adopt_cluster_auth
    from ops.ray_api import RayApi
    from ops.registry import load_registry
    from ops.store import open_store

    cluster = load_registry().get("local")
    driver = LocalDriver(cluster)
    runs: list[dict[str, Any]] = []
    loads: list[float] = []
    error: str | None = None
    code = 0
    try:
        say(f"isolated home {home}; starting the local cluster on 127.0.0.1:{PORTS['dashboard']}")
        driver.start()
        adopt_cluster_auth(cluster.read_token())  # before Ray reads (and caches) this process's auth
        RayApi(cluster).wait_accepting(ACCEPT_TIMEOUT_S)
        store = open_store()
        variants = {
            "clusterbot": lambda: clusterbot_restart(cluster, store),
            "bare": lambda: bare_restart(cluster),
        }
        for i in range(args.runs):
            order = ["clusterbot", "bare"] if i % 2 == 0 else ["bare", "clusterbot"]
            for variant in order:
                t = time.monotonic()
                before = ensure_jobs(cluster, args.jobs, READY_TIMEOUT_S)
                say(f"run {i + 1} {variant}: {len(before)} jobs RUNNING after {time.monotonic() - t:.1f}s")
                loads.append(os.getloadavg()[0])
                fig = variants[variant]()
                kept = count_preserved(cluster, before)
                fig.update(variant=variant, run=i + 1, jobs_before=len(before), load_1min=loads[-1],
                           preserved=kept["linked" if variant == "clusterbot" else "tagged"],
                           preserved_detail=kept)  # fmt: skip
                runs.append(fig)
                phases = ", ".join(f"{k} {v:.2f}" for k, v in fig["phases"].items())
                say(f"run {i + 1} {variant}: {fig['total_s']:.2f}s, "
                    f"preserved {fig['preserved']}/{len(before)}, {phases}")  # fmt: skip
    except KeyboardInterrupt:
        error, code = "interrupted", 130
        say("interrupted")
    except Exception as e:
        error, code = f"{type(e).__name__}: {e}", 1
        say(f"benchmark failed: {error}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say(driver.stop())
        left = driver._our_processes()
        if left:
            say(f"WARNING: processes of the benchmark's cluster survived: {[p.pid for p in left]}")
            code = code or 1
        elif args.keep or code == 1:
            say(f"kept {home} (store, head.log) and {driver.temp_dir} (Ray's logs)")
        else:
            shutil.rmtree(driver.temp_dir, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)

    summary = summarize(runs, args.jobs)
    print(render(summary, args.jobs, args.runs, loads))
    if error:
        print(f"incomplete: {error}")
    if args.json_out:
        doc = {
            "benchmark": "restart",
            "clusterbot_variant": "ops.restart.start_restart(...).run() in-process, default Settings()",
            "bare_variant": "RayApi.list_jobs, LocalDriver.stop, LocalDriver.start + wait_accepting, "
            "submit each",
            "jobs": args.jobs,
            "runs_per_variant": args.runs,
            "ports": PORTS,
            "cpus": os.cpu_count(),
            "error": error,
            **summary,
            "runs": runs,
        }
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")
        say(f"figures written to {args.json_out}")
    return code
