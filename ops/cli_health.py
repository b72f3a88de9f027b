"""The CLI's `health` command: one snapshot and verdict per cluster (ops/health.py), all clusters at once.

`ops/cli.py`'s `build_parser` registers it with `add_commands(add)`. Text or `--json` on stdout; exit 0
when every cluster checked is healthy, 1 when any is not (so a cron job or a script can act on it),
2 bad input.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from ops.health import Verdict, check_all
from ops.render import render_health, render_summary

if TYPE_CHECKING:
    from ops.cli import Out
    from ops.context import Context

Add = Callable[[str, Callable[..., int], str], argparse.ArgumentParser]


def cmd_health(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    healths = check_all(ctx, [args.cluster] if args.cluster else None)
    text = "\n\n".join(render_health(h) for h in healths)
    if len(healths) > 1:
        text = render_summary(healths) + "\n\n" + text
    if len(healths) == 1:
        out.result(healths[0], text)
    else:
        out.result({"clusters": [h.model_dump(mode="json") for h in healths]}, text)
    return 0 if all(h.verdict == Verdict.HEALTHY for h in healths) else 1


def add_commands(add: Add) -> None:
    """Register `health` with `ops/cli.py`'s `add(name, fn, help)`."""
    p = add("health", cmd_health, "verdict per cluster (healthy, degraded, stuck, churning, head-down...)")
    p.add_argument("--cluster", help="one cluster (default: every cluster, checked at once)")
