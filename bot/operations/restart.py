"""/restart as an operation of the engine: its parameters, full ceremony, lease, look, execution, and how
its announcement, result and failure read. The work is `ops.restart`'s; this module only plugs it in."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from bot.protocol.engine import Engine
from bot.protocol.model import (
    AdminOnly,
    ClusterParams,
    LeaveOut,
    Look,
    Operation,
    Outcome,
    Outside,
    Progress,
    Spec,
    Texts,
    User,
)
from ops.errors import OpsError
from ops.locks import Lease
from ops.registry import Cluster
from ops.render import render_restart
from ops.restart import Settings, Step, find_record, plan_restart, resume_restart, start_restart
from ops.store import Store


class Params(ClusterParams):
    preserve_jobs: bool = Field(
        True, description="Back up running and pending jobs and resubmit them after the restart"
    )
    force_unbacked: Annotated[
        bool, AdminOnly("force_unbacked (restart without a backup when the head does not answer)")
    ] = Field(
        False, description="Admins only: restart even if the head does not answer: jobs are NOT backed up"
    )


def _lines(op: Operation) -> list[str]:
    """What happens to the jobs, as the announcement says it."""
    if op.unbacked:
        return [f"jobs are NOT backed up: the head does not answer and admin {op.requester.name} forced it"]
    if not op.params.get("preserve_jobs", True):
        return ["jobs are stopped and NOT resubmitted (preserve_jobs off)"]
    lines = ["jobs are backed up and resubmitted after the restart"]
    if op.skip_resubmit:
        left = ", ".join(f"{sid} ({who})" for sid, who in op.skip_resubmit.items())
        lines.append(f"backed up but NOT resubmitted, on their owners' word: {left}")
    return lines


def _failed(op: Operation, held: bool) -> str:
    if held:
        resume = f"`python -m ops restart --cluster {op.cluster} --resume`"
        return f"the cluster stays locked for a resume: {resume} (or --abandon; backups kept)"
    return f"{op.cluster} is not locked by it any more"  # refused before touching anything


TEXTS = Texts(
    title=lambda op: f"restart {op.cluster}",
    lines=_lines,
    failed=_failed,
    owners=lambda mentions: f"your jobs were resubmitted: {mentions}",
    leave_out=LeaveOut(
        label="Don't resubmit mine",
        answer="OK, don't resubmit",
        reply="OK counted; your {jobs} will be backed up but not resubmitted: "
        "resubmit yourself if you need to",
        again="already counted: OK, your jobs will not be resubmitted",
        offered=lambda op: bool(op.params.get("preserve_jobs", True)) and not op.unbacked,
    ),
)


def _outside(store: Store, cluster: str, op_id: str) -> Outside | None:
    """A restart run from the CLI, from its record."""
    record = find_record(store, cluster, op_id)
    if record is None:
        return Outside(step="starting")
    ended = {Step.DONE: "done", Step.ABANDONED: "abandoned"}.get(record.step)
    return Outside(step=record.step.value, error=record.error, ended=ended)


def spec(settings: Settings | None = None) -> Spec:
    """The restart with `settings` (the CLUSTERBOT_* defaults when None): its timings and lease."""
    settings = settings or Settings()

    def look(engine: Engine, cluster: Cluster | None, user: User, params: Params) -> Look:
        """Refused (or TokenRefused) when the head does not answer and is not known gone, unless an
        admin forces it: the requester hears why, nothing is announced."""
        assert cluster is not None  # needs_cluster
        plan = plan_restart(
            engine.ctx, cluster, user.name, params.preserve_jobs, params.force_unbacked, settings
        )
        return Look(plan.jobs, plan.notes, unbacked=plan.unbacked)

    def execute(engine: Engine, op: Operation, lease: Lease | None, progress: Progress) -> Outcome:
        """Run the restart under the lock taken at the announcement; after a bot restart, resume it."""
        assert op.cluster is not None  # needs_cluster
        cluster = engine.registry.get(op.cluster)
        params = Params.model_validate(op.params)
        record = find_record(engine.store, cluster.name, op.op_id)
        if record is not None and record.step == Step.DONE:  # finished just before the bot went down
            owners = [x.owner for x in record.resubmitted.values() if x.status == "submitted" and x.owner]
            return Outcome(f"restart {op.op_id} had finished: {len(owners)} job(s) resubmitted", owners)
        if record is not None:
            if lease is not None:
                lease.stop_renewing()
            run = resume_restart(
                engine.ctx, cluster, op.requester.name, settings, progress, holder=engine.holder
            )
        else:
            if lease is None:  # the engine could not take the lock back after a bot restart
                raise OpsError(f"{op.op_id} no longer holds the lock on {cluster.name}; nothing was done")
            run = start_restart(
                engine.ctx, cluster, op.requester.name, params.preserve_jobs, settings, progress, lease=lease,
                force_unbacked=params.force_unbacked, skip_resubmit=op.skip_resubmit,
            )  # fmt: skip
        result = run.run()
        owners = [x.owner for x in result.resubmitted if x.status == "submitted" and x.owner]
        text = render_restart(result)
        later = [x for x in result.resubmitted if x.old_id not in op.job_ids]
        if later:  # the backup is taken at execution: jobs submitted after the announcement are in it
            text += "\nsubmitted after the announcement, preserved too: " + ", ".join(
                f"{x.old_id} ({x.owner or 'owner unknown'})" for x in later
            )
        return Outcome(text, owners)

    return Spec(
        kind="restart",
        ceremony="full",
        look=look,
        execute=execute,
        params=Params,
        lease_s=settings.lease_s,
        summary="Restart a cluster: announced in #infra, with consent",
        cluster_help="The cluster to restart",
        texts=TEXTS,
        owns_lock=True,  # a failed restart keeps its lock for `--resume`; a done one released it
        outside=_outside,
    )
