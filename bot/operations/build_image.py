"""/build-image as an operation of the engine: the cluster image through Cloud Build, pushed to every
region's Artifact Registry and pinned for the clusters' next starts. Announced, no consent, no cluster
(so no lock): it restarts nothing. Progress (the build's states) edits the announcement; a failed build
reports the log's tail. The work is `ops.images`'.
"""

from __future__ import annotations

from pydantic import Field

from bot.protocol.engine import Engine
from bot.protocol.model import Button, Look, Operation, Outcome, Params, Progress, Spec, Texts, User
from ops.images import Settings, build_image, targets
from ops.locks import Lease
from ops.registry import Cluster


class BuildParams(Params):
    regions: str = Field(
        "", description="Only these regions, comma-separated (default: every region a GCP cluster is in)"
    )

    def region_list(self) -> list[str] | None:
        return [r for r in self.regions.replace(",", " ").split()] or None


def _lines(op: Operation) -> list[str]:
    return ["restarts nothing: each cluster of these regions takes the new image at its next restart"]


def _failed(op: Operation, held: bool) -> str:
    return "nothing was pinned: every cluster keeps starting with the image it had"


TEXTS = Texts(lines=_lines, failed=_failed)


def spec(settings: Settings | None = None) -> Spec:
    settings = settings or Settings()

    def look(engine: Engine, cluster: Cluster | None, user: User, params: BuildParams) -> Look:
        chosen = targets(engine.registry, params.region_list())  # BadInput names the valid regions
        where = ", ".join(f"{t.region} ({', '.join(t.clusters)})" for t in chosen)
        return Look([], [f"{settings.dockerfile or engine.registry.dockerfile} for {where}"])

    def execute(engine: Engine, op: Operation, lease: Lease | None, progress: Progress) -> Outcome:
        params = BuildParams.model_validate(op.params)
        result = build_image(engine.ctx, by=op.requester.name, regions=params.region_list(), op=op.op_id,
                             progress=progress, settings=settings)  # fmt: skip
        restart = [Button("restart", f"Restart {c}", "danger", arg=c) for c in result.to_restart]
        return Outcome(result.summary(), [], buttons=restart)  # each restart asks its owners as always

    return Spec(
        kind="build-image",
        ceremony="announce",
        look=look,
        execute=execute,
        params=BuildParams,
        needs_cluster=False,
        lease_s=60.0,
        summary="Build the cluster image, push it to every region and pin it for the next starts",
        texts=TEXTS,
    )
