"""The operations the bot runs, each one registration for the engine: its ceremony, how to look
before acting, and its ops call. Later operations (add-worker, build-image, rotate-token) plug in here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bot.protocol.engine import Engine, Look, Outcome, Spec
from bot.protocol.model import Operation, User
from ops.locks import Lease, take_over
from ops.registry import Cluster
from ops.render import render_restart
from ops.restart import Step, find_record, plan_restart, resume_restart, start_restart


def look_restart(engine: Engine, cluster: Cluster, user: User, params: dict[str, Any]) -> Look:
    """Refused (or TokenRefused) when the head does not answer and is not known gone, unless an admin
    forces it: the requester hears why, nothing is announced."""
    force = bool(params.get("force_unbacked"))
    preserve = params.get("preserve_jobs", True)
    plan = plan_restart(engine.ctx, cluster, user.name, preserve, force, engine.restart_settings)
    return Look(plan.jobs, plan.notes, unbacked=plan.unbacked)


def execute_restart(
    engine: Engine, op: Operation, lease: Lease | None, progress: Callable[[str], None]
) -> Outcome:
    """Run the restart under the lock taken at the announcement; after a bot restart, resume it."""
    cluster = engine.registry.get(op.cluster)
    settings = engine.restart_settings
    record = find_record(engine.store, cluster.name, op.op_id)
    if record is not None and record.step == Step.DONE:  # finished just before the bot went down
        owners = [x.owner for x in record.resubmitted.values() if x.status == "submitted" and x.owner]
        return Outcome(f"restart {op.op_id} had finished: {len(owners)} job(s) resubmitted", owners)
    if record is not None:
        if lease is not None:
            lease.stop_renewing()
        run = resume_restart(engine.ctx, cluster, op.requester.name, settings, progress, holder=engine.holder)
    else:
        if lease is None:
            lease = take_over(engine.store, cluster.name, op.op_id, op.requester.name, settings.lease_s,
                              holder=engine.holder)  # fmt: skip
        preserve = bool(op.params.get("preserve_jobs", True))
        run = start_restart(
            engine.ctx, cluster, op.requester.name, preserve, settings, progress, lease=lease,
            force_unbacked=bool(op.params.get("force_unbacked")), skip_resubmit=op.skip_resubmit,
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


SPECS = {
    "restart": Spec(kind="restart", ceremony="full", look=look_restart, execute=execute_restart),
}
