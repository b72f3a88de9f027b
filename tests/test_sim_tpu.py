"""The TPU simulator through the real google-cloud-tpu clients (v2 and v2alpha1) over gRPC: nodes, queued
resources, LROs, accelerator types, the v2alpha1 delete quirk, each fault, and the process mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2, tpu_v2alpha1
from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport as V2Transport
from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport as AlphaTransport

from ops.sim import FaultKind, Latency, SimNode, SimServer
from ops.sim.control import SimControl

ROOT = Path(__file__).resolve().parents[1]
PARENT = "projects/proj/locations/local-sim-a"
QrState = tpu_v2alpha1.QueuedResourceState.State
FAST = Latency(queue_s=0.02, provision_s=0.02)


class Recorder:
    """Hooks that remember what the simulator announced, with an event per node name."""

    def __init__(self) -> None:
        self.ready: list[SimNode] = []
        self.gone: list[SimNode] = []
        self._cond = threading.Condition()

    def on_ready(self, node: SimNode) -> None:
        with self._cond:
            self.ready.append(node)
            self._cond.notify_all()

    def on_gone(self, node: SimNode) -> None:
        with self._cond:
            self.gone.append(node)
            self._cond.notify_all()

    def wait(self, pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(pred, timeout_s), "the simulator did not announce it in time"


@pytest.fixture
def hooks() -> Recorder:
    return Recorder()


@pytest.fixture
def sim(hooks: Recorder) -> Iterator[SimServer]:
    with SimServer(latency=FAST, hooks=[hooks]) as server:
        yield server


@pytest.fixture
def channel(sim: SimServer) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(sim.address)
    yield ch
    ch.close()


@pytest.fixture
def v2(channel: grpc.Channel) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(transport=V2Transport(channel=channel))


@pytest.fixture
def alpha(channel: grpc.Channel) -> tpu_v2alpha1.TpuClient:
    return tpu_v2alpha1.TpuClient(transport=AlphaTransport(channel=channel))


def alpha_qr(node_id: str, accel: str = "v6e-8", **tier: object) -> tpu_v2alpha1.QueuedResource:
    node = tpu_v2alpha1.Node(
        accelerator_type=accel,
        runtime_version="v2-alpha-tpuv6e",
        labels={"clusterbot-cluster": "local"},
        metadata={"startup-script": "#!/bin/bash\necho hi"},
    )
    spec = tpu_v2alpha1.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id=node_id, node=node)
    return tpu_v2alpha1.QueuedResource(tpu=tpu_v2alpha1.QueuedResource.Tpu(node_spec=[spec]), **tier)


def v2_node(accel: str = "v4-8", **kw: object) -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type=accel, runtime_version="tpu-ubuntu2204-base", **kw)


def wait_state(alpha: tpu_v2alpha1.TpuClient, name: str, state: int, timeout_s: float = 10.0) -> object:
    """The API has no events: poll the queued resource, bounded."""
    deadline = time.monotonic() + timeout_s
    while True:
        qr = alpha.get_queued_resource(name=name)
        if qr.state.state == state:
            return qr
        assert time.monotonic() < deadline, f"{name} stayed {qr.state.state.name}"
        time.sleep(0.01)


# ---- accelerator types --------------------------------------------------------------------------
def test_accelerator_types_are_paged_per_zone(v2: tpu_v2.TpuClient, alpha: tpu_v2alpha1.TpuClient) -> None:
    pager = v2.list_accelerator_types(parent=PARENT)
    pages = list(pager.pages)
    assert len(pages) > 1 and pages[0].next_page_token  # the real pager follows the tokens
    names = [t.type_ for page in pages for t in page.accelerator_types]
    for want in ("v4-8", "v4-16", "v5litepod-4", "v5litepod-8", "v6e-4", "v6e-8"):
        assert want in names
    assert [t.type_ for t in alpha.list_accelerator_types(parent="projects/proj/locations/local-sim-b")] == [
        "v5litepod-1",
        "v5litepod-4",
        "v5litepod-8",
    ]
    v4 = v2.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v4-16")
    assert v4.accelerator_configs[0].type_ == tpu_v2.AcceleratorConfig.Type.V4
    assert v4.accelerator_configs[0].topology == "2x2x2"
    with pytest.raises(exceptions.NotFound):
        v2.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v3-8")


# ---- nodes ---------------------------------------------------------------------------------------
def test_v2_node_is_created_ready_listed_and_deleted(v2: tpu_v2.TpuClient, hooks: Recorder) -> None:
    op = v2.create_node(
        parent=PARENT,
        node_id="w-1",
        node=v2_node("v4-16", labels={"clusterbot-cluster": "local"}, metadata={"startup-script": "x"}),
    )
    node = op.result(timeout=10)
    assert node.name == f"{PARENT}/nodes/w-1" and node.state == tpu_v2.Node.State.READY
    assert len(node.network_endpoints) == 2  # v4-16: two hosts
    assert node.api_version == tpu_v2.Node.ApiVersion.V2
    assert op.metadata.verb == "create" and op.metadata.target == node.name
    hooks.wait(lambda: len(hooks.ready) == 1)
    assert hooks.ready[0].hosts == 2 and hooks.ready[0].metadata == {"startup-script": "x"}
    assert [n.name for n in v2.list_nodes(parent=PARENT)] == [node.name]
    assert v2.get_node(name=node.name).labels["clusterbot-cluster"] == "local"

    v2.delete_node(name=node.name).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        v2.get_node(name=node.name)
    hooks.wait(lambda: [n.state for n in hooks.gone] == ["DELETED"])
    with pytest.raises(exceptions.NotFound):
        v2.delete_node(name=node.name)


def test_node_requests_checked_like_the_api(v2: tpu_v2.TpuClient) -> None:
    with pytest.raises(exceptions.InvalidArgument, match='invalid AcceleratorType, "v5p-8".*Valid values'):
        v2.create_node(parent=PARENT, node_id="w-2", node=v2_node("v5p-8"))
    with pytest.raises(exceptions.InvalidArgument, match="labels are invalid"):
        v2.create_node(parent=PARENT, node_id="w-2", node=v2_node(labels={"owner": "a.b"}))
    with pytest.raises(exceptions.InvalidArgument, match="node id"):
        v2.create_node(parent=PARENT, node_id="W_2", node=v2_node())
    v2.create_node(parent=PARENT, node_id="w-2", node=v2_node()).result(timeout=10)
    with pytest.raises(exceptions.AlreadyExists, match="already exists"):
        v2.create_node(parent=PARENT, node_id="w-2", node=v2_node())


# ---- queued resources ----------------------------------------------------------------------------
def test_v2alpha1_queued_resource_lifecycle_and_delete_quirk(
    v2: tpu_v2.TpuClient, alpha: tpu_v2alpha1.TpuClient, hooks: Recorder
) -> None:
    op = alpha.create_queued_resource(
        parent=PARENT,
        queued_resource_id="qr-1",
        queued_resource=alpha_qr("qr-1", best_effort=tpu_v2alpha1.QueuedResource.BestEffort()),
    )
    qr = op.result(timeout=10)  # done at admission, as Google's sample shows
    assert qr.state.state == QrState.WAITING_FOR_RESOURCES
    assert op.metadata.api_version == "v2alpha1"
    hooks.wait(lambda: len(hooks.ready) == 1)
    qr = alpha.get_queued_resource(name=qr.name)
    assert qr.state.state == QrState.ACTIVE and "best_effort" in qr
    node = v2.get_node(name=f"{PARENT}/nodes/qr-1")
    assert node.state == tpu_v2.Node.State.READY and node.queued_resource == qr.name
    assert node.scheduling_config.preemptible and node.metadata["startup-script"].startswith("#!")
    # v2 has no best_effort: a v2 client sees the same QR without a tier.
    assert v2.get_queued_resource(name=qr.name).state.state == tpu_v2.QueuedResourceState.State.ACTIVE
    assert [q.name for q in alpha.list_queued_resources(parent=PARENT)] == [qr.name]

    with pytest.raises(exceptions.FailedPrecondition):
        alpha.delete_queued_resource(name=qr.name)  # force=False with a live node
    # The server answers Empty, v2alpha1 declares QueuedResource: TypeError, from the call itself when
    # the operation is already done in its reply (api_core's Operation reads it at once), else from result().
    with pytest.raises(TypeError, match="google.protobuf.Empty"):
        alpha.delete_queued_resource(
            request=tpu_v2alpha1.DeleteQueuedResourceRequest(name=qr.name, force=True)
        ).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        alpha.get_queued_resource(name=qr.name)
    assert list(v2.list_nodes(parent=PARENT)) == []
    hooks.wait(lambda: [n.name for n in hooks.gone] == [node.name])


def test_v2_queued_resource_delete_returns_empty(v2: tpu_v2.TpuClient, alpha: tpu_v2alpha1.TpuClient) -> None:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="qr-2", node=v2_node("v5litepod-4"))
    qr = v2.create_queued_resource(
        parent=PARENT,
        queued_resource_id="qr-2",
        queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), spot=tpu_v2.QueuedResource.Spot()
        ),
    ).result(timeout=10)
    assert "spot" in alpha.get_queued_resource(name=qr.name)  # one state behind both versions
    v2.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=qr.name, force=True)).result(
        timeout=10
    )
    with pytest.raises(exceptions.NotFound):
        v2.get_queued_resource(name=qr.name)


def test_reserved_queued_resource_and_idempotent_create(
    v2: tpu_v2.TpuClient, alpha: tpu_v2alpha1.TpuClient, hooks: Recorder
) -> None:
    reserved = alpha_qr("qr-3", guaranteed=tpu_v2alpha1.QueuedResource.Guaranteed(reserved=True))
    request = tpu_v2alpha1.CreateQueuedResourceRequest(
        parent=PARENT, queued_resource_id="qr-3", queued_resource=reserved, request_id="req-1"
    )
    first = alpha.create_queued_resource(request=request)
    again = alpha.create_queued_resource(request=request)  # same request_id: the same operation
    assert first.operation.name == again.operation.name
    with pytest.raises(exceptions.AlreadyExists, match="queuedResources/qr-3' already exists"):
        alpha.create_queued_resource(parent=PARENT, queued_resource_id="qr-3", queued_resource=reserved)
    hooks.wait(lambda: len(hooks.ready) == 1)
    assert v2.get_node(name=f"{PARENT}/nodes/qr-3").scheduling_config.reserved


def test_admission_latency_is_polled_through_get_operation(
    sim: SimServer, alpha: tpu_v2alpha1.TpuClient
) -> None:
    sim.state.latency = Latency(admit_s=0.05, queue_s=0.02, provision_s=0.02)
    op = alpha.create_queued_resource(
        parent=PARENT, queued_resource_id="qr-4", queued_resource=alpha_qr("qr-4")
    )
    assert not op.done()  # CREATING: the client must poll google.longrunning.Operations
    assert op.result(timeout=10).state.state == QrState.WAITING_FOR_RESOURCES


# ---- faults --------------------------------------------------------------------------------------
def test_quota_fails_the_create_request(
    sim: SimServer, alpha: tpu_v2alpha1.TpuClient, v2: tpu_v2.TpuClient
) -> None:
    sim.fault(FaultKind.QUOTA, zone="local-sim-a", times=2)
    with pytest.raises(
        exceptions.ResourceExhausted, match="Quota limit 'TPUV6EPreemptible.*in region local-sim"
    ):
        alpha.create_queued_resource(
            parent=PARENT,
            queued_resource_id="q",
            queued_resource=alpha_qr("q", spot=tpu_v2alpha1.QueuedResource.Spot()),
        )
    with pytest.raises(exceptions.ResourceExhausted, match="Quota limit 'TPUV4sPod"):
        v2.create_node(parent=PARENT, node_id="n", node=v2_node())
    assert list(alpha.list_queued_resources(parent=PARENT)) == [] and list(v2.list_nodes(parent=PARENT)) == []


def test_stock_out_fails_the_node_operation(sim: SimServer, v2: tpu_v2.TpuClient) -> None:
    sim.fault(FaultKind.STOCK_OUT, zone="local-sim-a")
    op = v2.create_node(parent=PARENT, node_id="n", node=v2_node())  # the request itself succeeds
    with pytest.raises(exceptions.ResourceExhausted, match='no more capacity in the zone "local-sim-a"'):
        op.result(timeout=10)
    assert list(v2.list_nodes(parent=PARENT)) == []


@pytest.mark.parametrize(
    ("kind", "tier", "message"),
    [
        (
            FaultKind.STOCK_OUT,
            {"spot": tpu_v2alpha1.QueuedResource.Spot()},
            "There is no more capacity in the zone",
        ),
        (
            FaultKind.RESERVATION,
            {"guaranteed": tpu_v2alpha1.QueuedResource.Guaranteed(reserved=True)},
            "Insufficient reserved capacity",
        ),
    ],
)
def test_capacity_faults_fail_the_queued_resource(
    sim: SimServer, alpha: tpu_v2alpha1.TpuClient, kind: FaultKind, tier: dict, message: str
) -> None:
    sim.fault(kind, accelerator_type="v6e-8")
    qr = alpha.create_queued_resource(
        parent=PARENT, queued_resource_id="q", queued_resource=alpha_qr("q", **tier)
    ).result(timeout=10)
    failed = wait_state(alpha, qr.name, QrState.FAILED)
    assert failed.state.failed_data.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert message in failed.state.failed_data.error.message
    with pytest.raises(TypeError):  # FAILED: deleted without force (the v2alpha1 quirk again)
        alpha.delete_queued_resource(name=qr.name)
    with pytest.raises(exceptions.NotFound):
        alpha.get_queued_resource(name=qr.name)


def test_unavailable_then_success(sim: SimServer, v2: tpu_v2.TpuClient) -> None:
    sim.fault(FaultKind.UNAVAILABLE, method="ListNodes", times=1)
    with pytest.raises(exceptions.ServiceUnavailable):
        v2.list_nodes(parent=PARENT)  # TPU RPCs have no default retry (GCP_API_FACTS 0.3)
    assert list(v2.list_nodes(parent=PARENT)) == []


def test_preempted_later(
    sim: SimServer, alpha: tpu_v2alpha1.TpuClient, v2: tpu_v2.TpuClient, hooks: Recorder
) -> None:
    sim.fault(FaultKind.PREEMPT, after_s=0.05)
    qr = alpha.create_queued_resource(
        parent=PARENT,
        queued_resource_id="q",
        queued_resource=alpha_qr("q", spot=tpu_v2alpha1.QueuedResource.Spot()),
    ).result(timeout=10)
    hooks.wait(lambda: [n.state for n in hooks.gone] == ["PREEMPTED"])
    assert v2.get_node(name=f"{PARENT}/nodes/q").state == tpu_v2.Node.State.PREEMPTED  # still counts
    assert alpha.get_queued_resource(name=qr.name).state.state == QrState.SUSPENDED
    v2.delete_node(name=f"{PARENT}/nodes/q").result(timeout=10)
    assert len(hooks.gone) == 1  # gone once: its workers were already stopped


def test_stays_waiting_for_resources(sim: SimServer, alpha: tpu_v2alpha1.TpuClient, hooks: Recorder) -> None:
    sim.fault(FaultKind.STAY_WAITING, accelerator_type="v6e-8")
    stuck = alpha.create_queued_resource(
        parent=PARENT, queued_resource_id="stuck", queued_resource=alpha_qr("stuck")
    ).result(timeout=10)
    alpha.create_queued_resource(
        parent=PARENT, queued_resource_id="other", queued_resource=alpha_qr("other", "v6e-8")
    ).result(timeout=10)
    hooks.wait(lambda: [n.node_id for n in hooks.ready] == ["other"])  # later one provisioned meanwhile
    assert alpha.get_queued_resource(name=stuck.name).state.state == QrState.WAITING_FOR_RESOURCES


# ---- process mode --------------------------------------------------------------------------------
def _start_process(state_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ops.sim",
            "--state-dir",
            str(state_dir),
            "--queue-s",
            "0.02",
            "--provision-s",
            "0.02",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    for line in proc.stderr:  # the log line says it serves (sim.json is written just before)
        if "tpu-sim serving" in line:
            return proc
        assert time.monotonic() < deadline
    proc.kill()
    raise AssertionError(f"the simulator exited with {proc.wait(5)}")


def _stop_process(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_process_mode_starts_answers_persists_and_stops(tmp_path: Path) -> None:
    proc = _start_process(tmp_path)
    try:
        info = json.loads((tmp_path / "sim.json").read_text())
        assert info["pid"] == proc.pid
        with grpc.insecure_channel(info["address"]) as ch:
            v2 = tpu_v2.TpuClient(transport=V2Transport(channel=ch))
            assert v2.create_node(parent=PARENT, node_id="kept", node=v2_node()).result(timeout=10).state == 2
            control = SimControl(info["control_url"])
            control.add_fault("unavailable", method="GetNode")
            assert control.state()["faults"][0]["kind"] == "unavailable"
            with pytest.raises(exceptions.ServiceUnavailable):
                v2.get_node(name=f"{PARENT}/nodes/kept")
            control.preempt("kept")
            assert control.state()["nodes"] == {f"{PARENT}/nodes/kept": "PREEMPTED"}
    finally:
        assert _stop_process(proc) == 0
    assert not (tmp_path / "sim.json").exists()

    proc = _start_process(tmp_path)  # the state survives a restart
    try:
        info = json.loads((tmp_path / "sim.json").read_text())
        with grpc.insecure_channel(info["address"]) as ch:
            v2 = tpu_v2.TpuClient(transport=V2Transport(channel=ch))
            assert v2.get_node(name=f"{PARENT}/nodes/kept").state == tpu_v2.Node.State.PREEMPTED
    finally:
        assert _stop_process(proc) == 0
    assert not os.path.exists(f"/proc/{proc.pid}")
