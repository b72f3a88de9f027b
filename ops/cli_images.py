"""The CLI's image commands: `build-image` (Cloud Build, every region, the tag pinned in the store) and
`set-registry-cleanup` (Artifact Registry cleanup policies that spare pinned and running tags).
`ops/cli.py`'s `build_parser` registers them with one call, `add_commands(add)`.

Same conventions as every command there: text or `--json` on stdout, progress on stderr, exit codes
0 done, 1 failed, 2 bad input, 3 refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from ops.images import Settings, build_image, set_registry_cleanup

if TYPE_CHECKING:
    from ops.cli import Out
    from ops.context import Context

REGIONS_HELP = "only these regions (default: every region a GCP cluster is in; local-sim: the local one)"
Add = Callable[[str, Callable[..., int], str], argparse.ArgumentParser]


def regions_of(values: list[str] | None) -> list[str] | None:
    """`--regions a b` and `--regions a,b` alike; None when not given."""
    if not values:
        return None
    return [r for v in values for r in v.replace(",", " ").split()]


def cmd_build_image(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    settings = Settings() if args.timeout is None else Settings(timeout_s=args.timeout)
    result = build_image(ctx, by=args.caller, regions=regions_of(args.regions), progress=out.progress,
                         settings=settings)  # fmt: skip
    out.result(result, result.summary())
    return 0


def cmd_set_registry_cleanup(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    result = set_registry_cleanup(ctx, regions=regions_of(args.regions), dry_run=args.dry_run,
                                  progress=out.progress)  # fmt: skip
    out.result(result, result.summary())
    return 0


def add_commands(add: Add) -> None:
    """Register the image commands with `ops/cli.py`'s `add(name, fn, help)`."""
    p = add(
        "build-image",
        cmd_build_image,
        "build the cluster image with Cloud Build, push it to every region and pin it for the next starts",
    )
    p.add_argument("--regions", nargs="+", help=REGIONS_HELP)
    p.add_argument("--timeout", type=int, help="Cloud Build's timeout for the build, seconds (default 3600)")
    p = add(
        "set-registry-cleanup",
        cmd_set_registry_cleanup,
        "Artifact Registry cleanup: delete after 30 days, keep the newest 16 and every pinned or running tag",
    )
    p.add_argument("--regions", nargs="+", help=REGIONS_HELP)
    p.add_argument(
        "--dry-run", action="store_true", help="Artifact Registry's dry run: it reports, deletes nothing"
    )
