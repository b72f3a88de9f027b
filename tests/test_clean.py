"""clean-preempted against the TPU simulator through the real clients: only the cluster's PREEMPTED /
TERMINATED TPU VMs go (Ray's autoscaled ones by Ray's label, add-worker's by ours), a dry run deletes
nothing, twice is fine, and it is refused while another operation holds the cluster's lock."""

# ruff: noqa: F811  (the fixtures ctx and sim come from test_workers)
from __future__ import annotations

import json

import pytest
from google.cloud import tpu_v2

from ops.clean import clean_preempted, owner_of
from ops.context import Context
from ops.errors import Refused
from ops.locks import acquire, current_lock
from ops.sim import SimServer
from ops.workers import Settings, add_worker
from tests.test_workers import ZONE, _cli, ctx, sim  # noqa: F401 - the same simulator and context

FAST = Settings(timeout_s=10, lease_s=30)


def ray_node(ctx: Context, node_id: str, ray_cluster: str) -> str:
    """A TPU VM as Ray's GCP provider creates one: Ray's labels, no queued resource."""
    api = ctx.tpu(ctx.cluster("local"))
    node = tpu_v2.Node(
        accelerator_type="v4-8",
        runtime_version="tpu-ubuntu2204-base",
        labels={"ray-cluster-name": ray_cluster, "ray-node-type": "worker"},
        scheduling_config=tpu_v2.SchedulingConfig(preemptible=True),
    )
    api.clients.v2.create_node(parent=api.parent(ZONE), node=node, node_id=node_id).result(timeout=10)
    return f"{api.parent(ZONE)}/nodes/{node_id}"


def terminate(sim: SimServer, name: str) -> None:
    """Maintenance ended a preemptible VM (TERMINATED). The simulator has no fault for it yet: set the
    state under its lock, as its own transitions do."""
    with sim.state._lock:
        sim.state._nodes[name].state = tpu_v2.Node.State.TERMINATED


def states(ctx: Context) -> dict[str, str]:
    return {n.node_id: n.state for n in ctx.tpu(ctx.cluster("local")).list_nodes(ZONE)}


@pytest.fixture
def cloud(ctx: Context, sim: SimServer) -> dict[str, str]:
    """Ray's workers of local (one READY, one PREEMPTED, one TERMINATED), another cluster's PREEMPTED one,
    and two of add-worker's (one READY, one PREEMPTED)."""
    ray_node(ctx, "ray-local-ok", "cb-local")
    sim.state.preempt(ray_node(ctx, "ray-local-preempted", "cb-local"))
    terminate(sim, ray_node(ctx, "ray-local-terminated", "cb-local"))
    sim.state.preempt(ray_node(ctx, "ray-other-preempted", "cb-other"))
    ours = add_worker(ctx, "v4-8", "spot", by="alice", cluster="local", key="a", settings=FAST)
    lost = add_worker(ctx, "v4-8", "spot", by="bob", cluster="local", key="b", settings=FAST)
    sim.state.preempt(lost.workers[0].qr_id)
    return {"ours": ours.workers[0].qr_id, "lost": lost.workers[0].qr_id}


def test_bob_cleans_local_and_only_its_dead_vms_go(ctx: Context, cloud: dict[str, str]) -> None:
    dry = clean_preempted(ctx, "local", by="bob", dry_run=True)
    gone = {"ray-local-preempted", "ray-local-terminated", cloud["lost"]}
    assert {i.name for i in dry.items} == gone and all(i.outcome == "listed" for i in dry.items)
    assert {i.owner for i in dry.items} == {"ray", "clusterbot"}
    assert len(states(ctx)) == 6  # a dry run deletes nothing

    lines: list[str] = []
    result = clean_preempted(ctx, "local", by="bob", progress=lines.append)
    assert result.ok and {i.name: i.outcome for i in result.items} == dict.fromkeys(gone, "deleted")
    assert states(ctx) == {
        "ray-local-ok": "READY",
        "ray-other-preempted": "PREEMPTED",
        cloud["ours"]: "READY",
    }
    assert (
        ctx.tpu(ctx.cluster("local")).get_queued_resource(
            f"projects/proj/locations/{ZONE}/queuedResources/{cloud['lost']}"
        )
        is None
    )  # the preempted worker's queued resource went with it
    assert len(lines) == 3 and current_lock(ctx.store, "local") is None
    assert "deleted 3 of 3" in result.summary()

    again = clean_preempted(ctx, "local", by="bob")
    assert again.ok and again.items == [] and "no preempted or terminated" in again.summary()


def test_refused_while_another_operation_holds_the_lock(ctx: Context, cloud: dict[str, str]) -> None:
    lease = acquire(ctx.store, "local", "local-restart-9", "restart", "carol", 30)
    try:
        with pytest.raises(Refused, match="restart local-restart-9 by carol"):
            clean_preempted(ctx, "local", by="bob")
        assert len(clean_preempted(ctx, "local", by="bob", dry_run=True).items) == 3  # reading is fine
        code, _, err = _cli(ctx, "clean-preempted", "--cluster", "local")
        assert code == 3 and "local-restart-9" in err
    finally:
        lease.release()
    assert len(states(ctx)) == 6
    code, out, _ = _cli(ctx, "clean-preempted", "--cluster", "local", "--json")
    assert code == 0 and len(json.loads(out)["items"]) == 3


def test_whose_vm_it_is_by_its_labels(ctx: Context) -> None:
    """What clean-preempted and the health check's cloud read share (ops.status.read_cloud)."""
    local = ctx.cluster("local")
    assert owner_of({"ray-cluster-name": local.ray_cluster_name}, local) == "ray"
    assert owner_of({"clusterbot-cluster": "local"}, local) == "clusterbot"
    assert owner_of({"ray-cluster-name": "cb-other", "clusterbot-cluster": "other"}, local) is None
