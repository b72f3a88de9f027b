"""Listings of the TPU simulator through the real google-cloud-tpu clients: pages as the client's pager
follows them (a zone's own nodes only, `locations/-` for the project), a bad page token, a node that
changes after a v2 client listed it, TpuApi.list_nodes across pages, and the latency every call takes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2, tpu_v2alpha1
from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport as V2Transport
from google.cloud.tpu_v2alpha1.services.tpu.transports import TpuGrpcTransport as AlphaTransport

from ops.gcp.tpu import TpuApi, tpu_clients
from ops.sim import Latency, SimServer, versions

ZONE_A, ZONE_B = "zone-a", "zone-b"
PARENT_A, PARENT_B = f"projects/proj/locations/{ZONE_A}", f"projects/proj/locations/{ZONE_B}"


@pytest.fixture
def sim() -> Iterator[SimServer]:
    """Zone a with 7 v4-8 VMs (w-0 with Ray's label), zone b with 2 v4-16, another project with one;
    the simulator answers a List without page_size in pages of 3."""
    zones = {ZONE_A: ("v4-8",), ZONE_B: ("v4-16",)}
    with SimServer(latency=Latency(queue_s=0, provision_s=0), zones=zones) as server:
        server.state.page_size = 3
        for parent, accel, count in ((PARENT_A, "v4-8", 7), (PARENT_B, "v4-16", 2)):
            for i in range(count):
                labels = {"ray-cluster-name": "cb-a"} if i == 0 else {}
                node = tpu_v2alpha1.Node(accelerator_type=accel, runtime_version="x", labels=labels)
                server.state.create_node(parent, f"w-{i}", node, versions.V2)
        other = tpu_v2alpha1.Node(accelerator_type="v4-8", runtime_version="x")
        server.state.create_node("projects/other/locations/zone-a", "w-0", other, versions.V2)
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


def test_a_zone_is_listed_in_pages(v2: tpu_v2.TpuClient, alpha: tpu_v2alpha1.TpuClient) -> None:
    pages = list(v2.list_nodes(parent=PARENT_A).pages)
    assert [len(p.nodes) for p in pages] == [3, 3, 1] and [p.next_page_token for p in pages][-1] == ""
    assert [n.name for p in pages for n in p.nodes] == [f"{PARENT_A}/nodes/w-{i}" for i in range(7)]
    assert [len(p.nodes) for p in v2.list_nodes(request={"parent": PARENT_A, "page_size": 5}).pages] == [5, 2]
    assert [n.name.rsplit("/", 1)[1] for n in alpha.list_nodes(parent=PARENT_B)] == ["w-0", "w-1"]
    everywhere = [n.name for n in v2.list_nodes(parent="projects/proj/locations/-")]
    assert len(everywhere) == 9 and not any(n.startswith("projects/other/") for n in everywhere)


def test_a_page_token_of_our_own_making_is_invalid_argument(v2: tpu_v2.TpuClient) -> None:
    with pytest.raises(exceptions.InvalidArgument):
        list(v2.list_nodes(request={"parent": PARENT_A, "page_token": "not-a-token"}))


def test_a_v2_client_sees_a_node_change_after_listing_it(sim: SimServer, v2: tpu_v2.TpuClient) -> None:
    """v2 answers are converted from the state's v2alpha1 messages and the conversion is kept: a node
    that changed is converted again."""
    assert {n.state for n in v2.list_nodes(parent=PARENT_A)} == {tpu_v2.Node.State.READY}
    sim.state.preempt(f"{PARENT_A}/nodes/w-3")
    states = {n.name.rsplit("/", 1)[1]: n.state for n in v2.list_nodes(parent=PARENT_A)}
    assert states["w-3"] == tpu_v2.Node.State.PREEMPTED
    assert [k for k, v in states.items() if v != tpu_v2.Node.State.READY] == ["w-3"]
    assert v2.get_node(name=f"{PARENT_A}/nodes/w-3").state == tpu_v2.Node.State.PREEMPTED


def test_tpu_api_lists_every_page_and_filters_by_label(sim: SimServer) -> None:
    clients = tpu_clients(sim.address)
    try:
        api = TpuApi(clients, "proj")
        nodes = api.list_nodes(ZONE_A)
        assert [n.node_id for n in nodes] == [f"w-{i}" for i in range(7)]
        assert {(n.zone, n.state, n.accelerator_type, n.hosts) for n in nodes} == {
            (ZONE_A, "READY", "v4-8", 1)
        }
        (ray,) = api.list_nodes(ZONE_A, labels={"ray-cluster-name": "cb-a"})
        assert (
            ray.node_id == "w-0" and ray.labels == {"ray-cluster-name": "cb-a"} and len(ray.ip_addresses) == 1
        )
        b = api.get_node(f"{PARENT_B}/nodes/w-1")
        assert b is not None and b.hosts == 2 and len(b.ip_addresses) == 2 and b.queued_resource == ""
    finally:
        clients.close()


def test_every_call_takes_call_s_and_calls_overlap(sim: SimServer, v2: tpu_v2.TpuClient) -> None:
    sim.state.latency = Latency(queue_s=0, provision_s=0, call_s=0.25)
    name = f"{PARENT_A}/nodes/w-0"
    started = time.monotonic()
    v2.get_node(name=name)
    assert time.monotonic() - started >= 0.25
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: v2.get_node(name=name), range(4)))
    assert time.monotonic() - started < 0.75  # one after another would take 1 s
