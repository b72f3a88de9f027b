"""The CLI's token commands: `token` (this machine's copy of a cluster's Ray token, where Ray's CLI reads
it, or `--stdout` for scripts) and `rotate-token` (a new version, rolled out by a restart: ops/tokens.py).
`ops/cli.py`'s `build_parser` registers them with one call, `add_commands(add)`.

Same conventions as every command there: text or `--json` on stdout, progress on stderr, exit codes
0 done, 1 failed, 2 bad input, 3 refused. No token is ever printed, except by `token --stdout`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ops.errors import BadInput, OpsError, Refused
from ops.tokens import save_copy, start_rotation

if TYPE_CHECKING:
    from ops.cli import Out
    from ops.context import Context

Add = Callable[[str, Callable[..., int], str], argparse.ArgumentParser]


def cmd_token(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    cluster = ctx.cluster(args.cluster)
    if args.stdout:
        if args.json:
            raise BadInput("give --stdout or --json, not both")
        save_copy(ctx, cluster, to_stdout=lambda value: print(value, flush=True))
        return 0
    copy = save_copy(ctx, cluster)
    text = (
        f"wrote the {cluster.name} Ray token (secret {copy.secret} version {copy.version}) to {copy.path}\n"
        f"Ray's CLI reads it with RAY_AUTH_MODE=token (and RAY_AUTH_TOKEN_PATH={copy.path} if that is not "
        "~/.ray/auth_token)"
    )
    out.result(copy, text)
    return 0


def cmd_rotate_token(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    from ops import restart
    from ops.cli import _finish, _require_confirmation
    from ops.gcs_reader import adopt_cluster_auth
    from ops.render import render_plan

    cluster = ctx.cluster(args.cluster)
    restart.check_protected(cluster, args.override_protected)
    if cluster.gcs_address is not None:  # as `restart`: this process reads this one cluster's GCS
        try:
            adopt_cluster_auth(ctx.token(cluster))
        except OpsError:  # not readable now (the local cloud is down): the restart's own reads say so
            pass
    if args.resume:
        run = restart.resume_restart(ctx, cluster, args.caller, progress=out.progress)
        return _finish(run.run(), out)
    plan = restart.plan_restart(ctx, cluster, args.caller, True)
    if not out.as_json:
        print(render_plan(plan), file=sys.stderr)
    if plan.others_jobs and not args.yes:
        raise Refused(
            f"{plan.others_jobs} job(s) of other users would be stopped and resubmitted "
            f"({', '.join(plan.affected_owners)})",
            "ask them in #infra first, then pass --yes",
        )
    _require_confirmation(args.yes, f"rotate the Ray token of {cluster.name} (this restarts it) now?")
    run = start_rotation(ctx, cluster, args.caller, progress=out.progress)
    out.progress(f"operation {run.record.op_id} (journal in {ctx.store.url}/{run.record.scope})")
    return _finish(run.run(), out)


def add_commands(add: Add) -> None:
    """Register the token commands with `ops/cli.py`'s `add(name, fn, help)`."""
    p = add("token", cmd_token, "write a cluster's Ray token where Ray's CLI reads it (from Secret Manager)")
    p.add_argument("--cluster", required=True)
    p.add_argument("--stdout", action="store_true", help="print the token instead (for scripts)")
    p = add("rotate-token", cmd_rotate_token, "new Ray token for a cluster, rolled out by a restart")
    p.add_argument("--cluster", required=True)
    p.add_argument("--yes", action="store_true", help="do not ask; needed when others' jobs run")
    p.add_argument("--resume", action="store_true", help="continue a rotation whose process died")
    p.add_argument("--override-protected", action="store_true", help="admins: act on a protected cluster")
