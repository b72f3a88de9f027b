"""/clean-preempted as an operation of the engine: delete the cluster's PREEMPTED / TERMINATED TPU VMs
(they hold quota). Announced, no consent, run under the cluster's lock. The work is `ops.clean`'s."""

from __future__ import annotations

from pydantic import Field

from bot.protocol.engine import Engine
from bot.protocol.model import ClusterParams, Look, Operation, Outcome, Progress, Spec, Texts, User
from ops.clean import clean_preempted, find_dead
from ops.errors import OpsError
from ops.locks import Lease
from ops.registry import Cluster
from ops.workers import Settings


class Params(ClusterParams):
    dry_run: bool = Field(False, description="List them, delete nothing")


def _title(op: Operation) -> str:
    return f"clean-preempted {op.cluster}" + (" (dry run)" if op.params.get("dry_run") else "")


def _lines(op: Operation) -> list[str]:
    return ["no jobs are touched: only TPU VMs that serve nobody (PREEMPTED, TERMINATED) go"]


def _failed(op: Operation, held: bool) -> str:
    return (
        f"run it again (what is gone counts as done), or see `python -m ops workers --cluster {op.cluster}`"
    )


TEXTS = Texts(title=_title, lines=_lines, failed=_failed)


def spec(settings: Settings | None = None) -> Spec:
    settings = settings or Settings()

    def look(engine: Engine, cluster: Cluster | None, user: User, params: Params) -> Look:
        assert cluster is not None  # needs_cluster
        dead = find_dead(engine.ctx, cluster)
        return Look(
            [], [f"{len(dead)} preempted or terminated TPU VM(s) / queued resource(s) in {cluster.zone}"]
        )

    def execute(engine: Engine, op: Operation, lease: Lease | None, progress: Progress) -> Outcome:
        assert op.cluster is not None  # needs_cluster
        params = Params.model_validate(op.params)
        if lease is None:  # the engine could not take the lock back after a bot restart
            raise OpsError(f"{op.op_id} no longer holds the lock on {op.cluster}; nothing more was done")
        result = clean_preempted(engine.ctx, op.cluster, by=op.requester.name, dry_run=params.dry_run,
                                 progress=progress, lease=lease)  # fmt: skip
        if not result.ok:
            raise OpsError(result.summary())
        return Outcome(result.summary(), [])

    return Spec(
        kind="clean-preempted",
        ceremony="announce",
        look=look,
        execute=execute,
        params=Params,
        lease_s=settings.lease_s,
        summary="Delete a cluster's preempted / terminated TPU VMs: announced in #infra",
        cluster_help="The cluster to clean",
        texts=TEXTS,
    )
