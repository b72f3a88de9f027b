"""The one state behind both API versions: nodes, queued resources, their transitions over time, the
hooks fired when a TPU VM becomes READY or goes away, and the faults that change what happens.

Messages are kept as v2alpha1 types (the superset); `ops.sim.tpu` converts for v2 clients. Transitions
run on the clock thread after the `Latency` delays; a delay of 0 applies at once (an LRO is then done in
the RPC's own reply). Simulator choices where GCP_API_FACTS.md leaves a question open:
- a failed CreateNode (stock-out, reservation) leaves no node record;
- a queued resource on a stock-out or exhausted reservation goes FAILED with `failed_data.error`
  RESOURCE_EXHAUSTED (a real one may also wait until its valid-until time: `stay_waiting` fault);
- a preempted node stays PREEMPTED (counting against quota) until deleted, and its queued resource turns
  SUSPENDED; deleting a queued resource's node also suspends the queued resource;
- a non-force delete of a queued resource with live nodes fails FAILED_PRECONDITION;
- stock-outs hit every tier except reserved, reservation faults only reserved requests.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from google.cloud import tpu_v2alpha1 as tpu
from google.protobuf import timestamp_pb2
from google.rpc import status_pb2
from pydantic import BaseModel

from ops.sim import versions
from ops.sim.catalog import CONFIG_TYPE, DEFAULT_ZONES, topology, type_from_config
from ops.sim.clock import Clock
from ops.sim.faults import (
    UNAVAILABLE_MESSAGE,
    Fault,
    FaultKind,
    Faults,
    quota_message,
    reservation_message,
    stock_out_message,
)
from ops.sim.lro import Operations
from ops.tpu_types import parse_tpu_type

log = logging.getLogger(__name__)
T = TypeVar("T")
# Picks one page among a listing's sorted resource names: (the page's names, the next page token).
Pager = Callable[[list[str]], tuple[list[str], str]]

NodeState = tpu.Node.State
QrState = tpu.QueuedResourceState.State
_NODE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_QR_ID_RE = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_PARENT_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
# A QR with live nodes can only be deleted with force in these states (tpu types DeleteQueuedResource).
_BUSY = (QrState.PROVISIONING, QrState.ACTIVE, QrState.SUSPENDING)


class SimError(Exception):
    """An RPC error: the servicer aborts the call with this code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Latency(BaseModel):
    """Seconds each step takes. Defaults suit a human watching; tests set them small."""

    admit_s: float = 0.0  # QR CREATING -> WAITING_FOR_RESOURCES (the create LRO is done then)
    queue_s: float = 1.0  # WAITING_FOR_RESOURCES -> PROVISIONING (or FAILED on a stock-out)
    provision_s: float = 2.0  # PROVISIONING -> ACTIVE; node CREATING -> READY
    delete_s: float = 0.0  # DELETING -> gone
    build_queue_s: float = 1.0  # Cloud Build: QUEUED -> WORKING
    build_s: float = 3.0  # Cloud Build: WORKING -> SUCCESS / FAILURE
    call_s: float = 0.0  # every TPU RPC (and GetOperation) answers after this long: network + front end


@dataclass(frozen=True)
class SimNode:
    """What a hook learns about a TPU VM: enough to start (or stop) one Ray worker per host."""

    name: str  # projects/P/locations/Z/nodes/ID
    node_id: str
    zone: str
    accelerator_type: str  # e.g. v4-16
    hosts: int  # worker VMs in the slice (v4-16: 2); Ray's TPU-<type>-head goes on host 0 only
    labels: dict[str, str]
    metadata: dict[str, str]  # startup-script among them
    queued_resource: str  # the QR's full name, or ""
    state: str  # READY for on_ready; PREEMPTED or DELETED for on_gone


class Hooks(Protocol):
    """Called on the clock thread, never under the state's lock; an exception is logged and dropped.

    `on_ready` once when a node turns READY; `on_gone` once when a node that was READY is preempted or
    deleted (not again when a preempted node is deleted later).
    """

    def on_ready(self, node: SimNode) -> None: ...

    def on_gone(self, node: SimNode) -> None: ...


@dataclass
class _Plan:
    """What will happen to a create, decided by the faults armed when it arrived."""

    outcome: str = "ok"  # ok | stock_out | reservation | stuck
    message: str = ""
    preempt_after_s: float | None = None
    nodes: list[str] = field(default_factory=list)  # a QR's node names
    op: str = ""  # the create operation, while pending
    delete_ops: list[str] = field(default_factory=list)


def _ts() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def split_parent(parent: str) -> tuple[str, str]:
    """`projects/P/locations/Z` -> (P, Z); INVALID_ARGUMENT otherwise."""
    m = _PARENT_RE.match(parent)
    if not m:
        raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
    return m.group(1), m.group(2)


class TpuState:
    def __init__(
        self,
        zones: dict[str, tuple[str, ...]] | None = None,
        latency: Latency | None = None,
        hooks: list[Hooks] | None = None,
        path: Path | None = None,
        page_size: int = 0,
    ) -> None:
        """`path`: a JSON file the state is saved to after each change and loaded from at start.
        `page_size`: what ListNodes / ListQueuedResources answer when the request sets none (0: all in
        one page; Google documents no default, GCP_API_FACTS.md 1.2)."""
        self.zones = dict(DEFAULT_ZONES if zones is None else zones)
        self.latency = latency or Latency()
        self.page_size = page_size
        self.hooks = list(hooks or [])
        self.faults = Faults()
        self.ops = Operations()
        self.clock = Clock()
        self._path = path
        self._lock = threading.RLock()
        self._nodes: _ByName = _ByName()  # name -> tpu.Node
        self._qrs: _ByName = _ByName()  # name -> tpu.QueuedResource
        self._plans: dict[str, _Plan] = {}
        self._announced: set[str] = set()
        self._requests: dict[str, str] = {}  # CreateQueuedResource request_id -> operation name
        # QR name -> (node name, accelerator type, spec node) until PROVISIONING makes the nodes.
        self._pending_nodes: dict[str, list[tuple[str, str, tpu.Node]]] = {}
        self._ips = 0
        if path is not None and path.exists():
            self._load(path)

    def close(self) -> None:
        self.clock.stop()

    # ---- faults and control -------------------------------------------------------------------
    def add_fault(self, fault: Fault) -> None:
        self.faults.add(fault)

    def check(self, method: str) -> None:
        """Every RPC starts here: after `latency.call_s` (never under the lock, so calls overlap as they
        do on Google's side), an armed `unavailable` fault answers UNAVAILABLE (HTTP 503)."""
        if self.latency.call_s > 0:
            time.sleep(self.latency.call_s)
        if self.faults.take(FaultKind.UNAVAILABLE, method=method):
            raise SimError(grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)

    def preempt(self, name: str) -> None:
        """Preempt node `name` now (a full node name, or a node id in any zone)."""
        with self._lock:
            full = self._resolve(name)
            self._preempt(full)
            self._save()

    def summary(self) -> dict:
        """Names and states, for the control endpoint and humans."""
        with self._lock:
            return {
                "nodes": {n: NodeState(v.state).name for n, v in self._nodes.items()},
                "queued_resources": {n: QrState(v.state.state).name for n, v in self._qrs.items()},
                "faults": [f.model_dump() for f in self.faults.armed()],
                "latency": self.latency.model_dump(),
            }

    # ---- nodes --------------------------------------------------------------------------------
    def get_node(self, name: str) -> tpu.Node:
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
            return _copy(node)

    def list_nodes(self, parent: str, pager: Pager | None = None) -> tuple[list[tpu.Node], str]:
        """The nodes under `parent` (`locations/-`: every zone) by name, and the next page token: `pager`
        picks the page among the names before anything is copied (a page costs its own size, not the
        zone's). Without one: every node, and no token."""
        with self._lock:
            names, token = _pick(self._nodes, parent, "nodes", pager)
            return [_copy(self._nodes[n]) for n in names], token

    def create_node(self, parent: str, node_id: str, node: tpu.Node, api: str) -> str:
        """CreateNode: validated now; the LRO ends when the node is READY (or on a capacity error)."""
        _, zone = split_parent(parent)
        with self._lock:
            accel = self._validate(zone, node_id, node)
            name = f"{parent}/nodes/{node_id}"
            if name in self._nodes:
                raise SimError(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
            sc = node.scheduling_config
            self._quota(zone, accel, preemptible=sc.preemptible or sc.spot)
            plan = self._plan(zone, accel, reserved=sc.reserved, queued=False)
            self._nodes[name] = self._new_node(name, node, accel, api, queued_resource="")
            op = plan.op = self.ops.start(parent, "create", name, api)
            self._plans[name] = plan
            self._later(self.latency.provision_s, lambda: self._node_created(name))
            self._save()
            return op

    def delete_node(self, name: str, api: str) -> str:
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
            node.state = NodeState.DELETING
            op = self.ops.start(name.split("/nodes/")[0], "delete", name, api)
            self._later(self.latency.delete_s, lambda: self._node_deleted(name, op))
            self._save()
            return op

    # ---- queued resources ---------------------------------------------------------------------
    def get_qr(self, name: str) -> tpu.QueuedResource:
        with self._lock:
            qr = self._qrs.get(name)
            if qr is None:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
            return _copy(qr)

    def list_qrs(self, parent: str, pager: Pager | None = None) -> tuple[list[tpu.QueuedResource], str]:
        """As `list_nodes`, for queued resources."""
        with self._lock:
            names, token = _pick(self._qrs, parent, "queuedResources", pager)
            return [_copy(self._qrs[n]) for n in names], token

    def create_qr(self, parent: str, qr_id: str, qr: tpu.QueuedResource, request_id: str, api: str) -> str:
        """CreateQueuedResource: validated now; the LRO ends at admission (WAITING_FOR_RESOURCES), as
        Google's spot sample shows; provisioning follows on the clock."""
        _, zone = split_parent(parent)
        with self._lock:
            if request_id and request_id in self._requests:
                return self._requests[request_id]  # a retry of the same request: the same operation
            if not _QR_ID_RE.match(qr_id or ""):
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid queued resource id {qr_id!r}")
            if zone not in self.zones:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f'Zone "{zone}" is not a valid location')
            name = f"{parent}/queuedResources/{qr_id}"
            if name in self._qrs:
                raise SimError(grpc.StatusCode.ALREADY_EXISTS, f"Resource '{name}' already exists")
            specs = list(qr.tpu.node_spec)
            if not specs:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "queued resource needs tpu.node_spec")
            nodes: list[tuple[str, str, tpu.Node]] = []  # (name, accelerator type, spec node)
            for spec in specs:
                _, spec_zone = split_parent(spec.parent)
                if spec.multi_node_params.node_count:
                    prefix = spec.multi_node_params.node_id_prefix or qr_id
                    ids = [f"{prefix}-{i}" for i in range(spec.multi_node_params.node_count)]
                else:
                    ids = [spec.node_id]
                for node_id in ids:
                    accel = self._validate(spec_zone, node_id, spec.node)
                    node_name = f"{spec.parent}/nodes/{node_id}"
                    if node_name in self._nodes:
                        raise SimError(
                            grpc.StatusCode.ALREADY_EXISTS, f"Resource '{node_name}' already exists"
                        )
                    nodes.append((node_name, accel, spec.node))
            tier = _tier(qr)
            accel = nodes[0][1]
            self._quota(zone, accel, preemptible=tier in ("spot", "best_effort"))
            plan = self._plan(zone, accel, reserved=tier == "reserved", queued=True)
            plan.nodes = [n for n, _, _ in nodes]
            stored = _copy(qr)
            stored.name = name
            stored.create_time = _ts()
            stored.state = tpu.QueuedResourceState(state=QrState.CREATING)
            self._qrs[name] = stored
            self._pending_nodes[name] = nodes
            op = plan.op = self.ops.start(parent, "create", name, api)
            self._plans[name] = plan
            if request_id:
                self._requests[request_id] = op
            self._later(self.latency.admit_s, lambda: self._qr_admitted(name))
            self._save()
            return op

    def delete_qr(self, name: str, force: bool, api: str) -> str:
        """DeleteQueuedResource: the LRO's result is Empty in both versions (the v2alpha1 quirk)."""
        with self._lock:
            qr = self._qrs.get(name)
            if qr is None:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
            plan = self._plans.setdefault(name, _Plan())
            live = [n for n in plan.nodes if n in self._nodes]
            if not force and live and qr.state.state in _BUSY:
                raise SimError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Queued resource {name} in state {QrState(qr.state.state).name} has nodes; "
                    "delete them first or use force",
                )
            op = self.ops.start(name.split("/queuedResources/")[0], "delete", name, api)
            plan.delete_ops.append(op)
            if qr.state.state != QrState.DELETING:
                qr.state = tpu.QueuedResourceState(state=QrState.DELETING)
                for n in live:
                    self._nodes[n].state = NodeState.DELETING
                self._later(self.latency.delete_s, lambda: self._qr_deleted(name))
            self._save()
            return op

    # ---- accelerator types --------------------------------------------------------------------
    def accelerator_types(self, parent: str) -> list[tpu.AcceleratorType]:
        _, zone = split_parent(parent)
        if zone not in self.zones:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f'Zone "{zone}" is not a valid location')
        return [
            tpu.AcceleratorType(
                name=f"{parent}/acceleratorTypes/{t}",
                type_=t,
                accelerator_configs=[
                    tpu.AcceleratorConfig(
                        type_=CONFIG_TYPE[parse_tpu_type(t).generation], topology=topology(t)
                    )
                ],
            )
            for t in self.zones[zone]
        ]

    # ---- transitions (clock thread, under the lock) -------------------------------------------
    def _node_created(self, name: str) -> None:
        plan = self._plans.get(name, _Plan())
        node = self._nodes.get(name)
        op, plan.op = plan.op, ""
        if node is None or node.state != NodeState.CREATING:
            if op:
                self.ops.fail(op, grpc.StatusCode.ABORTED, f"Node {name} was deleted while being created")
            return
        if plan.outcome in ("stock_out", "reservation"):
            del self._nodes[name]
            self.ops.fail(op, grpc.StatusCode.RESOURCE_EXHAUSTED, plan.message)
            return
        self._make_ready(name)
        self.ops.finish(op, versions.convert(self._nodes[name], self.ops.api(op)))

    def _node_deleted(self, name: str, op: str) -> None:
        node = self._nodes.pop(name, None)
        self._plans.pop(name, None)
        if node is not None:
            self._gone(node, "DELETED")
            self._suspend_qr(node.queued_resource)
        self.ops.finish(op, None)

    def _qr_admitted(self, name: str) -> None:
        qr, plan = self._qrs.get(name), self._plans.get(name)
        if qr is None or plan is None or qr.state.state != QrState.CREATING:
            return
        qr.state = tpu.QueuedResourceState(state=QrState.WAITING_FOR_RESOURCES)
        op, plan.op = plan.op, ""
        self.ops.finish(op, versions.convert(_copy(qr), self.ops.api(op)))
        if plan.outcome == "stuck":
            return
        if plan.outcome in ("stock_out", "reservation"):
            self._later(self.latency.queue_s, lambda: self._qr_failed(name))
        else:
            self._later(self.latency.queue_s, lambda: self._qr_provision(name))

    def _qr_failed(self, name: str) -> None:
        qr, plan = self._qrs.get(name), self._plans.get(name)
        if qr is None or plan is None or qr.state.state != QrState.WAITING_FOR_RESOURCES:
            return
        error = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message=plan.message)
        qr.state = tpu.QueuedResourceState(
            state=QrState.FAILED,
            failed_data=tpu.QueuedResourceState.FailedData(error=error),
            state_initiator=tpu.QueuedResourceState.StateInitiator.SERVICE,
        )
        self._save()

    def _qr_provision(self, name: str) -> None:
        qr = self._qrs.get(name)
        if qr is None or qr.state.state != QrState.WAITING_FOR_RESOURCES:
            return
        qr.state = tpu.QueuedResourceState(state=QrState.PROVISIONING)
        tier = _tier(qr)
        for node_name, accel, spec_node in self._pending_nodes.pop(name, []):
            node = self._new_node(node_name, spec_node, accel, versions.CANON, queued_resource=name)
            node.scheduling_config = tpu.SchedulingConfig(
                spot=tier == "spot", preemptible=tier == "best_effort", reserved=tier == "reserved"
            )
            self._nodes[node_name] = node
        self._later(self.latency.provision_s, lambda: self._qr_activate(name))
        self._save()

    def _qr_activate(self, name: str) -> None:
        qr, plan = self._qrs.get(name), self._plans.get(name)
        if qr is None or plan is None or qr.state.state != QrState.PROVISIONING:
            return
        for node_name in plan.nodes:
            if node_name in self._nodes:
                self._make_ready(node_name, plan.preempt_after_s)
        qr.state = tpu.QueuedResourceState(state=QrState.ACTIVE)
        self._save()

    def _qr_deleted(self, name: str) -> None:
        plan = self._plans.pop(name, _Plan())
        for node_name in plan.nodes:
            node = self._nodes.pop(node_name, None)
            if node is not None:
                self._gone(node, "DELETED")
        self._qrs.pop(name, None)
        self._pending_nodes.pop(name, None)
        if plan.op:
            self.ops.fail(plan.op, grpc.StatusCode.ABORTED, f"Queued resource {name} was deleted")
        for op in plan.delete_ops:
            self.ops.finish(op, None)
        self._save()

    def _make_ready(self, name: str, preempt_after_s: float | None = None) -> None:
        node = self._nodes[name]
        node.state = NodeState.READY
        node.health = tpu.Node.Health.HEALTHY
        if preempt_after_s is None:
            preempt_after_s = self._plans.get(name, _Plan()).preempt_after_s
        self._announced.add(name)
        snap = _sim_node(node, "READY")
        self.clock.call_later(0, lambda: self._call_hooks("on_ready", snap))
        if preempt_after_s is not None:
            self._later(preempt_after_s, lambda: self._preempt(name))
        self._save()

    def _preempt(self, name: str) -> None:
        node = self._nodes.get(name)
        if node is None or node.state not in (NodeState.READY, NodeState.CREATING):
            return
        node.state = NodeState.PREEMPTED
        node.health = tpu.Node.Health.HEALTH_UNSPECIFIED
        self._gone(node, "PREEMPTED")
        self._suspend_qr(node.queued_resource)
        self._save()

    def _suspend_qr(self, qr_name: str) -> None:
        qr = self._qrs.get(qr_name) if qr_name else None
        if qr is not None and qr.state.state in (QrState.ACTIVE, QrState.PROVISIONING):
            qr.state = tpu.QueuedResourceState(
                state=QrState.SUSPENDED, state_initiator=tpu.QueuedResourceState.StateInitiator.SERVICE
            )

    def _gone(self, node: tpu.Node, state: str) -> None:
        if node.name in self._announced:
            self._announced.discard(node.name)
            snap = _sim_node(node, state)
            self.clock.call_later(0, lambda: self._call_hooks("on_gone", snap))

    def _call_hooks(self, which: str, node: SimNode) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, which)(node)
            except Exception:
                log.exception("tpu-sim: hook %s failed for %s", which, node.name)

    # ---- helpers ------------------------------------------------------------------------------
    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        if delay_s <= 0:
            fn()
            return

        def locked() -> None:
            with self._lock:
                fn()

        self.clock.call_later(delay_s, locked)

    def _resolve(self, name: str) -> str:
        if name in self._nodes:
            return name
        matches = [n for n in self._nodes if n.rsplit("/", 1)[-1] == name]
        if len(matches) != 1:
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Resource '{name}' was not found")
        return matches[0]

    def _validate(self, zone: str, node_id: str, node: tpu.Node) -> str:
        """The node's accelerator type, after the checks the real API makes synchronously."""
        if zone not in self.zones:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f'Zone "{zone}" is not a valid location')
        if not _NODE_ID_RE.match(node_id or ""):
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid node id {node_id!r}: must match [a-z]([-a-z0-9]{{0,61}}[a-z0-9])?",
            )
        accel = node.accelerator_type
        if node.accelerator_config.topology:
            if accel:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT, "Set accelerator_type or accelerator_config, not both"
                )
            accel = type_from_config(node.accelerator_config.type_.name, node.accelerator_config.topology)
        valid = self.zones[zone]
        if accel not in valid:
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'CloudTpu received an invalid AcceleratorType, "{accel}" for zone "{zone}". '
                f"Valid values are {', '.join(valid)}.",
            )
        if not node.runtime_version:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "runtime_version is required")
        for key, value in node.labels.items():
            if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(value):
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'resource labels are invalid: key "{key}" value "{value}" must be lowercase letters, '
                    "digits, '-' or '_', at most 63 characters",
                )
        return accel

    def _quota(self, zone: str, accel: str, preemptible: bool) -> None:
        if self.faults.take(FaultKind.QUOTA, zone, accel):
            raise SimError(grpc.StatusCode.RESOURCE_EXHAUSTED, quota_message(zone, accel, preemptible))

    def _plan(self, zone: str, accel: str, reserved: bool, queued: bool) -> _Plan:
        plan = _Plan()
        if reserved and self.faults.take(FaultKind.RESERVATION, zone, accel):
            plan.outcome, plan.message = "reservation", reservation_message()
        elif not reserved and self.faults.take(FaultKind.STOCK_OUT, zone, accel):
            plan.outcome, plan.message = "stock_out", stock_out_message(zone)
        elif queued and self.faults.take(FaultKind.STAY_WAITING, zone, accel):
            plan.outcome = "stuck"
        preempt = self.faults.take(FaultKind.PREEMPT, zone, accel)
        if preempt is not None:
            plan.preempt_after_s = preempt.after_s
        return plan

    def _new_node(self, name: str, spec: tpu.Node, accel: str, api: str, queued_resource: str) -> tpu.Node:
        node = _copy(spec)
        node.name = name
        node.accelerator_type = accel
        node.accelerator_config = tpu.AcceleratorConfig()
        node.state = NodeState.CREATING
        node.create_time = _ts()
        node.id = random.getrandbits(62)
        # v2alpha1's ApiVersion enum stops at V2_ALPHA1 (3); v2's V2 is 4, kept as the open enum's number.
        tpu.Node.pb(node).api_version = 4 if api == versions.V2 else tpu.Node.ApiVersion.V2_ALPHA1
        node.queued_resource = queued_resource
        endpoints = []
        for _ in range(parse_tpu_type(accel).hosts):
            self._ips += 1
            endpoints.append(
                tpu.NetworkEndpoint(ip_address=f"10.130.{self._ips // 250}.{self._ips % 250 + 2}", port=8470)
            )
        node.network_endpoints = endpoints
        return node

    # ---- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        if self._path is None:
            return
        data = {
            "nodes": {n: json.loads(tpu.Node.to_json(v)) for n, v in self._nodes.items()},
            "queued_resources": {n: json.loads(tpu.QueuedResource.to_json(v)) for n, v in self._qrs.items()},
            "plans": {
                n: {
                    "outcome": p.outcome,
                    "message": p.message,
                    "preempt_after_s": p.preempt_after_s,
                    "nodes": p.nodes,
                }
                for n, p in self._plans.items()
            },
            "pending_nodes": {
                q: [[n, a, json.loads(tpu.Node.to_json(s))] for n, a, s in items]
                for q, items in self._pending_nodes.items()
            },
            "announced": sorted(self._announced),
        }
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self._path)

    def _load(self, path: Path) -> None:
        """Reload a saved state and resume what was in flight (operations are not kept: a client
        polling one from before the restart gets NOT_FOUND)."""
        data = json.loads(path.read_text())
        with self._lock:
            self._nodes = _ByName({n: tpu.Node.from_json(json.dumps(v)) for n, v in data["nodes"].items()})
            self._qrs = _ByName(
                {n: tpu.QueuedResource.from_json(json.dumps(v)) for n, v in data["queued_resources"].items()}
            )
            self._plans = {n: _Plan(**p) for n, p in data["plans"].items()}
            self._pending_nodes.update(
                {
                    q: [(n, a, tpu.Node.from_json(json.dumps(s))) for n, a, s in items]
                    for q, items in data["pending_nodes"].items()
                }
            )
            self._announced = set(data["announced"])
            self._ips = len(self._nodes) * 8
            for name, qr in self._qrs.items():
                state = qr.state.state
                if state == QrState.CREATING:
                    self._later(self.latency.admit_s, lambda n=name: self._qr_admitted(n))
                elif state == QrState.WAITING_FOR_RESOURCES and self._plans[name].outcome != "stuck":
                    step = self._qr_failed if self._plans[name].outcome != "ok" else self._qr_provision
                    self._later(self.latency.queue_s, lambda n=name, s=step: s(n))
                elif state == QrState.PROVISIONING:
                    self._later(self.latency.provision_s, lambda n=name: self._qr_activate(n))
                elif state == QrState.DELETING:
                    self._later(self.latency.delete_s, lambda n=name: self._qr_deleted(n))
            for name, node in self._nodes.items():
                if node.state == NodeState.CREATING and not node.queued_resource:
                    self._later(self.latency.provision_s, lambda n=name: self._node_created(n))


class _ByName(dict):
    """Resources by full name, with their names kept sorted for listings (a zone's page is found by
    bisection instead of scanning every zone's names on every page)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sorted: list[str] | None = None

    def sorted_names(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self)
        return self._sorted

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self:
            self._sorted = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._sorted = None
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._sorted = None
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Any]:
        self._sorted = None
        return super().popitem()

    def clear(self) -> None:
        self._sorted = None
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._sorted = None
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._sorted = None
        return super().setdefault(key, default)


def _pick(items: _ByName, parent: str, kind: str, pager: Pager | None) -> tuple[list[str], str]:
    """The sorted names of `kind` (nodes, queuedResources) under `parent` (zone `-`: every zone of the
    project), paged by `pager`."""
    _, zone = split_parent(parent)
    every = items.sorted_names()
    if zone == "-":
        in_project, middle = parent.removesuffix("-"), f"/{kind}/"
        names = [n for n in every if n.startswith(in_project) and middle in n]
    else:
        prefix = f"{parent}/{kind}/"
        names = every[bisect.bisect_left(every, prefix) : bisect.bisect_left(every, prefix + "\U0010ffff")]
    return pager(names) if pager is not None else (names, "")


def _copy(msg: T) -> T:
    """A deep copy (a proto-plus wrapper around another message's pb would share and alias it)."""
    return type(msg).deserialize(type(msg).serialize(msg))


def _tier(qr: tpu.QueuedResource) -> str:
    """reserved | spot | best_effort | guaranteed | on_demand (the v2alpha1 `tier` oneof)."""
    which = tpu.QueuedResource.pb(qr).WhichOneof("tier")
    if which == "guaranteed" and qr.guaranteed.reserved or qr.reservation_name:
        return "reserved"
    return which or "on_demand"


def _sim_node(node: tpu.Node, state: str) -> SimNode:
    _, zone = split_parent(node.name.split("/nodes/")[0])
    return SimNode(
        name=node.name,
        node_id=node.name.rsplit("/", 1)[-1],
        zone=zone,
        accelerator_type=node.accelerator_type,
        hosts=len(node.network_endpoints) or 1,
        labels=dict(node.labels),
        metadata=dict(node.metadata),
        queued_resource=node.queued_resource,
        state=state,
    )
