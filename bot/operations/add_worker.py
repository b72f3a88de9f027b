"""/add-worker as an operation of the engine: announced in #infra (who adds what and why), no consent,
run under the cluster's lock (so refused while a restart holds it). The work is `ops.workers`'s."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bot.protocol.engine import Engine
from bot.protocol.model import ClusterParams, Look, Operation, Outcome, Progress, Spec, Texts, User
from ops.errors import OpsError
from ops.locks import Lease
from ops.registry import Cluster
from ops.workers import MAX_COUNT, Settings, add_worker, resolve_cluster


class Params(ClusterParams):
    tpu_type: str = Field(description="The TPU type, e.g. v6e-8 (one the cluster's zone offers)")
    capacity: Literal["reserved", "spot", "preemptible", "best-effort"] = Field(
        description="reserved, spot (preemptible is the same) or best-effort"
    )
    count: int = Field(1, ge=1, le=MAX_COUNT, description="How many slices")
    reason: str = Field("", max_length=200, description="Why: shown in the announcement and the ledger")
    for_hours: float | None = Field(None, gt=0, description="Hours you need it; then you are reminded")


def infer_cluster(engine: Engine, tpu_type: str) -> str:
    """The cluster a request without one goes to (its reservation, else the only zone offering the
    type); BadInput names the candidates to pick from. For the chat adapters (and an engine hook)."""
    return resolve_cluster(engine.ctx, tpu_type).name


def _title(op: Operation) -> str:
    p = op.params
    count = f"{p.get('count', 1)} x " if p.get("count", 1) != 1 else ""
    return f"add-worker {count}{p.get('tpu_type')} ({p.get('capacity')}) to {op.cluster}"


def _lines(op: Operation) -> list[str]:
    p = op.params
    lines = [f"why: {p['reason']}" if p.get("reason") else "why: (no reason given)"]
    if p.get("for_hours"):
        lines.append(f"needed for {p['for_hours']:g} h; {op.requester.name} is reminded after that")
    lines.append("no jobs are touched; reserved workers are re-added after every restart")
    return lines


def _failed(op: Operation, held: bool) -> str:
    return f"`python -m ops workers --cluster {op.cluster}` shows what the cloud and Ray have"


TEXTS = Texts(title=_title, lines=_lines, failed=_failed)


def spec(settings: Settings | None = None) -> Spec:
    settings = settings or Settings()

    def look(engine: Engine, cluster: Cluster | None, user: User, params: Params) -> Look:
        """Bad input (the type is not offered in the cluster's zone: the valid ones listed) is answered
        before anything is announced; the types are cached per zone, so this answers at once."""
        assert cluster is not None  # needs_cluster
        resolve_cluster(engine.ctx, params.tpu_type, cluster.name)
        return Look([], [])

    def execute(engine: Engine, op: Operation, lease: Lease | None, progress: Progress) -> Outcome:
        assert op.cluster is not None  # needs_cluster
        params = Params.model_validate(op.params)
        if lease is None:  # the engine could not take the lock back after a bot restart
            raise OpsError(f"{op.op_id} no longer holds the lock on {op.cluster}; nothing more was done")
        result = add_worker(
            engine.ctx, params.tpu_type, params.capacity, by=op.requester.name, chat_id=op.requester.id,
            count=params.count, cluster=op.cluster, reason=params.reason, hours=params.for_hours,
            key=op.op_id,
            progress=progress, lease=lease, settings=settings,
        )  # fmt: skip
        if not result.ok:
            raise OpsError(result.summary())
        return Outcome(result.summary(), [])

    return Spec(
        kind="add-worker",
        ceremony="announce",
        look=look,
        infer_cluster=lambda engine, params: infer_cluster(engine, str(params.get("tpu_type", ""))),
        execute=execute,
        params=Params,
        lease_s=settings.lease_s,
        summary="Add TPU capacity to a cluster: announced in #infra, no consent",
        cluster_help="The cluster (default: the one whose reservation or zone takes the type)",
        texts=TEXTS,
    )
