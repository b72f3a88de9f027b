"""The CLI's worker commands: `add-worker`, `workers` (the ledger beside the cloud and Ray) and
`clean-preempted`. `ops/cli.py`'s `build_parser` registers them with one call, `add_commands(add)`.

Same conventions as every command there: text or `--json` on stdout, progress on stderr, exit codes
0 done, 1 failed, 2 bad input, 3 refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from ops.clean import clean_preempted
from ops.workers import MAX_COUNT, Settings, add_worker, workers_view

if TYPE_CHECKING:
    from ops.cli import Out
    from ops.context import Context

Add = Callable[[str, Callable[..., int], str], argparse.ArgumentParser]


def cmd_add_worker(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    settings = Settings() if args.timeout is None else Settings(timeout_s=args.timeout)
    result = add_worker(
        ctx,
        args.tpu_type,
        args.capacity,
        by=args.caller,
        count=args.count,
        cluster=args.cluster,
        reason=args.reason,
        hours=args.hours,
        key=args.request_id,
        progress=out.progress,
        settings=settings,
    )
    out.result(result, result.summary())
    return 0 if result.ok else 1


def cmd_workers(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    view = workers_view(ctx, args.cluster)
    out.result(view, view.summary())
    return 0


def cmd_clean_preempted(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    result = clean_preempted(ctx, args.cluster, by=args.caller, dry_run=args.dry_run, progress=out.progress)
    out.result(result, result.summary())
    return 0 if result.ok else 1


def add_commands(add: Add) -> None:
    """Register the worker commands with `ops/cli.py`'s `add(name, fn, help)`."""
    p = add("add-worker", cmd_add_worker, "add TPU capacity (reserved, spot, best-effort) to a cluster")
    p.add_argument("tpu_type", help="e.g. v4-8, v5litepod-4, v6e-8")
    p.add_argument("--capacity", required=True, help="reserved, spot (or preemptible), best-effort")
    p.add_argument(
        "--count", type=int, default=1, help=f"how many slices, each its own queued resource (1-{MAX_COUNT})"
    )
    p.add_argument("--cluster", help="default: the cluster whose reservation or zone takes the type")
    p.add_argument("--reason", default="", help="why: shown in the ledger and the announcement")
    p.add_argument("--for", dest="hours", type=float, help="hours it is needed; then its adder is told")
    p.add_argument("--request-id", help="the same id creates nothing twice (default: the same command)")
    p.add_argument("--timeout", type=float, help="seconds to wait for READY (default 1800)")
    p = add(
        "workers", cmd_workers, "added workers: the ledger beside the cloud and Ray, disagreements flagged"
    )
    p.add_argument("--cluster", required=True)
    p = add("clean-preempted", cmd_clean_preempted, "delete the cluster's PREEMPTED / TERMINATED TPU VMs")
    p.add_argument("--cluster", required=True)
    p.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
