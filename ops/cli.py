"""`python -m ops ...`: the operators' runbook commands, without the bot.

Each command calls the library, gets a typed result, and renders it as text or, with `--json`, as
one JSON document on stdout. Progress goes to stderr. Exit codes: 0 done, 1 the operation failed,
2 bad input, 3 refused (ops.errors.ExitCode).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import BaseModel

from ops.cli_health import add_commands as add_health_commands
from ops.cli_images import add_commands as add_image_commands
from ops.cli_tokens import add_commands as add_token_commands
from ops.cli_workers import add_commands as add_worker_commands
from ops.context import Context
from ops.errors import BadInput, ExitCode, OpsError, Refused
from ops.gcs_reader import adopt_cluster_auth
from ops.jobs import active_jobs, submit_job
from ops.local import boot, local_cluster
from ops.locks import holding, unlock
from ops.render import render_jobs, render_plan, render_restart, render_status
from ops.status import cluster_status

if TYPE_CHECKING:
    from ops.restart import RestartResult


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one plain line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{self.prog}: {message}")


class Out:
    """Where a command writes: text or one JSON document on stdout, progress on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def progress(self, line: str) -> None:
        print(f"… {line}", file=sys.stderr, flush=True)

    def result(self, model: BaseModel | dict[str, Any], text: str) -> None:
        if self.as_json:
            data = model.model_dump(mode="json") if isinstance(model, BaseModel) else model
            print(json.dumps(data, indent=1, default=str))
        else:
            print(text)


# -- rendering -------------------------------------------------------------------------------------
# -- commands ---------------------------------------------------------------------------------------
class ClusterRow(BaseModel):
    name: str
    ray_cluster_name: str
    region: str
    zone: str
    tpu: str
    workers: str
    protected: bool
    dashboard_url: str


def cmd_clusters(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    rows = [
        ClusterRow(
            name=c.name,
            ray_cluster_name=c.ray_cluster_name,
            region=c.region,
            zone=c.zone,
            tpu=c.worker_tpu_type,
            workers=f"{c.min_workers}-{c.max_workers}",
            protected=c.protected,
            dashboard_url=c.dashboard_url,
        )
        for c in ctx.registry.clusters.values()
    ]
    lines = [f"{'NAME':12} {'RAY CLUSTER':18} {'ZONE':15} {'TPU':12} {'WORKERS':8} NOTE"]
    for r in rows:
        note = "protected" if r.protected else ""
        lines.append(f"{r.name:12} {r.ray_cluster_name:18} {r.zone:15} {r.tpu:12} {r.workers:8} {note}")
    out.result({"clusters": [r.model_dump() for r in rows]}, "\n".join(lines))
    return 0


def cmd_jobs(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    cluster = ctx.cluster(args.cluster)
    jobs = active_jobs(ctx.ray(cluster))
    out.result({"cluster": cluster.name, "jobs": [j.model_dump() for j in jobs]}, render_jobs(jobs))
    return 0


def cmd_status(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    names = [args.cluster] if args.cluster else list(ctx.registry.clusters)
    reports = [cluster_status(ctx, ctx.cluster(n)) for n in names]
    if len(reports) == 1:
        out.result(reports[0], render_status(reports[0]))
    else:
        out.result({"clusters": [r.model_dump(mode="json") for r in reports]},
                   "\n\n".join(render_status(r) for r in reports))  # fmt: skip
    return 0


class Submitted(BaseModel):
    cluster: str
    submission_id: str
    owner: str


def cmd_submit(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    cluster = ctx.cluster(args.cluster)
    words = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not words:
        raise BadInput(
            "submit needs an entrypoint after --", "e.g. ops submit --cluster local -- python x.py"
        )
    options: dict[str, Any] = {}
    if args.submission_id:
        options["submission_id"] = args.submission_id
    if args.working_dir:
        options["runtime_env"] = {"working_dir": args.working_dir}
    if args.num_cpus is not None:
        options["entrypoint_num_cpus"] = args.num_cpus
    if args.resources:
        try:
            options["entrypoint_resources"] = {k: float(v) for k, v in json.loads(args.resources).items()}
        except (ValueError, AttributeError):
            raise BadInput("--resources must be a JSON object of numbers", 'e.g. {"TPU": 4}') from None
    sid = submit_job(ctx, cluster, words, args.caller, **options)  # the words as the shell gave them
    out.result(Submitted(cluster=cluster.name, submission_id=sid, owner=args.caller),
               f"submitted {sid} on {cluster.name} as {args.caller}")  # fmt: skip
    return 0


def cmd_update_configs(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    from ops.configs import update_configs
    from ops.registry import registry_path

    result = update_configs(ctx.registry, check=args.check, infra_dir=registry_path().parent)
    out.result(result, result.summary())
    return 0 if result.ok else 1


def cmd_local(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    cluster = local_cluster(ctx, args.cluster)
    driver = ctx.driver(cluster)
    if args.action == "up":
        text = boot(ctx, cluster, out.progress)
    elif args.action == "down":
        text = driver.stop()
    else:
        up = driver.is_up()
        text = f"{cluster.name}: {'up, dashboard at ' + cluster.dashboard_url if up else 'down'}"
    out.result({"cluster": cluster.name, "up": driver.is_up(), "message": text}, text)
    return 0


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _require_confirmation(yes: bool, question: str) -> None:
    """Go on with --yes, or when a person at a terminal says yes; refuse otherwise."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise Refused("not a terminal, so nobody can confirm", "pass --yes to go on anyway")
    if not _confirm(question):
        raise Refused("not confirmed; nothing was done")


def cmd_restart(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    from ops import restart

    cluster = ctx.cluster(args.cluster)
    store = ctx.store
    restart.check_protected(cluster, args.override_protected)
    if cluster.gcs_address is not None:  # this process works on this one cluster: read its GCS in-process
        try:
            adopt_cluster_auth(ctx.token(cluster))
        except OpsError:  # not readable now (the local cloud is down): the restart's own reads say so
            pass
    if args.resume and args.abandon:
        raise BadInput("give --resume or --abandon, not both")
    if args.abandon:
        done = restart.abandon_restart(ctx, cluster, args.caller, restart.Settings().lease_s)
        left = f"; not resubmitted: {', '.join(done.not_resubmitted)}" if done.not_resubmitted else ""
        text = f"abandoned {done.op_id} at step {done.step.value}; backups kept in {done.backups}{left}"
        out.result(done, text)
        return 0
    if args.resume:
        run = restart.resume_restart(ctx, cluster, args.caller, progress=out.progress)
        return _finish(run.run(), out)

    preserve = args.preserve_jobs == "1"
    plan = restart.plan_restart(ctx, cluster, args.caller, preserve, force_unbacked=args.force_unbacked)
    if args.dry_run:
        out.result(
            {"dry_run": True, "plan": plan.model_dump(mode="json")},
            render_plan(plan) + "\n(dry run: nothing done)",
        )
        return 0
    if not out.as_json:
        print(render_plan(plan), file=sys.stderr)
    if plan.others_jobs and not args.yes:
        raise Refused(
            f"{plan.others_jobs} job(s) of other users would be stopped ({', '.join(plan.affected_owners)})",
            "ask them in #infra first, then pass --yes",
        )
    _require_confirmation(args.yes, f"restart {cluster.name} now?")
    run = restart.start_restart(
        ctx, cluster, args.caller, preserve, progress=out.progress, force_unbacked=args.force_unbacked
    )
    out.progress(f"operation {run.record.op_id} (journal in {store.url}/{run.record.scope})")
    return _finish(run.run(), out)


def _finish(result: RestartResult, out: Out) -> int:
    """Exit 0 only for a restart that is done with every job resubmitted; 1 leaves it to --resume."""
    from ops.restart import Step

    text = render_restart(result)
    if result.token is not None:  # a rotation: which version is live, and what users must do
        from ops.tokens import report_lines

        text += "\n" + "\n".join(report_lines(result.cluster, result.token))
    out.result(result, text)
    done = result.step == Step.DONE
    return 0 if done and all(x.status == "submitted" for x in result.resubmitted) else 1


class Unlocked(BaseModel):
    cluster: str
    op_id: str
    was: str  # what held the lock
    record_step: str | None  # the restart record left behind, if any (kept with its backups)


def cmd_unlock(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    from ops.restart import find_record

    cluster = ctx.cluster(args.cluster)
    store = ctx.store
    held = holding(store, cluster.name, args.op)  # refuses a free lock or another op's id, before asking
    _require_confirmation(args.yes, f"unlock {cluster.name}, held by {held.describe()}?")
    held = unlock(store, cluster.name, args.op, by=args.caller)
    record = find_record(store, cluster.name, args.op)
    step = record.step.value if record else None
    text = f"unlocked {cluster.name} (was: {held.describe()})"
    if record is not None and step not in ("done", "abandoned"):
        text += f"\nits restart record stays at step {step}, backups kept in {store.url}/{record.scope}/jobs/"
    out.result(Unlocked(cluster=cluster.name, op_id=args.op, was=held.describe(), record_step=step), text)
    return 0


def cmd_prune(ctx: Context, args: argparse.Namespace, out: Out) -> int:
    from ops.prune import prune, retention_days

    result = prune(ctx.store, retention_days(args.retention_days), dry_run=args.dry_run)
    out.result(result, result.summary())
    return 0


# -- parser ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="one JSON document on stdout")
    common.add_argument("--as", dest="caller", default=None, help="who is acting (default: login name)")
    common.add_argument("--debug", action="store_true", help="tracebacks for unexpected errors")

    parser = _Parser(prog="ops", description="clusterbot ops: the shared Ray clusters from the terminal")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, fn: Callable[..., int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help)
        p.set_defaults(fn=fn)
        return p

    add("clusters", cmd_clusters, "the registry at a glance")
    p = add("status", cmd_status, "head, workers, jobs by owner, operation in progress")
    p.add_argument("--cluster")
    p = add("jobs", cmd_jobs, "running and pending jobs with owners")
    p.add_argument("--cluster", required=True)
    p = add("submit", cmd_submit, "submit a job with its owner in metadata")
    p.add_argument("--cluster", required=True)
    p.add_argument("--submission-id")
    p.add_argument("--working-dir")
    p.add_argument("--num-cpus", type=float)
    p.add_argument("--resources", help='entrypoint resources as JSON, e.g. {"TPU": 4}')
    p.add_argument("entrypoint", nargs=argparse.REMAINDER)
    p = add("restart", cmd_restart, "restart a cluster, preserving its jobs")
    p.add_argument("--cluster", required=True)
    p.add_argument("--preserve-jobs", choices=["1", "0"], default="1")
    p.add_argument("--yes", action="store_true", help="do not ask; needed when others' jobs run")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--resume", action="store_true", help="continue a restart whose process died")
    p.add_argument("--abandon", action="store_true", help="give up an unfinished restart (backups kept)")
    p.add_argument("--override-protected", action="store_true", help="admins: act on a protected cluster")
    p.add_argument("--force-unbacked", action="store_true",
                   help="admins: restart even when the head does not answer and cannot be shown dead; "
                        "its jobs are NOT backed up")  # fmt: skip
    p = add("unlock", cmd_unlock, "clear a cluster's lock, whatever holds it (give the op id holding it)")
    p.add_argument("--cluster", required=True)
    p.add_argument("--op", required=True, help="the operation holding the lock (see ops status)")
    p.add_argument("--yes", action="store_true", help="do not ask")
    add_worker_commands(add)  # add-worker, workers, clean-preempted (ops/cli_workers.py)
    add_health_commands(add)  # health (ops/cli_health.py)
    add_token_commands(add)  # token, rotate-token (ops/cli_tokens.py)
    add_image_commands(add)  # build-image, set-registry-cleanup (ops/cli_images.py)
    p = add("prune", cmd_prune, "delete backups and journals of operations finished long ago")
    p.add_argument("--retention-days", type=float, help="default: CLUSTERBOT_RETENTION_DAYS, else 30")
    p.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    p = add("update-configs", cmd_update_configs, "render infra/<cluster>.yaml from the template")
    p.add_argument("--check", action="store_true", help="fail (exit 1) when a committed file differs")
    p = add("local", cmd_local, "the local Ray cluster on this machine")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--cluster", default="local")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv
    debug = "--debug" in argv or bool(os.environ.get("CLUSTERBOT_DEBUG"))
    try:
        args = build_parser().parse_args(argv)
        args.caller = args.caller or getpass.getuser()
        ctx = Context()
        try:
            return args.fn(ctx, args, Out(args.json))
        finally:
            ctx.close()
    except OpsError as e:
        return _fail(e, as_json)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.FAILED
    except Exception as e:  # unexpected: a short line, the traceback only when asked
        if debug:
            traceback.print_exc()
        return _fail(OpsError(f"unexpected error: {type(e).__name__}: {e}", "rerun with --debug"), as_json)


def _fail(e: OpsError, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"error": e.reason, "hint": e.hint, "exit_code": int(e.code)}))
    print(f"error: {e}", file=sys.stderr)
    return int(e.code)
