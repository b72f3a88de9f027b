"""/rotate-token as an operation of the engine: a new Ray token for one cluster, rolled out by a restart,
so it takes the full ceremony (every owner of a running job is asked). The work is `ops.tokens`' and
`ops.restart`'s; this module only plugs it in. No token ever reaches chat: versions do.
"""

from __future__ import annotations

from dataclasses import replace

from bot.operations.restart import TEXTS as RESTART_TEXTS
from bot.operations.restart import _outside
from bot.protocol.engine import Engine
from bot.protocol.model import ClusterParams, Look, Operation, Outcome, Progress, Spec, Texts, User
from ops.errors import OpsError
from ops.locks import Lease
from ops.registry import Cluster
from ops.render import render_restart
from ops.restart import Settings, Step, find_record, plan_restart, resume_restart
from ops.tokens import report_lines, start_rotation


def _lines(op: Operation) -> list[str]:
    lines = [
        "a new Ray token is added to Secret Manager and the cluster restarts onto it",
        "jobs are backed up and resubmitted after the restart",
    ]
    if op.skip_resubmit:
        left = ", ".join(f"{sid} ({who})" for sid, who in op.skip_resubmit.items())
        lines.append(f"backed up but NOT resubmitted, on their owners' word: {left}")
    lines.append(f"afterwards everyone using it runs `python -m ops token --cluster {op.cluster}`")
    return lines


def _failed(op: Operation, held: bool) -> str:
    if held:
        resume = f"`python -m ops rotate-token --cluster {op.cluster} --resume`"
        return f"the cluster stays locked for a resume: {resume} (backups kept)"
    return f"{op.cluster} is not locked by it any more; its token is unchanged"


TEXTS = Texts(
    title=lambda op: f"rotate the Ray token of {op.cluster}",
    lines=_lines,
    failed=_failed,
    owners=lambda mentions: f"your jobs were resubmitted: {mentions}",
    # Jobs are always backed up by a rotation: their owners may always ask to be left out.
    leave_out=None
    if RESTART_TEXTS.leave_out is None
    else replace(RESTART_TEXTS.leave_out, offered=lambda op: True),
)


def spec(settings: Settings | None = None) -> Spec:
    """The rotation with the restart's `settings` (the CLUSTERBOT_* defaults when None)."""
    settings = settings or Settings()

    def look(engine: Engine, cluster: Cluster | None, user: User, params: ClusterParams) -> Look:
        """As a restart's look (jobs are always preserved); refused when the head cannot be read."""
        assert cluster is not None  # needs_cluster
        if cluster.token_secret is None:
            raise OpsError(f"{cluster.name} has no token secret in the registry: nothing to rotate")
        plan = plan_restart(engine.ctx, cluster, user.name, True, False, settings)
        return Look(plan.jobs, plan.notes)

    def execute(engine: Engine, op: Operation, lease: Lease | None, progress: Progress) -> Outcome:
        """Run the rotation under the lock taken at the announcement; after a bot restart, resume it."""
        assert op.cluster is not None  # needs_cluster
        cluster = engine.registry.get(op.cluster)
        record = find_record(engine.store, cluster.name, op.op_id)
        if record is not None and record.step == Step.DONE:  # finished just before the bot went down
            owners = [x.owner for x in record.resubmitted.values() if x.status == "submitted" and x.owner]
            lines = report_lines(cluster.name, record.token) if record.token else []
            return Outcome("\n".join([f"rotation {op.op_id} had finished", *lines]), owners)
        if record is not None:
            if lease is not None:
                lease.stop_renewing()
            run = resume_restart(
                engine.ctx, cluster, op.requester.name, settings, progress, holder=engine.holder
            )
        else:
            if lease is None:  # the engine could not take the lock back after a bot restart
                raise OpsError(f"{op.op_id} no longer holds the lock on {cluster.name}; nothing was done")
            run = start_rotation(
                engine.ctx, cluster, op.requester.name, settings, progress, lease=lease,
                skip_resubmit=op.skip_resubmit,
            )  # fmt: skip
        result = run.run()
        owners = [x.owner for x in result.resubmitted if x.status == "submitted" and x.owner]
        text = render_restart(result)
        if result.token is not None:
            text += "\n" + "\n".join(report_lines(result.cluster, result.token))
        return Outcome(text, owners)

    return Spec(
        kind="rotate-token",
        ceremony="full",
        look=look,
        execute=execute,
        params=ClusterParams,
        lease_s=settings.lease_s,
        summary="New Ray token for a cluster: it restarts, announced in #infra, with consent",
        cluster_help="The cluster whose token to rotate",
        texts=TEXTS,
        owns_lock=True,  # a failed rotation keeps its lock for `--resume`; a done one released it
        outside=_outside,
    )
