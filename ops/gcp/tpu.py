"""Cloud TPU for ops: queued resources (v2alpha1, for best-effort and reserved tiers) and nodes (v2), the
code that runs against Google and, in tests and on the local cluster, against ops.sim.

Every call retries transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ABORTED) with
google-api-core's Retry; permanent ones (quota, bad input, not found) are reported. Creating is
idempotent: a deterministic id and request id, and an AlreadyExists of our own request counts as
created. Our labels (`clusterbot-*`), never Ray's `ray-node-type`/`ray-cluster-name`, so Ray's
autoscaler neither adopts nor deletes what we create. Facts: ../shared/GCP_API_FACTS.md section 1.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc
from google.api_core import exceptions
from google.api_core.retry import Retry
from google.cloud import tpu_v2, tpu_v2alpha1
from pydantic import BaseModel

from ops.errors import BadInput, OpsError, Refused
from ops.gcp import common
from ops.tpu_types import parse_tpu_type

LABEL_CLUSTER = "clusterbot-cluster"
LABEL_OWNER = "clusterbot-owner"
LABEL_REQUEST = "clusterbot-request"  # which request created it: tells our own AlreadyExists apart
LABEL_CAPACITY = "clusterbot-capacity"
_QrState = tpu_v2alpha1.QueuedResourceState.State
_NODE_STATES = {s.value: s.name for s in tpu_v2.Node.State}


class Capacity(StrEnum):
    RESERVED = "reserved"
    SPOT = "spot"
    BEST_EFFORT = "best-effort"

    @classmethod
    def parse(cls, text: str) -> Capacity:
        """`reserved`, `spot` (or `preemptible`), `best-effort` (or `best_effort`); BadInput otherwise."""
        word = text.strip().lower().replace("_", "-")
        if word == "preemptible":
            return cls.SPOT
        try:
            return cls(word)
        except ValueError:
            raise BadInput(
                f"unknown capacity {text!r}", "use reserved, spot (or preemptible) or best-effort"
            ) from None


class Failure(StrEnum):
    STOCK_OUT = "stock-out"
    QUOTA = "quota"
    RESERVATION = "reservation-exhausted"
    TIMEOUT = "timeout"
    SUSPENDED = "suspended"
    FAILED = "failed"


class CapacityError(OpsError):
    """Capacity could not be had: `kind` says why, `left` names what is still in the cloud (ideally none)."""

    def __init__(self, kind: Failure, reason: str, hint: str = "", left: list[str] | None = None) -> None:
        super().__init__(reason, hint)
        self.kind = kind
        self.left = list(left or [])


class QueuedResourceInfo(BaseModel):
    name: str  # projects/P/locations/Z/queuedResources/ID
    qr_id: str
    zone: str
    state: str  # QueuedResourceState name: WAITING_FOR_RESOURCES, ACTIVE, FAILED...
    capacity: str  # reserved | spot | best-effort | guaranteed | on-demand
    accelerator_type: str
    labels: dict[str, str]
    node_names: list[str]
    error_code: int = 0  # failed_data.error, when FAILED
    error_message: str = ""


class NodeInfo(BaseModel):
    name: str  # projects/P/locations/Z/nodes/ID
    node_id: str
    zone: str
    state: str  # Node.State name: CREATING, READY, PREEMPTED...
    accelerator_type: str
    labels: dict[str, str]
    queued_resource: str
    hosts: int
    ip_addresses: list[str]


@dataclass
class TpuClients:
    """The two client versions ops uses, on one channel when talking to the simulator."""

    v2: tpu_v2.TpuClient
    alpha: tpu_v2alpha1.TpuClient
    channel: grpc.Channel | None = None

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


def tpu_clients(endpoint: str | None) -> TpuClients:
    """Real clients for Google (`endpoint` None: application default credentials), or clients on an
    insecure channel to `host:port` (the simulator; no credentials, FINDINGS.md)."""
    if endpoint is None:
        return TpuClients(v2=tpu_v2.TpuClient(), alpha=tpu_v2alpha1.TpuClient())
    from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport as V2Transport
    from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport as AlphaTransport

    channel = grpc.insecure_channel(endpoint)
    return TpuClients(
        v2=tpu_v2.TpuClient(transport=V2Transport(channel=channel)),
        alpha=tpu_v2alpha1.TpuClient(transport=AlphaTransport(channel=channel)),
        channel=channel,
    )


def default_retry(deadline_s: float = 120.0, initial_s: float = 1.0, maximum_s: float = 20.0) -> Retry:
    """ops.gcp.common's retry with Cloud TPU's pace and no rate limits (its RESOURCE_EXHAUSTED is quota or
    stock-out). TPU RPCs have no default retry of their own (GCP_API_FACTS.md 0.3)."""
    return common.retry(deadline_s, initial_s, maximum_s, rate_limits=False)


def label_value(text: str) -> str:
    """Any text as a valid GCP label value (lowercase, digits, `-`, `_`, at most 63)."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def queued_resource_id(cluster: str, accelerator_type: str, request_key: str, index: int = 0) -> str:
    """The same id for the same request (say an operation id) and index, so a retry creates nothing twice.

    Also the node id; shaped for the node-name rule `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`.
    """
    digest = hashlib.sha256(request_key.encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9-]", "-", f"{cluster}-{accelerator_type}".lower()).strip("-")
    tail = f"-{digest}-{index}"
    return f"cb-{slug[: 63 - 3 - len(tail)].rstrip('-')}{tail}"


def classify(code: int, message: str) -> Failure:
    """What a capacity error means, from its status code and message (GCP_API_FACTS.md 1.8)."""
    lowered = message.lower()
    if "quota" in lowered:
        return Failure.QUOTA
    if "reserved capacity" in lowered or "reservation" in lowered:
        return Failure.RESERVATION
    if "no more capacity" in lowered or code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]:
        return Failure.STOCK_OUT
    return Failure.FAILED


class TpuApi:
    """Cloud TPU in one project, through clients passed in."""

    def __init__(
        self,
        clients: TpuClients,
        project: str,
        *,
        retry: Retry | None = None,
        poll_s: float = 10.0,
        op_timeout_s: float = 600.0,
        types_ttl_s: float = 3600.0,
    ) -> None:
        self.clients = clients
        self.project = project
        self.retry = retry or default_retry()
        self.poll_s = poll_s
        self.op_timeout_s = op_timeout_s
        self.types_ttl_s = types_ttl_s
        self._types: dict[str, tuple[float, list[str]]] = {}

    def pauses(self) -> Iterator[float]:
        """Waits between polls of an operation's state: 1 s growing to `poll_s`, so a quick one (the
        simulator, a warm reservation) is seen within a second and a slow one costs Google few calls."""
        pause = min(1.0, self.poll_s)
        while True:
            yield pause
            pause = min(pause * 1.5, self.poll_s)

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    # ---- accelerator types --------------------------------------------------------------------
    def accelerator_types(self, zone: str) -> list[str]:
        """The types `zone` offers, cached (`types_ttl_s`) so a chat validation answers at once."""
        cached = self._types.get(zone)
        if cached is not None and time.monotonic() - cached[0] < self.types_ttl_s:
            return cached[1]
        pager = self.clients.v2.list_accelerator_types(parent=self.parent(zone), retry=self.retry)
        names = sorted({t.type_ for t in pager}, key=_type_order)
        self._types[zone] = (time.monotonic(), names)
        return names

    def check_type(self, zone: str, accelerator_type: str) -> None:
        """BadInput listing the valid types when `zone` does not offer `accelerator_type`."""
        valid = self.accelerator_types(zone)
        if accelerator_type not in valid:
            raise BadInput(f"{zone} offers no {accelerator_type}", f"valid types there: {', '.join(valid)}")

    # ---- queued resources ---------------------------------------------------------------------
    def create_queued_resource(
        self,
        zone: str,
        qr_id: str,
        accelerator_type: str,
        capacity: Capacity,
        labels: dict[str, str],
        startup_script: str = "",
        runtime_version: str | None = None,
    ) -> QueuedResourceInfo:
        """Ask for one TPU slice (node id = `qr_id`). Idempotent: our own earlier request counts as created.

        Quota and bad input fail here (nothing is created); capacity shows later, in `wait_active`.
        """
        a = tpu_v2alpha1
        parent = self.parent(zone)
        labels = {**labels, LABEL_CAPACITY: label_value(capacity.value)}
        node = a.Node(
            accelerator_type=accelerator_type,
            runtime_version=runtime_version or parse_tpu_type(accelerator_type).runtime_version,
            labels=labels,
            metadata={"startup-script": startup_script} if startup_script else {},
            network_config=a.NetworkConfig(enable_external_ips=True),
        )
        qr = a.QueuedResource(
            tpu=a.QueuedResource.Tpu(
                node_spec=[a.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=qr_id, node=node)]
            )
        )
        if capacity is Capacity.RESERVED:
            qr.guaranteed = a.QueuedResource.Guaranteed(reserved=True)
        elif capacity is Capacity.SPOT:
            qr.spot = a.QueuedResource.Spot()
        else:
            qr.best_effort = a.QueuedResource.BestEffort()
        name = f"{parent}/queuedResources/{qr_id}"
        request = a.CreateQueuedResourceRequest(
            parent=parent,
            queued_resource_id=qr_id,
            queued_resource=qr,
            # The same request (not merely the same id) gets the same request id: a retry is deduplicated.
            request_id=str(
                uuid.uuid5(uuid.NAMESPACE_URL, f"{name}?{accelerator_type}&{sorted(labels.items())}")
            ),
        )
        try:
            op = self.clients.alpha.create_queued_resource(request=request, retry=self.retry)
            created = op.result(timeout=self.op_timeout_s, retry=self.retry)
        except exceptions.AlreadyExists:
            existing = self.get_queued_resource(name)
            if existing is None or any(existing.labels.get(k) != v for k, v in labels.items()):
                raise Refused(
                    f"a queued resource {qr_id} already exists in {zone} and is not from this request",
                    "use another request id, or delete it if it is a leftover",
                ) from None
            return existing
        except exceptions.InvalidArgument as e:
            raise BadInput(f"Cloud TPU refused {accelerator_type} in {zone}: {e.message}") from None
        except exceptions.RetryError as e:
            raise OpsError(
                f"Cloud TPU kept failing transiently for {accelerator_type} in {zone}: {e.cause}",
                "retry later: the same request creates nothing twice",
            ) from None
        except exceptions.GoogleAPICallError as e:
            # Quota fails the request; a capacity error may also end the create operation itself.
            code = e.grpc_status_code.value[0] if e.grpc_status_code else 0
            error = self._capacity_error(code, e.message or str(e), accelerator_type, zone, left=[])
            left = [] if self.get_queued_resource(name) is None else self._clean_up(name)
            raise CapacityError(
                error.kind, f"{error.reason.rstrip('.')}. {_left_text(left, zone)}", error.hint, left
            ) from None
        return _qr_info(created)

    def get_queued_resource(self, name: str) -> QueuedResourceInfo | None:
        """None when it does not exist (any more)."""
        try:
            return _qr_info(self.clients.alpha.get_queued_resource(name=name, retry=self.retry))
        except exceptions.NotFound:
            return None

    def list_queued_resources(
        self, zone: str, labels: dict[str, str] | None = None
    ) -> list[QueuedResourceInfo]:
        """The zone's queued resources whose node labels include `labels` (the API has no filter)."""
        pager = self.clients.alpha.list_queued_resources(parent=self.parent(zone), retry=self.retry)
        found = [_qr_info(q) for q in pager]
        return [q for q in found if _matches(q.labels, labels)]

    def wait_active(
        self,
        name: str,
        timeout_s: float,
        progress: Callable[[QueuedResourceInfo], None] | None = None,
    ) -> QueuedResourceInfo:
        """Poll until ACTIVE with its nodes READY; `progress` on every state change. CapacityError on
        FAILED (stock-out, reservation...), SUSPENDED, or `timeout_s` (the QR is left as it is: see
        `provision` for the cleanup)."""
        deadline = time.monotonic() + timeout_s
        last = ""
        pause = self.pauses()
        while True:
            info = self.get_queued_resource(name)
            if info is None or info.state == "DELETING":
                raise OpsError(f"queued resource {name} was deleted while we waited for it")
            if info.state != last:
                last = info.state
                if progress is not None:
                    progress(info)
            if info.state == "ACTIVE" and all(self._node_ready(n) for n in info.node_names):
                return info
            if info.state == "FAILED":
                raise self._capacity_error(
                    info.error_code, info.error_message, info.accelerator_type, info.zone, left=[name]
                )
            if info.state in ("SUSPENDING", "SUSPENDED"):
                raise CapacityError(
                    Failure.SUSPENDED,
                    f"{info.accelerator_type} in {info.zone} was suspended (preempted) before it was ready",
                    left=[name],
                )
            if time.monotonic() >= deadline:
                raise CapacityError(
                    Failure.TIMEOUT,
                    f"{info.accelerator_type} in {info.zone} was not ready after {timeout_s:g} s "
                    f"(still {info.state})",
                    "try later, another zone, or another capacity",
                    left=[name],
                )
            time.sleep(min(next(pause), max(0.0, deadline - time.monotonic())))  # the API has no events

    def provision(
        self,
        zone: str,
        qr_id: str,
        accelerator_type: str,
        capacity: Capacity,
        labels: dict[str, str],
        startup_script: str = "",
        *,
        timeout_s: float = 1800.0,
        progress: Callable[[QueuedResourceInfo], None] | None = None,
    ) -> QueuedResourceInfo:
        """Create and wait until ACTIVE. On any capacity failure the queued resource is deleted and the
        CapacityError says what is left in the cloud (ideally nothing)."""
        info = self.create_queued_resource(zone, qr_id, accelerator_type, capacity, labels, startup_script)
        try:
            return self.wait_active(info.name, timeout_s, progress)
        except CapacityError as e:
            left = self._clean_up(info.name)
            raise CapacityError(
                e.kind, f"{e.reason.rstrip('.')}. {_left_text(left, zone)}", e.hint, left
            ) from None

    def delete_queued_resource(self, name: str, force: bool = True) -> bool:
        """Delete it (with `force`, its nodes first) and wait; False when it was already gone."""
        request = tpu_v2alpha1.DeleteQueuedResourceRequest(name=name, force=force)
        try:
            op = self.clients.alpha.delete_queued_resource(request=request, retry=self.retry)
            op.result(timeout=self.op_timeout_s, retry=self.retry)
        except exceptions.NotFound:
            return False
        except TypeError:
            # The service answers Empty where v2alpha1 declares QueuedResource, so the client raises
            # TypeError although the delete happened (GCP_API_FACTS.md 1.2; Google's sample catches it
            # too). Believe it only if the queued resource is gone or going.
            left = self.get_queued_resource(name)
            if left is not None and left.state != "DELETING":
                raise
        return True

    # ---- nodes --------------------------------------------------------------------------------
    def list_nodes(self, zone: str, labels: dict[str, str] | None = None) -> list[NodeInfo]:
        """The zone's TPU VMs whose labels include `labels` (the API has no filter)."""
        pager = self.clients.v2.list_nodes(parent=self.parent(zone), retry=self.retry)
        # The raw protobuf of each page: proto-plus wraps every field read, which for a zone of 1,024
        # VMs was most of a health sweep's CPU (bench/health.py).
        found = (n for page in pager.pages for n in tpu_v2.ListNodesResponse.pb(page).nodes)
        return [_node_info(n) for n in found if not labels or _matches(n.labels, labels)]

    def get_node(self, name: str) -> NodeInfo | None:
        try:
            return _node_info(tpu_v2.Node.pb(self.clients.v2.get_node(name=name, retry=self.retry)))
        except exceptions.NotFound:
            return None

    def delete_node(self, name: str) -> bool:
        """Delete a TPU VM and wait; False when it was already gone (NotFound is done, SkyPilot's rule)."""
        try:
            op = self.clients.v2.delete_node(name=name, retry=self.retry)
            op.result(timeout=self.op_timeout_s, retry=self.retry)
        except exceptions.NotFound:
            return False
        return True

    # ---- helpers ------------------------------------------------------------------------------
    def _node_ready(self, name: str) -> bool:
        node = self.get_node(name)
        return node is not None and node.state == "READY"

    def _clean_up(self, name: str) -> list[str]:
        """Delete a queued resource that failed; what is left (its name, when that failed too)."""
        try:
            self.delete_queued_resource(name, force=True)
        except (exceptions.GoogleAPICallError, exceptions.RetryError, TypeError):
            return [name]
        return []

    def _capacity_error(
        self, code: int, message: str, accelerator_type: str, zone: str, left: list[str]
    ) -> CapacityError:
        kind = classify(code, message)
        region = zone.rsplit("-", 1)[0]
        reason, hint = {
            Failure.QUOTA: (
                f"the project's quota for {accelerator_type} in {region} is used up",
                "free some (delete preempted TPUs) or ask for more quota",
            ),
            Failure.STOCK_OUT: (
                f"no {accelerator_type} capacity in {zone} right now (stock-out)",
                "try later, another zone, or another capacity",
            ),
            Failure.RESERVATION: (
                f"the reservation has no free {accelerator_type} capacity in {zone}",
                "free some of the reservation, or use spot / best-effort",
            ),
        }.get(kind, (f"Cloud TPU failed to provide {accelerator_type} in {zone}", ""))
        return CapacityError(kind, f"{reason}: {message}" if message else reason, hint, left)


def _left_text(left: list[str], zone: str) -> str:
    if not left:
        return "Nothing is left in the cloud."
    ids = " ".join(n.rsplit("/", 1)[-1] for n in left)
    return (
        f"Left in the cloud: queued resource {ids}; delete it with `gcloud alpha compute tpus "
        f"queued-resources delete {ids} --zone {zone} --force`."
    )


def _matches(labels: dict[str, str], want: dict[str, str] | None) -> bool:
    return all(labels.get(k) == v for k, v in (want or {}).items())


def _type_order(name: str) -> tuple[str, int]:
    prefix, _, size = name.rpartition("-")
    return prefix, int(size) if size.isdigit() else 0


def _qr_info(qr: tpu_v2alpha1.QueuedResource) -> QueuedResourceInfo:
    specs = list(qr.tpu.node_spec)
    node = specs[0].node if specs else tpu_v2alpha1.Node()
    tier = tpu_v2alpha1.QueuedResource.pb(qr).WhichOneof("tier")
    capacity = {
        "spot": "spot",
        "best_effort": "best-effort",
        "guaranteed": "reserved" if qr.guaranteed.reserved else "guaranteed",
    }.get(tier or "", "on-demand")
    error = qr.state.failed_data.error
    zone = qr.name.split("/locations/")[1].split("/")[0] if "/locations/" in qr.name else ""
    return QueuedResourceInfo(
        name=qr.name,
        qr_id=qr.name.rsplit("/", 1)[-1],
        zone=zone,
        state=_QrState(qr.state.state).name,
        capacity=capacity,
        accelerator_type=node.accelerator_type,
        labels=dict(node.labels),
        node_names=[f"{s.parent}/nodes/{s.node_id}" for s in specs if s.node_id],
        error_code=error.code,
        error_message=error.message,
    )


def _node_info(node: Any) -> NodeInfo:
    """A NodeInfo from a v2 Node's protobuf (tpu_v2.Node.pb), read without proto-plus."""
    name = node.name
    endpoints = node.network_endpoints
    return NodeInfo(
        name=name,
        node_id=name.rsplit("/", 1)[-1],
        zone=name.split("/locations/")[1].split("/")[0],
        state=_NODE_STATES.get(node.state, f"STATE_{node.state}"),  # one newer than this library
        accelerator_type=node.accelerator_type,
        labels=dict(node.labels),
        queued_resource=node.queued_resource,
        hosts=max(1, len(endpoints)),
        ip_addresses=[e.ip_address for e in endpoints],
    )
