"""Restart benchmark: clusterbot's restart against the bare script an operator would run by hand.

On the local cluster with N running jobs (default 20, several owners; every one with entrypoint
resources, every other one from a `working_dir` package: bench/restart_jobs.py) it times, per run:

- clusterbot: the library's `start_restart(...).run()` in this process, default `Settings()` (what
  `python -m ops restart --yes` runs after its plan); its phases are the record's `durations` per step.
  The backup reads the GCS port in-process (the local cluster).
- via-job: the same, on a view of the cluster whose GCS port is out of reach (a GCP cluster): the
  backup's snapshot runs as a job on the cluster and comes back through the dashboard.
- bare: list the active jobs through RayApi (JobSubmissionClient), `LocalDriver.stop()`,
  `LocalDriver.start()` + wait until a submission is accepted, resubmit each job with the same
  submission id, entrypoint, metadata and runtime_env. No backup, no stopping jobs first, no record.

Before each restart the N jobs are made RUNNING again (bounded wait); the variants rotate which goes
first. After each restart (outside the timing) the descendants of the N (clusterbot's link
`clusterbot_resubmitted_from`, or the benchmark's metadata tag `bench_job`, which the bare script
copies) may leave PENDING; then "running" counts them RUNNING and "faithful" those also with their
original's entrypoint resources (JobInfo, read from the GCS port).

Isolated like tests/localray.py: a temp CLUSTERBOT_HOME with its own store and a registry copy whose
`local` cluster uses ports of its own (PORTS), which `LocalDriver.start()` checks free. The cluster
started here is stopped with `LocalDriver.stop()` on the way out, on failure and on Ctrl-C / SIGTERM
too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.isolation import isolate
from bench.restart_jobs import (
    OWNERS,
    PACKAGE_KIB,
    dashboard_only,
    has_resources,
    job_infos,
    job_spec,
    make_workdirs,
    outcome,
    tag_of,
)

# Below Linux's ephemeral range (32768-60999), clear of the local default (6379, 8265, 10001,
# 11365-11368, workers 20000-20999), the GCP tunnels (8266-8272) and the test fixture's blocks
# (tests/localray.py: 12000-19999, workers 21000-32499).
PORTS = {
    "gcs": 11100,
    "dashboard": 11101,
    "dashboard_agent_listen": 11102,
    "dashboard_agent_grpc": 11103,
    "metrics_export": 11104,
    "runtime_env_agent": 11105,
    "ray_client_server": 11106,
    "min_worker": 11400,
    "max_worker": 11999,
}
READY_TIMEOUT_S = 240.0  # for the N jobs to be RUNNING before a restart
ACCEPT_TIMEOUT_S = 120.0  # for a fresh head to accept a submission (clusterbot's own local bound)
OUTCOME_TIMEOUT_S = 60.0  # after a restart, for resubmitted jobs to leave PENDING
VARIANTS = ("clusterbot", "via-job", "bare")

# Table rows: (key, label). clusterbot's record step for each phase is in CB_STEPS.
PHASES = [
    ("backup", "backup (bare: list jobs)"),
    ("stop_jobs", "stop jobs"),
    ("stop", "stop cluster"),
    ("start", "start + accepting jobs"),
    ("resubmit", "resubmit jobs"),
    ("settle", "settle (jobs running)"),
    ("other", "other (lock, record, done)"),
]
CB_STEPS = {
    "backup": "backed_up",
    "stop_jobs": "jobs_stopped",
    "stop": "cluster_stopped",
    "start": "cluster_started",
    "resubmit": "resubmitted",
    "settle": "done",
}
CB_ONLY = ("stop_jobs", "settle", "other")  # phases the bare script has not


class BenchError(Exception):
    pass


# -- isolation -------------------------------------------------------------------------------------
# -- jobs ------------------------------------------------------------------------------------------
def _status(d: Any) -> str:
    return str(getattr(d.status, "value", d.status))


def active_details(api: Any) -> list[Any]:
    """JobDetails of the running and pending jobs (ops.jobs.active_jobs decides which are active)."""
    from ops.jobs import active_jobs

    keep = {j.submission_id for j in active_jobs(api)}
    return [d for d in api.list_jobs() if d.submission_id in keep]


def ensure_jobs(cluster: Any, n: int, timeout: float, workdirs: dict[str, Path]) -> list[Any]:
    """Submit whichever of the n benchmark jobs is not active, or active without its entrypoint
    resources (a bare restart drops them: stopped first), then wait until all n are RUNNING."""
    from ops.ray_api import RayApi

    api = RayApi(cluster)
    deadline = time.monotonic() + timeout
    infos = job_infos(cluster)
    degraded = [d.submission_id for d in active_details(api) if not has_resources(infos.get(d.submission_id))]
    for sid in degraded:
        api.stop(sid)
    while {d.submission_id for d in active_details(api)} & set(degraded):
        if time.monotonic() > deadline:
            raise BenchError(f"jobs without their resources still active after {timeout:.0f}s: {degraded}")
        time.sleep(0.5)
    present = {tag_of(d) for d in active_details(api)}
    for i in range(n):
        if f"j{i:02d}" not in present:
            api.submit(**job_spec(i, workdirs))
    wanted = {f"j{i:02d}" for i in range(n)}
    while True:
        details = [d for d in active_details(api) if tag_of(d) in wanted]
        running = {tag_of(d) for d in details if _status(d) == "RUNNING"}
        if running == wanted:
            return details
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(running)} of {n} jobs RUNNING after {timeout:.0f}s")
        time.sleep(1.0)


# -- the restarts ------------------------------------------------------------------------------------
def clusterbot_restart(cluster: Any, store: Any) -> dict[str, Any]:
    """The library's restart, timed as a whole; phases from the operation record's `durations`.
    The process has adopted the cluster's auth, as `python -m ops restart` does, so the GCS is read
    in-process."""
    from ops.context import Context
    from ops.restart import Step, start_restart

    events: list[tuple[float, str]] = []
    t0 = time.monotonic()
    run = start_restart(
        Context(store), cluster, "bench", preserve_jobs=True,
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
              "settle": 0.0, "other": 0.0}  # fmt: skip
    return {"total_s": marks[-1] - marks[0], "phases": phases, "resubmit_failed": failed}


# -- figures ------------------------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]], n_jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"median": {}, "worst": {}, "totals": {}, "ratio": {}}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        out["totals"][variant] = [round(r["total_s"], 2) for r in mine]
        out["median"][variant] = {
            "total_s": statistics.median(r["total_s"] for r in mine),
            "phases": {k: statistics.median(r["phases"][k] for r in mine) for k, _ in PHASES},
        }
        out["worst"][variant] = {k: min(r["outcome"][k] for r in mine) for k in ("running", "faithful")}
    med = out["median"]
    for variant in ("clusterbot", "via-job"):
        if variant in med and "bare" in med:
            out["ratio"][variant] = med[variant]["total_s"] / med["bare"]["total_s"]
    out["targets"] = {"ratio_max": 1.2, "preserved": f"{n_jobs}/{n_jobs}"}
    return out


def render(summary: dict[str, Any], n_jobs: int, n_runs: int, loads: list[float]) -> str:
    med = summary["median"]
    variants = [v for v in VARIANTS if v in med]
    if not variants:
        return "no restart finished: no figures"

    def cell(v: str, key: str | None) -> str:
        value = med[v]["total_s"] if key is None else med[v]["phases"][key]
        return "-" if key in CB_ONLY and v == "bare" else f"{value:.2f} s"

    packaged = n_jobs // 2
    lines = [
        f"Restart of the local cluster with {n_jobs} running jobs ({len(OWNERS)} owners; all with "
        f"entrypoint resources, {packaged} from a working_dir package): medians of {n_runs} run(s) each",
        f"{'phase':<30}" + "".join(f"{v:>12}" for v in variants),
    ]
    for key, label in PHASES:
        lines.append(f"{label:<30}" + "".join(f"{cell(v, key):>12}" for v in variants))
    lines.append(f"{'total (wall)':<30}" + "".join(f"{cell(v, None):>12}" for v in variants))
    lines.append("")
    for v, ratio in summary["ratio"].items():
        ok = "met" if ratio <= 1.2 else "NOT met"
        settle = med[v]["phases"]["settle"]
        unsettled = (med[v]["total_s"] - settle) / med["bare"]["total_s"]
        lines.append(
            f"ratio {v}/bare (medians): {ratio:.2f}  (target <= 1.2: {ok}); without the settle wait: "
            f"{unsettled:.2f}"
        )
    for v in variants:
        worst = summary["worst"][v]
        lines.append(
            f"jobs kept, worst run, {v}: {worst['running']}/{n_jobs} running, {worst['faithful']}/{n_jobs} "
            f"with their entrypoint resources  (target {n_jobs}/{n_jobs})"
        )
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
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default all)",
    )
    p.add_argument("--package-kib", type=int, default=PACKAGE_KIB, help="size of each working_dir package")
    p.add_argument("--json-out", type=Path, help="also write the figures as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the temp CLUSTERBOT_HOME (store, logs)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        p.error("--runs and --jobs must be at least 1")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.variants or set(args.variants) - set(VARIANTS):
        p.error(f"--variants: choose among {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    home = Path(tempfile.mkdtemp(prefix="cb-bench-"))
    isolate(home, PORTS)

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
        workdirs = make_workdirs(home / "jobs", args.package_kib)
        variants = {
            "clusterbot": lambda: clusterbot_restart(cluster, store),
            "via-job": lambda: clusterbot_restart(dashboard_only(cluster), store),
            "bare": lambda: bare_restart(cluster),
        }
        for i in range(args.runs):
            order = args.variants[i % len(args.variants) :] + args.variants[: i % len(args.variants)]
            for variant in order:
                t = time.monotonic()
                before = ensure_jobs(cluster, args.jobs, READY_TIMEOUT_S, workdirs)
                infos = job_infos(cluster)
                say(f"run {i + 1} {variant}: {len(before)} jobs RUNNING after {time.monotonic() - t:.1f}s")
                loads.append(os.getloadavg()[0])
                fig = variants[variant]()
                kept = outcome(cluster, before, infos, OUTCOME_TIMEOUT_S)
                fig.update(variant=variant, run=i + 1, jobs_before=len(before), load_1min=loads[-1],
                           outcome=kept)  # fmt: skip
                runs.append(fig)
                phases = ", ".join(f"{k} {v:.2f}" for k, v in fig["phases"].items())
                say(f"run {i + 1} {variant}: {fig['total_s']:.2f}s, {kept['running']}/{len(before)} running, "
                    f"{kept['faithful']} faithful, {phases}")  # fmt: skip
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
            "via_job_variant": "the same on a view of the cluster without GCS address: snapshot as a job",
            "bare_variant": "RayApi.list_jobs, LocalDriver.stop, LocalDriver.start + wait_accepting, "
            "submit each",
            "jobs": args.jobs,
            "runs_per_variant": args.runs,
            "package_kib": args.package_kib,
            "ports": PORTS,
            "cpus": os.cpu_count(),
            "error": error,
            **summary,
            "runs": runs,
        }
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")
        say(f"figures written to {args.json_out}")
    return code
