"""ops.gcp.tpu against the TPU simulator through the real clients: idempotent creates, waiting to ACTIVE,
each capacity failure ending in one clear message with nothing left behind, transient errors retried,
the v2alpha1 delete quirk, idempotent deletes, accelerator types per zone."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from google.cloud import tpu_v2, tpu_v2alpha1

from ops.errors import BadInput, OpsError, Refused
from ops.gcp.tpu import (
    LABEL_CLUSTER,
    LABEL_OWNER,
    Capacity,
    CapacityError,
    Failure,
    TpuApi,
    default_retry,
    queued_resource_id,
    tpu_clients,
)
from ops.sim import FaultKind, Latency, SimServer

ZONE = "local-sim-a"
LABELS = {LABEL_CLUSTER: "local", LABEL_OWNER: "alice"}
SCRIPT = "#!/bin/bash\nray start --address=$HEAD:6379\n"


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(latency=Latency(queue_s=0.02, provision_s=0.02)) as server:
        yield server


@pytest.fixture
def api(sim: SimServer) -> Iterator[TpuApi]:
    clients = tpu_clients(sim.address)
    yield TpuApi(
        clients, "proj", retry=default_retry(deadline_s=5, initial_s=0.01, maximum_s=0.05), poll_s=0.01
    )
    clients.close()


def nothing_left(api: TpuApi) -> bool:
    return api.list_queued_resources(ZONE) == [] and api.list_nodes(ZONE) == []


def test_ids_and_capacity_words() -> None:
    qr_id = queued_resource_id("local", "v6e-8", "op-20261124-1", 0)
    assert qr_id == queued_resource_id("local", "v6e-8", "op-20261124-1", 0)
    assert qr_id != queued_resource_id("local", "v6e-8", "op-20261124-1", 1)
    long_id = queued_resource_id("a-very-long-cluster-name-" * 4, "v5litepod-16", "x")
    for text in (qr_id, long_id):
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", text)
    assert (
        Capacity.parse("preemptible") is Capacity.SPOT
        and Capacity.parse("best_effort") is Capacity.BEST_EFFORT
    )
    with pytest.raises(BadInput, match="unknown capacity"):
        Capacity.parse("cheap")


def test_alice_adds_a_v6e_8_and_sees_it_become_active(api: TpuApi) -> None:
    seen: list[str] = []
    qr_id = queued_resource_id("local", "v6e-8", "op-1")
    info = api.provision(
        ZONE,
        qr_id,
        "v6e-8",
        Capacity.RESERVED,
        LABELS,
        SCRIPT,
        timeout_s=10,
        progress=lambda i: seen.append(i.state),
    )
    assert info.state == "ACTIVE" and info.capacity == "reserved"
    assert seen[0] == "WAITING_FOR_RESOURCES" and seen[-1] == "ACTIVE"
    [node] = api.list_nodes(ZONE, {LABEL_CLUSTER: "local"})
    assert node.state == "READY" and node.queued_resource == info.name and node.node_id == qr_id
    assert not any(k.startswith("ray-") for k in node.labels)  # Ray's autoscaler must not adopt it
    assert node.labels["clusterbot-capacity"] == "reserved"
    raw = api.clients.v2.get_node(name=node.name)
    assert raw.metadata["startup-script"] == SCRIPT and raw.scheduling_config.reserved
    assert api.list_nodes(ZONE, {LABEL_CLUSTER: "other"}) == []


def test_create_twice_makes_one_queued_resource(api: TpuApi) -> None:
    qr_id = queued_resource_id("local", "v4-8", "op-2")
    first = api.create_queued_resource(ZONE, qr_id, "v4-8", Capacity.SPOT, LABELS)
    again = api.create_queued_resource(ZONE, qr_id, "v4-8", Capacity.SPOT, LABELS)
    assert first.name == again.name
    assert [q.name for q in api.list_queued_resources(ZONE, LABELS)] == [first.name]
    with pytest.raises(Refused, match="not from this request"):
        api.create_queued_resource(ZONE, qr_id, "v4-8", Capacity.SPOT, {**LABELS, LABEL_OWNER: "bob"})


def test_already_exists_of_our_own_request_counts_as_created(api: TpuApi) -> None:
    """Our first request went through but its reply was lost, and the retry carries no request id match
    (say a restarted bot): it meets AlreadyExists, and the queued resource is ours by its labels."""
    qr_id = queued_resource_id("local", "v5litepod-4", "op-3")
    a = tpu_v2alpha1
    node = a.Node(
        accelerator_type="v5litepod-4",
        runtime_version="v2-alpha-tpuv5-lite",
        labels={**LABELS, "clusterbot-capacity": "best-effort"},
    )
    spec = a.QueuedResource.Tpu.NodeSpec(parent=api.parent(ZONE), node_id=qr_id, node=node)
    api.clients.alpha.create_queued_resource(
        parent=api.parent(ZONE),
        queued_resource_id=qr_id,
        queued_resource=a.QueuedResource(
            tpu=a.QueuedResource.Tpu(node_spec=[spec]), best_effort=a.QueuedResource.BestEffort()
        ),
    ).result(timeout=10)
    again = api.create_queued_resource(ZONE, qr_id, "v5litepod-4", Capacity.BEST_EFFORT, LABELS)
    assert again.qr_id == qr_id and len(api.list_queued_resources(ZONE, LABELS)) == 1


@pytest.mark.parametrize(
    ("fault", "capacity", "kind", "says"),
    [
        ({"kind": FaultKind.QUOTA}, Capacity.SPOT, Failure.QUOTA, "quota for v6e-8 in local-sim is used up"),
        ({"kind": FaultKind.STOCK_OUT}, Capacity.SPOT, Failure.STOCK_OUT, "no v6e-8 capacity in local-sim-a"),
        ({"kind": FaultKind.STOCK_OUT}, Capacity.BEST_EFFORT, Failure.STOCK_OUT, "(stock-out)"),
        (
            {"kind": FaultKind.RESERVATION},
            Capacity.RESERVED,
            Failure.RESERVATION,
            "reservation has no free v6e-8",
        ),
        (
            {"kind": FaultKind.STAY_WAITING},
            Capacity.SPOT,
            Failure.TIMEOUT,
            "not ready after 0.3 s (still WAITING",
        ),
    ],
)
def test_each_fault_ends_in_one_message_and_nothing_left(
    sim: SimServer, api: TpuApi, fault: dict, capacity: Capacity, kind: Failure, says: str
) -> None:
    sim.fault(**fault, zone=ZONE)
    with pytest.raises(CapacityError) as caught:
        api.provision(
            ZONE, queued_resource_id("local", "v6e-8", "op-f"), "v6e-8", capacity, LABELS, timeout_s=0.3
        )
    error = caught.value
    assert error.kind is kind and says in error.reason, error.reason
    assert error.reason.endswith("Nothing is left in the cloud.") and error.left == []
    assert nothing_left(api)


def test_a_503_before_success_is_retried_and_quota_is_not(sim: SimServer, api: TpuApi) -> None:
    sim.fault(FaultKind.UNAVAILABLE, method="CreateQueuedResource", times=2)
    sim.fault(FaultKind.UNAVAILABLE, method="GetQueuedResource", times=1)
    sim.fault(FaultKind.UNAVAILABLE, method="ListAcceleratorTypes", times=1)
    assert "v4-8" in api.accelerator_types(ZONE)
    info = api.provision(
        ZONE, queued_resource_id("local", "v4-8", "op-r"), "v4-8", Capacity.SPOT, LABELS, timeout_s=10
    )
    assert info.state == "ACTIVE" and sim.state.faults.armed() == []

    sim.fault(FaultKind.QUOTA, times=2)
    with pytest.raises(CapacityError, match="quota"):
        api.create_queued_resource(
            ZONE, queued_resource_id("local", "v4-8", "op-q"), "v4-8", Capacity.SPOT, LABELS
        )
    assert [f.times for f in sim.state.faults.armed()] == [1]  # asked once: a permanent error


def test_transient_errors_past_the_deadline_say_so(sim: SimServer, sim_api_short: TpuApi) -> None:
    sim.fault(FaultKind.UNAVAILABLE, method="CreateQueuedResource", times=None)
    with pytest.raises(OpsError, match="kept failing transiently"):
        sim_api_short.create_queued_resource(ZONE, "cb-x-0", "v4-8", Capacity.SPOT, LABELS)
    sim.state.faults.clear()
    assert sim_api_short.list_queued_resources(ZONE) == []


@pytest.fixture
def sim_api_short(sim: SimServer) -> Iterator[TpuApi]:
    clients = tpu_clients(sim.address)
    yield TpuApi(
        clients, "proj", retry=default_retry(deadline_s=0.3, initial_s=0.01, maximum_s=0.05), poll_s=0.01
    )
    clients.close()


@pytest.mark.parametrize("delete_s", [0.0, 0.05])
def test_delete_queued_resource_despite_the_v2alpha1_quirk(
    sim: SimServer, api: TpuApi, delete_s: float
) -> None:
    """With delete_s 0 the TypeError comes from the call, else from result() after polling."""
    info = api.provision(
        ZONE, queued_resource_id("local", "v4-8", "op-d"), "v4-8", Capacity.SPOT, LABELS, timeout_s=10
    )
    sim.state.latency = sim.state.latency.model_copy(update={"delete_s": delete_s})
    assert api.delete_queued_resource(info.name) is True
    assert api.get_queued_resource(info.name) is None and nothing_left(api)
    assert api.delete_queued_resource(info.name) is False  # already gone is done


def test_delete_node_is_idempotent(api: TpuApi) -> None:
    op = api.clients.v2.create_node(
        parent=api.parent(ZONE), node_id="w-1", node=tpu_v2.Node(accelerator_type="v4-8", runtime_version="x")
    )
    node = op.result(timeout=10)
    assert api.get_node(node.name).state == "READY"
    assert api.delete_node(node.name) is True
    assert api.delete_node(node.name) is False
    assert api.get_node(node.name) is None


def test_types_per_zone_cached_and_checked(sim: SimServer, api: TpuApi) -> None:
    assert api.accelerator_types("local-sim-b") == ["v5litepod-1", "v5litepod-4", "v5litepod-8"]
    sim.fault(FaultKind.UNAVAILABLE, method="ListAcceleratorTypes", times=None)  # the cache answers now
    api.check_type("local-sim-b", "v5litepod-4")
    with pytest.raises(BadInput, match="local-sim-b offers no v6e-8") as caught:
        api.check_type("local-sim-b", "v6e-8")
    assert "v5litepod-1, v5litepod-4, v5litepod-8" in caught.value.hint
