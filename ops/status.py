"""A cluster's status: head, workers by type, jobs by owner, and any operation holding it; and the
readers the health check joins (ops/health.py): Ray's nodes counted by TPU slice, the autoscaler's
report (pending and failed launches, unmet demand), job counts, and the cloud's TPU VMs and queued
resources of the cluster."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from ops.context import Context
from ops.errors import OpsError
from ops.jobs import ACTIVE, Job, active_jobs
from ops.locks import current_lock
from ops.ray_api import HTTP_TIMEOUT_S, PROBE_PREFIX, RayApi, Reach
from ops.registry import Cluster

if TYPE_CHECKING:
    from ops.gcp.tpu import TpuApi

SLICE_LABEL = "ray.io/tpu-slice-name"  # every host of a TPU slice carries it (GCP_API_FACTS.md 2.5)
GONE_VM_STATES = ("PREEMPTED", "TERMINATED")


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


def _worker_type(node: dict[str, Any]) -> str | None:
    """A node's worker type: the slice type on a slice's host 0 (`TPU-<type>-head`), "cpu" on a node
    without TPU, None on the other hosts of a multi-host slice (their slice is counted on host 0)."""
    resources = node.get("resources_total") or {}
    for res in resources:
        if res.startswith("TPU-") and res.endswith("-head"):
            return res.removeprefix("TPU-").removesuffix("-head")
    return None if resources.get("TPU") else "cpu"


# How Ray's state API says a node was ended on purpose (`state_message`, from its death info): the
# autoscaler draining an idle node, or a node stopped as asked. Such a death is scaling, not churn.
ENDED_ON_PURPOSE = ("Terminated due to idle", "Expected termination")


class Death(BaseModel):
    """A worker Ray saw die: when it joined and when it went (the state API's node times), and why
    when Ray says (its `state_message`: "Unexpected termination: ...", "Terminated due to preemption")."""

    worker_type: str
    node_id: str
    started: datetime | None = None
    ended: datetime | None = None
    reason: str | None = None

    @property
    def on_purpose(self) -> bool:
        return (self.reason or "").startswith(ENDED_ON_PURPOSE)


class Workers(BaseModel):
    """Ray's non-head nodes counted as workers: one per TPU slice (by its host 0) or CPU node."""

    alive: dict[str, int] = Field(default_factory=dict)
    deaths: list[Death] = Field(default_factory=list)
    alive_ids: list[str] = Field(default_factory=list)  # Ray node ids and slice names of alive workers
    head_started: datetime | None = None


def _when(ms: Any) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, UTC) if isinstance(ms, int | float) and ms > 0 else None


def count_workers(nodes: list[dict[str, Any]]) -> Workers:
    """Count by slice: a multi-host slice is one worker of its type, never one TPU host plus others."""
    out = Workers()
    alive: Counter[str] = Counter()
    for node in nodes:
        if node.get("is_head_node"):
            if node.get("state") == "ALIVE":
                out.head_started = _when(node.get("start_time_ms"))
            continue
        kind = _worker_type(node)
        if kind is None:
            continue
        node_id = str(node.get("node_id") or "")
        if node.get("state") == "ALIVE":
            alive[kind] += 1
            slice_name = (node.get("labels") or {}).get(SLICE_LABEL)
            out.alive_ids += [node_id] + ([slice_name] if slice_name else [])
        else:
            out.deaths.append(
                Death(
                    worker_type=kind,
                    node_id=node_id,
                    started=_when(node.get("start_time_ms")),
                    ended=_when(node.get("end_time_ms")),
                    reason=node.get("state_message") or None,
                )
            )
    out.alive = dict(alive)
    return out


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
        try:
            counted = count_workers(api.nodes())
            jobs = active_jobs(api)
        except OpsError as e:  # it answered, then did not: what it holds is not known, not none
            up, note, jobs = False, e.reason, []
        else:
            workers.update(counted.alive)
            dead = len(counted.deaths)
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


# -- what the health check reads (each bounded by the caller's timeout) ---------------------------------
class Autoscaler(BaseModel):
    """The autoscaler's last report, as the dashboard gives it."""

    pending_launches: dict[str, int] = Field(default_factory=dict)  # node type -> launches under way
    failed_launches: list[str] = Field(default_factory=list)  # e.g. "tpu-v4-8: ResourceExhausted: ..."
    demand: list[str] = Field(default_factory=list)  # e.g. "{'TPU-v4-8-head': 1} * 1"


def _bundle(b: Any) -> str:
    return "{" + ", ".join(f"'{k}': {v:g}" if isinstance(v, int | float) else f"'{k}': {v}"
                           for k, v in sorted((b or {}).items())) + "}"  # fmt: skip


def parse_cluster_status(data: dict[str, Any]) -> Autoscaler:
    """Ray's v1 structured report (camel-cased by the dashboard), or v2's text (`autoscalingStatus`)."""
    status = data.get("clusterStatus") or {}
    if not status:
        return _parse_status_text(str(data.get("autoscalingStatus") or ""))
    report = status.get("autoscalerReport") or {}
    load = status.get("loadMetricsReport") or {}
    pending = {str(k): int(v) for k, v in (report.get("pendingLaunches") or {}).items() if v}
    for entry in report.get("pendingNodes") or []:  # [ip, node type, status]
        if len(entry) >= 2:
            pending[str(entry[1])] = pending.get(str(entry[1]), 0) + 1
    failed = [f"{entry[1]}: node terminated ({entry[0]})" for entry in report.get("failedNodes") or []
              if len(entry) >= 2]  # fmt: skip
    availability = (report.get("nodeAvailabilitySummary") or {}).get("nodeAvailabilities") or {}
    by_time = sorted(availability.items(), key=lambda kv: kv[1].get("lastCheckedTimestamp") or 0)
    for node_type, record in by_time:
        if record.get("isAvailable", True):
            continue
        info = record.get("unavailableNodeInformation") or {}
        at = _when(float(record.get("lastCheckedTimestamp") or 0) * 1000)
        when = f" at {at:%H:%M:%S} UTC" if at else ""
        line = f"{node_type}: {info.get('category', 'failed')}{when}: {info.get('description', '')}"
        failed.append(line[:300])
    demand = []
    for key in ("resourceDemand", "pgDemand", "requestDemand"):
        for entry in load.get(key) or []:  # [bundle, count] pairs
            if isinstance(entry, list | tuple) and len(entry) == 2:
                asked = " (requested)" if key == "requestDemand" else ""
                demand.append(f"{_bundle(entry[0])} * {entry[1]}{asked}")
    return Autoscaler(pending_launches=pending, failed_launches=failed, demand=demand)


_SECTION = re.compile(r"^(Active|Idle|Pending|Recent failures|Resources|Demands|Total Usage|Total Constraints"
                      r"|Total Demands|Node status|Pending Demands)\s*:?\s*$")  # fmt: skip


def _parse_status_text(text: str) -> Autoscaler:
    """`ray status` text (Ray's v2 autoscaler): the Pending, Recent failures and Demands sections."""
    out = Autoscaler()
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        if not line or line.startswith(("(no ", "-", "=")):
            continue
        if section == "Pending":
            kind = line.split(",")[0].split(":")[-1].strip()
            out.pending_launches[kind] = out.pending_launches.get(kind, 0) + 1
        elif section == "Recent failures":
            out.failed_launches.append(line[:300])
        elif section in ("Demands", "Total Demands", "Pending Demands"):
            out.demand.append(line)
    return out


def read_autoscaler(api: RayApi, timeout: float = HTTP_TIMEOUT_S) -> Autoscaler:
    return parse_cluster_status(api.cluster_status(timeout))


def read_workers(api: RayApi, timeout: float = HTTP_TIMEOUT_S) -> Workers:
    return count_workers(api.nodes(timeout))


def read_job_counts(api: RayApi, timeout: float = HTTP_TIMEOUT_S) -> dict[str, int]:
    """Running and pending jobs (readiness probes left out), by status."""
    counts: Counter[str] = Counter()
    for job in api.job_details(timeout):
        sid = job.get("submission_id") or job.get("job_id") or ""
        if job.get("status") in ACTIVE and not str(sid).startswith(PROBE_PREFIX):
            counts[job["status"]] += 1
    return dict(counts)


class Cloud(BaseModel):
    """The cluster's TPU VMs and queued resources as the cloud lists them (Ray's label or ours)."""

    vms: dict[str, int] = Field(default_factory=dict)  # state -> count
    gone: dict[str, str] = Field(default_factory=dict)  # PREEMPTED / TERMINATED VM id -> state
    gone_ray_ids: dict[str, str] = Field(default_factory=dict)  # such a VM's id -> the Ray node id it had
    queued: dict[str, int] = Field(default_factory=dict)  # state -> count


def read_cloud(api: TpuApi, cluster: Cluster) -> Cloud:
    """Two listings of the cluster's zone (every page), filtered by the cluster's labels."""
    from ops.clean import owner_of

    out = Cloud()
    vms: Counter[str] = Counter()
    for node in api.list_nodes(cluster.zone):
        if owner_of(node.labels, cluster) is None:
            continue
        vms[node.state] += 1
        if node.state in GONE_VM_STATES:
            out.gone[node.node_id] = node.state
            if node.labels.get("ray-node-id"):
                out.gone_ray_ids[node.node_id] = node.labels["ray-node-id"]
    queued: Counter[str] = Counter()
    for qr in api.list_queued_resources(cluster.zone):
        if owner_of(qr.labels, cluster) is not None:
            queued[qr.state] += 1
    out.vms, out.queued = dict(vms), dict(queued)
    return out
