"""TPU workers added by hand (reserved, spot or best-effort capacity outside Ray's autoscaler):
add-worker, the ledger of who added which worker and why, the workers view (the ledger beside what the
cloud and Ray see), the workers due to be reported to whoever added them, and their re-adding after a
restart.

The ledger is one record per queued resource in the store, `workers/<cluster>/<qr id>.json`. Ids are
deterministic (`ops.gcp.tpu.queued_resource_id` of the request and the worker's index), so a retried
request, or a restart re-adding the ledger's workers, creates nothing twice.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from ops.errors import BadInput, OpsError
from ops.gcp.tpu import (
    LABEL_CAPACITY,
    LABEL_CLUSTER,
    LABEL_OWNER,
    LABEL_REQUEST,
    Capacity,
    CapacityError,
    NodeInfo,
    QueuedResourceInfo,
    label_value,
    queued_resource_id,
)
from ops.locks import acquire
from ops.registry import REPO_ROOT, Cluster, Registry
from ops.store import dump, read_model
from ops.tpu_types import parse_tpu_type

if TYPE_CHECKING:
    from ops.context import Context
    from ops.gcp.tpu import TpuApi
    from ops.locks import Lease
    from ops.ray_api import RayApi

Progress = Callable[[str], None]
STARTUP_TEMPLATE = REPO_ROOT / "infra" / "worker-startup.sh"
GONE_STATES = ("PREEMPTED", "TERMINATED")  # a VM in these states serves nobody and still holds quota
MAX_COUNT = 16
LABEL_ATTEMPT = "clusterbot-attempt"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Settings(BaseModel):
    """Timings of add-worker; tests shorten them (fields, or the CLUSTERBOT_* variables)."""

    timeout_s: float = Field(default_factory=lambda: _env_float("CLUSTERBOT_ADD_WORKER_TIMEOUT_S", 1800))
    lease_s: float = Field(default_factory=lambda: _env_float("CLUSTERBOT_LEASE_S", 60))
    idle_h: float = Field(default_factory=lambda: _env_float("CLUSTERBOT_WORKER_IDLE_H", 2))


def _nothing(line: str) -> None:
    pass


# -- the ledger ---------------------------------------------------------------------------------------
class WorkerRecord(BaseModel):
    """One worker in the ledger: who added it, when, why, until when, and what it is in the cloud."""

    cluster: str
    qr_id: str
    qr_name: str  # projects/P/locations/Z/queuedResources/ID
    zone: str
    accelerator_type: str
    capacity: str  # reserved | spot | best-effort
    added_by: str
    added_by_chat: str | None = None  # the chat id of who added it, when added from chat: they are told
    reason: str = ""
    added_at: datetime
    until: datetime | None = None  # --for: reported to added_by after this; never deleted by itself
    request_key: str
    index: int = 0
    state: Literal["requested", "ready", "failed"] = "requested"
    error: str | None = None
    # Asked again after it went: part of the request (id) sent, since Cloud TPU deduplicates a create
    # by request id and would answer a re-create after a delete with the first, finished, operation.
    attempt: int = 1
    busy_at: datetime | None = None  # the last check that found a task or an actor on its Ray nodes


def _key(cluster: str, qr_id: str) -> str:
    return f"workers/{cluster}/{qr_id}.json"


def ledger(ctx: Context, cluster: str) -> list[WorkerRecord]:
    """The cluster's ledger, oldest first."""
    out = []
    for key in ctx.store.list(f"workers/{cluster}/"):
        if key.endswith(".json"):
            got = read_model(ctx.store, key, WorkerRecord)
            if got is not None:
                out.append(got[0])
    return sorted(out, key=lambda r: (r.added_at, r.qr_id))


def _write(ctx: Context, record: WorkerRecord) -> None:
    ctx.store.put(_key(record.cluster, record.qr_id), dump(record))


# -- which cluster, which type ------------------------------------------------------------------------
def resolve_cluster(ctx: Context, tpu_type: str, cluster_name: str | None = None) -> Cluster:
    """The cluster to add `tpu_type` to: the one given, else the one whose reservation names the type,
    else the only (unprotected) cluster whose zone offers it. BadInput lists the valid types of the
    given cluster's zone, or the candidates when several clusters could take it."""
    try:
        wanted = parse_tpu_type(tpu_type)
    except ValueError as e:
        raise BadInput(str(e)) from None
    if cluster_name:
        cluster = ctx.cluster(cluster_name)
        ctx.tpu(cluster).check_type(cluster.zone, wanted.name)
        return cluster
    clusters = [c for c in ctx.registry.clusters.values() if not c.protected]
    reserved = [c for c in clusters if wanted.name in c.reservations]
    if len(reserved) == 1:
        return reserved[0]
    pool = reserved or [c for c in clusters if c.tpu_generation == wanted.generation]
    offered = [c for c in pool if wanted.name in _types(ctx, c)]  # cached per zone: chat answers at once
    if len(offered) == 1:
        return offered[0]
    if not offered:
        raise BadInput(
            f"no cluster's zone offers {wanted.name}",
            f"give --cluster; clusters: {', '.join(ctx.registry.clusters)}",
        )
    raise BadInput(
        f"{len(offered)} clusters could take {wanted.name}: {', '.join(c.name for c in offered)}",
        "pick one with --cluster",
    )


def candidates(ctx: Context, tpu_type: str) -> list[str]:
    """The clusters `tpu_type` could be added to (for a chat to offer): unprotected, zone offers it."""
    try:
        wanted = parse_tpu_type(tpu_type)
    except ValueError:
        return []
    return [
        c.name
        for c in ctx.registry.clusters.values()
        if not c.protected and c.tpu_generation == wanted.generation and wanted.name in _types(ctx, c)
    ]


def _types(ctx: Context, cluster: Cluster) -> list[str]:
    try:
        return ctx.tpu(cluster).accelerator_types(cluster.zone)
    except Exception:  # a cloud we cannot ask now: it is no candidate (naming the cluster still works)
        return []


# -- the startup script -------------------------------------------------------------------------------
def startup_script(
    registry: Registry,
    cluster: Cluster,
    template: Path = STARTUP_TEMPLATE,
    token: str | None = None,
    image: str | None = None,
) -> str:
    """The cluster's worker startup script (infra/worker-startup.sh filled in). It holds the Ray token
    (`token`: the cluster's live one, `Context.token`; else this machine's copy): it goes into the
    node's metadata and nowhere else (never into progress, the ledger or logs). `image`: the one the
    cluster's nodes run (the store's pin, `ops.images.image_for_start`); the registry's tag if not given."""
    values = {
        "CLUSTER": cluster.name,
        "RAY_CLUSTER_NAME": cluster.ray_cluster_name,
        "PROJECT": cluster.project,
        "IMAGE": image or f"{registry.image(cluster)}:{cluster.image_tag}",
        "RAY_TOKEN": (token if token is not None else cluster.read_token()) or "",
    }
    text = template.read_text()
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    return text


# -- add-worker ---------------------------------------------------------------------------------------
class WorkerOutcome(BaseModel):
    qr_id: str
    state: Literal["ready", "failed"]
    nodes: list[str] = Field(default_factory=list)
    already: bool = False  # it was there from an earlier run of the same request
    error: str | None = None
    failure: str | None = None  # ops.gcp.tpu.Failure: stock-out, quota, reservation-exhausted, timeout...
    left: list[str] = Field(default_factory=list)  # what is still in the cloud after a failure


class AddWorkerResult(BaseModel):
    cluster: str
    zone: str
    accelerator_type: str
    capacity: str
    count: int
    added_by: str
    reason: str
    until: datetime | None
    request_key: str
    workers: list[WorkerOutcome]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(w.state == "ready" for w in self.workers)

    def summary(self) -> str:
        ready = [w for w in self.workers if w.state == "ready"]
        failed = [w for w in self.workers if w.state == "failed"]
        lines = [
            f"{len(ready)} of {self.count} {self.accelerator_type} ({self.capacity}) ready on {self.cluster} "
            f"in {self.seconds:.0f}s, added by {self.added_by}"
            + (f" for: {self.reason}" if self.reason else "")
            + (f"; until {self.until:%Y-%m-%d %H:%M} UTC" if self.until else "")
        ]
        for w in ready:
            lines.append(f"  {w.qr_id}: ready" + (" (already there)" if w.already else ""))
        for w in failed:
            lines.append(f"  {w.qr_id}: FAILED: {w.error}")
        return "\n".join(lines)


def request_key(cluster: str, tpu_type: str, capacity: Capacity, by: str, reason: str) -> str:
    """The CLI's default request: the same command by the same person is the same request (a retry
    creates nothing twice; another --request-id, or another reason, asks for more)."""
    return f"{cluster}|{tpu_type}|{capacity.value}|{by}|{reason}"


def add_worker(
    ctx: Context,
    tpu_type: str,
    capacity: Capacity | str,
    *,
    by: str,
    chat_id: str | None = None,
    count: int = 1,
    cluster: str | None = None,
    reason: str = "",
    hours: float | None = None,
    key: str | None = None,
    progress: Progress = _nothing,
    lease: Lease | None = None,
    settings: Settings | None = None,
) -> AddWorkerResult:
    """Add `count` TPU slices of `tpu_type` to the cluster (given, or inferred from the type) and wait
    until they are READY; each gets a ledger record. Holds the cluster's lock (`lease` when the caller
    took it, as the bot does; else taken here: Refused while another operation holds it).

    `key` identifies the request (the bot's op id; by default the request's own words): the same key
    gives the same queued resource ids, so a retry creates nothing twice. Failed workers carry one
    message each saying what is left in the cloud; the result's `ok` says whether all are ready."""
    settings = settings or Settings()
    capacity = capacity if isinstance(capacity, Capacity) else Capacity.parse(capacity)
    if not 1 <= count <= MAX_COUNT:
        raise BadInput(f"--count must be 1 to {MAX_COUNT} (was {count})")
    if hours is not None and hours <= 0:
        raise BadInput(f"--for must be a positive number of hours (was {hours:g})")
    target = resolve_cluster(ctx, tpu_type, cluster)
    tpu_type = parse_tpu_type(tpu_type).name
    key = key or request_key(target.name, tpu_type, capacity, by, reason)
    own_lease = None
    if lease is None:
        op_id = f"{target.name}-add-worker-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        own_lease = acquire(ctx.store, target.name, op_id, "add-worker", by, settings.lease_s)
        own_lease.start_renewing()
    try:
        who = (by, chat_id)
        return _add(ctx, target, tpu_type, capacity, who, count, reason, hours, key, progress, settings)
    finally:
        if own_lease is not None:
            own_lease.release()


def _add(
    ctx: Context,
    cluster: Cluster,
    tpu_type: str,
    capacity: Capacity,
    who: tuple[str, str | None],
    count: int,
    reason: str,
    hours: float | None,
    key: str,
    progress: Progress,
    settings: Settings,
) -> AddWorkerResult:
    started = time.monotonic()
    now = datetime.now(UTC)
    api = ctx.tpu(cluster)
    records = [
        WorkerRecord(
            cluster=cluster.name,
            qr_id=(qr_id := queued_resource_id(cluster.name, tpu_type, key, i)),
            qr_name=f"{api.parent(cluster.zone)}/queuedResources/{qr_id}",
            zone=cluster.zone,
            accelerator_type=tpu_type,
            capacity=capacity.value,
            added_by=who[0],
            added_by_chat=who[1],
            reason=reason,
            added_at=now,
            until=now + timedelta(hours=hours) if hours else None,
            request_key=key,
            index=i,
        )
        for i in range(count)
    ]
    progress(
        f"asking {cluster.zone} for {count} x {tpu_type} ({capacity.value}) for {cluster.name}: "
        + ", ".join(r.qr_id for r in records)
    )
    script = startup_script(ctx.registry, cluster, token=ctx.token(cluster), image=_image(ctx, cluster))
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="add-worker") as pool:
        outcomes = list(pool.map(lambda r: _provision(ctx, r, script, progress, settings), records))
    return AddWorkerResult(
        cluster=cluster.name,
        zone=cluster.zone,
        accelerator_type=tpu_type,
        capacity=capacity.value,
        count=count,
        added_by=who[0],
        reason=reason,
        until=records[0].until,
        request_key=key,
        workers=outcomes,
        seconds=time.monotonic() - started,
    )


def labels_of(record: WorkerRecord) -> dict[str, str]:
    """Our labels (never Ray's): which cluster, who, which request."""
    digest = hashlib.sha256(record.request_key.encode()).hexdigest()[:12]
    labels = {
        LABEL_CLUSTER: label_value(record.cluster),
        LABEL_OWNER: label_value(record.added_by),
        LABEL_REQUEST: digest,
    }
    if record.attempt > 1:
        labels[LABEL_ATTEMPT] = str(record.attempt)
    return labels


def _image(ctx: Context, cluster: Cluster) -> str:
    """The image the cluster's nodes run: the pinned one (build-image), as its head's config names it."""
    from ops.images import image_for_start

    return image_for_start(ctx, cluster)[0]


def _provision(
    ctx: Context,
    record: WorkerRecord,
    script: str,
    progress: Progress,
    settings: Settings,
    keep: bool = False,
) -> WorkerOutcome:
    """One worker: a leftover of an earlier try that can no longer serve (failed, suspended) goes first;
    then create (idempotent) and wait until READY. The ledger records it before the cloud is asked; a
    failure that leaves nothing drops the record, unless `keep` (a re-add: the next restart tries again)."""
    api = ctx.tpu(ctx.cluster(record.cluster))
    existing = api.get_queued_resource(record.qr_name)
    already = existing is not None and existing.state == "ACTIVE"
    got = read_model(ctx.store, _key(record.cluster, record.qr_id), WorkerRecord)
    old = got[0] if got is not None else None
    attempt = old.attempt if old is not None else 1
    if existing is not None and existing.state in ("FAILED", "SUSPENDING", "SUSPENDED"):
        progress(f"{record.qr_id}: an earlier try is {existing.state}: deleting it to ask again")
        api.delete_queued_resource(record.qr_name)
        _until_gone(api, record.qr_name, settings.timeout_s)
        attempt += 1
    elif existing is None and old is not None and old.state == "ready":
        attempt += 1  # it was there and went (preempted, cleaned): asked again
    if old is not None:  # the same request again: keep when and why it was first asked
        record = record.model_copy(update={"added_at": old.added_at, "until": old.until})
    record = record.model_copy(update={"attempt": attempt})
    _write(ctx, record)

    def seen(info: QueuedResourceInfo) -> None:
        progress(f"{record.qr_id}: {info.state}")

    try:
        info = api.provision(
            record.zone,
            record.qr_id,
            record.accelerator_type,
            Capacity(record.capacity),
            labels_of(record),
            script,
            timeout_s=settings.timeout_s,
            progress=seen,
        )
    except CapacityError as e:
        _settle_failed(ctx, record, str(e), e.left, keep)
        return WorkerOutcome(
            qr_id=record.qr_id, state="failed", error=str(e), failure=e.kind.value, left=e.left
        )
    except OpsError as e:
        left = [] if api.get_queued_resource(record.qr_name) is None else [record.qr_name]
        _settle_failed(ctx, record, str(e), left, keep)
        return WorkerOutcome(qr_id=record.qr_id, state="failed", error=str(e), left=left)
    _write(ctx, record.model_copy(update={"state": "ready", "error": None}))
    progress(f"{record.qr_id}: READY")
    return WorkerOutcome(qr_id=record.qr_id, state="ready", nodes=info.node_names, already=already)


def _until_gone(api: TpuApi, name: str, timeout_s: float) -> None:
    """Wait until a deleted queued resource is gone (its delete operation may end before the record
    does): creating the same id again before that would meet the dying one. The API has no events."""
    deadline = time.monotonic() + timeout_s
    pause = api.pauses()
    while api.get_queued_resource(name) is not None:
        if time.monotonic() >= deadline:
            raise OpsError(
                f"queued resource {name} is still being deleted after {timeout_s:g} s", "retry later"
            )
        time.sleep(next(pause))


def _settle_failed(ctx: Context, record: WorkerRecord, error: str, left: list[str], keep: bool) -> None:
    """Nothing left in the cloud: no ledger record either. Something left: the record says so."""
    if keep:
        _write(ctx, record.model_copy(update={"error": error}))
    elif left:
        _write(ctx, record.model_copy(update={"state": "failed", "error": error}))
    else:
        ctx.store.delete(_key(record.cluster, record.qr_id))


# -- the workers view ---------------------------------------------------------------------------------
class WorkerRow(BaseModel):
    qr_id: str
    accelerator_type: str
    capacity: str
    added_by: str | None = None  # None: not in the ledger
    reason: str = ""
    added_at: datetime | None = None
    until: datetime | None = None
    qr_state: str | None = None  # None: no queued resource in the cloud
    node_state: str | None = None  # None: no TPU VM in the cloud
    in_ray: bool | None = None  # None: Ray could not be asked
    flags: list[str] = Field(default_factory=list)


class WorkersView(BaseModel):
    cluster: str
    zone: str
    workers: list[WorkerRow]
    ray_error: str | None = None

    def summary(self) -> str:
        if not self.workers:
            return f"{self.cluster}: no added workers (ledger, cloud and Ray agree)"
        lines = [f"{'WORKER':34} {'TYPE':10} {'CAPACITY':11} {'BY':10} {'CLOUD':22} {'RAY':4} FLAGS"]
        for w in self.workers:
            cloud = f"{w.qr_state or '-'}/{w.node_state or '-'}"
            ray = "?" if w.in_ray is None else ("yes" if w.in_ray else "no")
            lines.append(
                f"{w.qr_id:34} {w.accelerator_type:10} {w.capacity:11} {w.added_by or '-':10} {cloud:22} "
                f"{ray:4} {'; '.join(w.flags)}"
            )
        if self.ray_error:
            lines.append(f"(Ray could not be asked: {self.ray_error})")
        return "\n".join(lines)


def workers_view(ctx: Context, cluster_name: str, now: datetime | None = None) -> WorkersView:
    """The ledger beside the cloud (our labelled queued resources and TPU VMs) and Ray (alive nodes with
    the type's TPU-<type>-head), with what disagrees flagged."""
    cluster = ctx.cluster(cluster_name)
    now = now or datetime.now(UTC)
    api = ctx.tpu(cluster)
    ours = {LABEL_CLUSTER: label_value(cluster.name)}
    qrs = {q.qr_id: q for q in api.list_queued_resources(cluster.zone, ours)}
    nodes = {n.node_id: n for n in api.list_nodes(cluster.zone, ours)}
    ray_nodes, ray_error = _ray_tpu_nodes(ctx, cluster)
    records = {r.qr_id: r for r in ledger(ctx, cluster.name)}
    ids = list(records) + sorted((set(qrs) | set(nodes)) - set(records))
    in_ray = _match_ray(ray_nodes, [nodes[i] for i in ids if i in nodes]) if ray_error is None else {}
    rows = []
    for qr_id in ids:
        record, qr, node = records.get(qr_id), qrs.get(qr_id), nodes.get(qr_id)
        seen: QueuedResourceInfo | NodeInfo = qr or node  # type: ignore[assignment]  # one of them is there
        if record is not None:
            accelerator_type, capacity = record.accelerator_type, record.capacity
        elif qr is not None:
            accelerator_type, capacity = qr.accelerator_type, qr.capacity
        else:
            accelerator_type, capacity = seen.accelerator_type, seen.labels.get(LABEL_CAPACITY, "?")
        row = WorkerRow(
            qr_id=qr_id,
            accelerator_type=accelerator_type,
            capacity=capacity,
            added_by=record.added_by if record else None,
            reason=record.reason if record else "",
            added_at=record.added_at if record else None,
            until=record.until if record else None,
            qr_state=qr.state if qr else None,
            node_state=node.state if node else None,
            in_ray=None if ray_error is not None else in_ray.get(qr_id, False),
        )
        row.flags = _flags(row, record, now)
        rows.append(row)
    return WorkersView(cluster=cluster.name, zone=cluster.zone, workers=rows, ray_error=ray_error)


def _flags(row: WorkerRow, record: WorkerRecord | None, now: datetime) -> list[str]:
    flags = []
    if record is None:
        flags.append("in the cloud but not in the ledger (added outside clusterbot?)")
    elif row.qr_state is None and row.node_state is None:
        if record.state == "requested":
            flags.append("in the ledger but not in the cloud (its add-worker did not finish?)")
        else:
            flags.append("in the ledger but gone from the cloud: a restart recreates it")
    if row.node_state in GONE_STATES:
        flags.append(f"{row.node_state.lower()}: clean-preempted deletes it, a restart recreates it")
    elif row.qr_state in ("FAILED", "SUSPENDED") and row.node_state is None:
        flags.append(f"queued resource {row.qr_state.lower()}: clean-preempted deletes it")
    elif row.node_state == "READY" and row.in_ray is False:
        flags.append("in the cloud but not in Ray (its startup script has not joined the head)")
    if record is not None and record.state == "failed":
        flags.append(f"its add-worker failed: {record.error}")
    if record is not None and record.until is not None and now >= record.until:
        flags.append(f"past its --for time ({record.until:%Y-%m-%d %H:%M} UTC): ask {record.added_by}")
    return flags


def _ray_tpu_nodes(ctx: Context, cluster: Cluster) -> tuple[list[dict], str | None]:
    """Ray's alive nodes (state API); the error text when Ray cannot be asked."""
    try:
        nodes = ctx.ray(cluster).nodes()
    except OpsError as e:
        return [], str(e)
    return [n for n in nodes if n.get("state") == "ALIVE"], None


def _match_ray(ray_nodes: list[dict], vms: list[NodeInfo]) -> dict[str, bool]:
    """Which READY TPU VMs have their host 0 in Ray. A real TPU VM's raylet names its slice (a resource
    and the `ray.io/tpu-slice-name` label, GCP_API_FACTS.md 2.5); a node that names none is matched by
    its TPU-<type>-head to a VM of that type not matched otherwise."""
    named: set[str] = set()
    anonymous: dict[str, int] = {}
    for node in ray_nodes:
        resources = node.get("resources_total") or {}
        labels = node.get("labels") or {}
        heads = [r[4:-5] for r in resources if r.startswith("TPU-") and r.endswith("-head")]
        if not heads:
            continue
        names = {labels.get("ray.io/tpu-slice-name")} | {v.node_id for v in vms if v.node_id in resources}
        names.discard(None)
        if names:
            named |= names  # type: ignore[arg-type]
        else:
            anonymous[heads[0]] = anonymous.get(heads[0], 0) + 1
    out = {}
    for vm in vms:
        if vm.state != "READY":
            out[vm.node_id] = False
        elif vm.node_id in named:
            out[vm.node_id] = True
        elif anonymous.get(vm.accelerator_type, 0) > 0:
            anonymous[vm.accelerator_type] -= 1
            out[vm.node_id] = True
        else:
            out[vm.node_id] = False
    return out


class Due(BaseModel):
    """A worker to tell its adder about: past its --for time, or idle too long. Nothing is deleted."""

    cluster: str
    qr_id: str
    accelerator_type: str
    added_by: str
    added_by_chat: str | None = None
    kind: Literal["overdue", "idle"]
    since: datetime  # past its --for time since, or idle since
    why: str


def due_workers(
    ctx: Context, cluster_name: str, now: datetime | None = None, settings: Settings | None = None
) -> list[Due]:
    """The ledger's workers past their --for time, and those idle (no task running and no actor alive on
    any of their Ray nodes) for `settings.idle_h`, for the bot's scheduled report to whoever added them.

    Idle is sampled: each call that finds a worker busy writes `busy_at` to its record, and idle time
    counts from the last such call (or from when it was added). A worker Ray does not see, or a Ray
    that cannot be asked, is never called idle: `workers` flags those."""
    settings = settings or Settings()
    now = now or datetime.now(UTC)
    records = [r for r in ledger(ctx, cluster_name) if r.state == "ready"]
    out = [
        Due(
            cluster=r.cluster,
            qr_id=r.qr_id,
            accelerator_type=r.accelerator_type,
            added_by=r.added_by,
            added_by_chat=r.added_by_chat,
            kind="overdue",
            since=r.until,
            why=f"past its --for time ({r.until:%Y-%m-%d %H:%M} UTC)",
        )  # fmt: skip
        for r in records
        if r.until is not None and now >= r.until
    ]
    if not records:
        return out
    cluster = ctx.cluster(cluster_name)
    nodes, error = _ray_tpu_nodes(ctx, cluster)
    if error is not None:
        return out
    api = ctx.ray(cluster)
    for record in records:
        ids = [n["node_id"] for n in nodes if _slice_of(n) == record.qr_id]
        if not ids:
            continue
        try:
            busy = _busy(api, ids)
        except OpsError:
            continue
        if busy:
            _write(ctx, record.model_copy(update={"busy_at": now}))
            continue
        since = record.busy_at or record.added_at
        if now - since >= timedelta(hours=settings.idle_h):
            out.append(
                Due(
                    cluster=record.cluster,
                    qr_id=record.qr_id,
                    accelerator_type=record.accelerator_type,
                    added_by=record.added_by,
                    added_by_chat=record.added_by_chat,
                    kind="idle",
                    since=since,
                    why=f"idle (no task or actor on it) since {since:%Y-%m-%d %H:%M} UTC",
                )  # fmt: skip
            )
    return out


def _slice_of(node: dict) -> str | None:
    """The TPU slice a Ray node is a host of (the raylet's label, GCP_API_FACTS 2.5)."""
    return (node.get("labels") or {}).get("ray.io/tpu-slice-name")


def _busy(api: RayApi, node_ids: list[str]) -> bool:
    """Whether a task runs or an actor lives on any of these Ray nodes now."""
    for node_id in node_ids:
        on = ("node_id", "=", node_id)
        if api.state("tasks", on, ("state", "=", "RUNNING"), limit=1):
            return True
        if api.state("actors", on, ("state", "=", "ALIVE"), limit=1):
            return True
    return False


# -- after a restart ----------------------------------------------------------------------------------
def readd_workers(
    ctx: Context,
    cluster: Cluster,
    progress: Progress = _nothing,
    settings: Settings | None = None,
    new_token: bool = False,
) -> list[str]:
    """After a restart, the ledger's workers serve the new head: a VM that is READY rejoins by itself
    (its startup script follows the head); one that is gone is recreated under the same id. After a
    token rotation (`new_token`) every one is recreated: a VM's startup script holds the token it was
    made with, which the new head refuses. One line per worker; a worker that cannot be had is a line,
    not a failed restart. Runs under the restart's lock."""
    settings = settings or Settings()
    records = [r for r in ledger(ctx, cluster.name) if r.state != "failed"]
    if not records:
        return []
    api = ctx.tpu(cluster)
    script = startup_script(ctx.registry, cluster, token=ctx.token(cluster), image=_image(ctx, cluster))

    def one(record: WorkerRecord) -> str:
        node = api.get_node(f"{api.parent(record.zone)}/nodes/{record.qr_id}")
        if node is not None and node.state == "READY" and not new_token:
            return f"{record.qr_id} ({record.accelerator_type}, {record.added_by}): rejoins the new head"
        if node is not None and new_token:
            progress(f"{record.qr_id}: made with the old token, recreating it with the new one")
            api.delete_queued_resource(record.qr_name, force=True)
            _until_gone(api, record.qr_name, settings.timeout_s)
        else:
            progress(f"{record.qr_id}: {node.state if node else 'gone'}, recreating it")
        outcome = _provision(ctx, record, script, progress, settings, keep=True)
        if outcome.state == "ready":
            return f"{record.qr_id} ({record.accelerator_type}, {record.added_by}): recreated"
        return f"{record.qr_id} ({record.accelerator_type}, {record.added_by}): NOT re-added: {outcome.error}"

    with ThreadPoolExecutor(max_workers=min(len(records), 8), thread_name_prefix="readd") as pool:
        return list(pool.map(one, records))
