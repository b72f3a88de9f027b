"""A cluster's status: head, workers by type, jobs by owner, and any operation holding it."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel

from ops.jobs import Job, active_jobs
from ops.locks import current_lock
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.store import Store


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


def _worker_type(node: dict[str, Any]) -> str:
    for res in node.get("resources_total") or {}:
        if res.startswith("TPU-") and res.endswith("-head"):
            return res.removeprefix("TPU-").removesuffix("-head")
    return "cpu"


def cluster_status(cluster: Cluster, store: Store) -> StatusReport:
    api = RayApi(cluster)
    up = api.reachable()
    workers: Counter[str] = Counter()
    dead = 0
    jobs: list[Job] = []
    if up:
        for node in api.nodes():
            if node.get("is_head_node"):
                continue
            if node.get("state") == "ALIVE":
                workers[_worker_type(node)] += 1
            else:
                dead += 1
        jobs = active_jobs(api)
    held = current_lock(store, cluster.name)
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
    )
