"""A cluster's status: head, workers by type, jobs by owner, and any operation holding it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

from ops.context import Context
from ops.errors import OpsError
from ops.jobs import Job, active_jobs
from ops.locks import current_lock
from ops.ray_api import Reach
from ops.registry import Cluster


class StatusReport(BaseModel):
    cluster: str
    head_up: bool
    workers: dict[str, int]  # alive workers by type
    dead_workers: int
    min_workers: int
    max_workers: int
    jobs: list[Job]
    jobs_by_owner: dict[str, int]
    operation: str | None
    note: str | None = None  # why the head could not be read, when it could not


def _worker_type(node: dict[str, Any]) -> str:
    for res in node.get("resources_total") or {}:
        if res.startswith("TPU-") and res.endswith("-head"):
            return res.removeprefix("TPU-").removesuffix("-head")
    return "cpu"


def cluster_status(ctx: Context, cluster: Cluster) -> StatusReport:
    """What a person asks first; read-only, so a head that cannot be read is reported, never raised."""
    workers: Counter[str] = Counter()
    dead = 0
    jobs: list[Job] = []
    note = None
    try:
        api = ctx.ray(cluster)
        reach, code = api.probe()
    except OpsError as e:
        reach, code, note = Reach.UNREACHABLE, None, e.reason
    up = reach == Reach.OK
    if reach == Reach.REFUSED:
        note = api.token_refused(code or 401).reason
    if up:
        for node in api.nodes():
            if node.get("is_head_node"):
                continue
            if node.get("state") == "ALIVE":
                workers[_worker_type(node)] += 1
            else:
                dead += 1
        jobs = active_jobs(api)
    held = current_lock(ctx.store, cluster.name)
    return StatusReport(
        cluster=cluster.name,
        head_up=up,
        workers=dict(workers),
        dead_workers=dead,
        min_workers=cluster.min_workers,
        max_workers=cluster.max_workers,
        jobs=jobs,
        jobs_by_owner=dict(Counter(j.owner_label for j in jobs)),
        operation=held.describe() if held else None,  # it says whether its process stopped
        note=note,
    )
