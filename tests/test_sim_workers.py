"""The local cluster's TPU VMs come from the simulator beside its head: a node created through the real
Cloud TPU client becomes Ray workers on the head (one per host, the slice's head resource on host 0),
deleting or preempting it takes them away, the autoscaler launches through the same API (and fails to
under a stock-out), and `stop` leaves neither a worker process nor an autoscaled VM.

One session head (tests/localray.py) with its simulator; small types (v4-8, v4-16) for 2 cores.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import psutil
import pytest
from google.cloud import tpu_v2

from ops.drivers.local import LocalDriver
from ops.gcp.tpu import TpuApi, tpu_clients
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.sim.control import SimControl
from ops.sim.workers import CLUSTER_LABEL, NODE_MARKER, RAY_CLUSTER_LABEL
from tests.localray import SECRET_CANARY_VAR, wait_for

JOIN_TIMEOUT_S = 180.0  # a raylet registers in ~5 s alone, far slower on 2 loaded cores
GONE_TIMEOUT_S = 60.0  # Ray marks a node DEAD when its raylet goes (or after missed heartbeats)


@pytest.fixture
def driver(local_cluster: Cluster) -> LocalDriver:
    driver = LocalDriver(local_cluster)
    driver.start()  # idempotent; a test that stopped the cluster leaves it to the next one to start
    return driver


@pytest.fixture
def tpu(driver: LocalDriver) -> Iterator[TpuApi]:
    api = TpuApi(tpu_clients(driver.tpu_endpoint()), driver.cluster.project)
    yield api
    api.clients.close()


def control(driver: LocalDriver) -> SimControl:
    return SimControl(json.loads((driver.sim_dir / "sim.json").read_text())["control_url"])


def create_node(tpu: TpuApi, cluster: Cluster, accelerator_type: str) -> str:
    """A TPU VM of the cluster as add-worker makes one (our label, not Ray's); its full name, READY."""
    node_id = f"t-{accelerator_type}-{secrets.token_hex(3)}"
    op = tpu.clients.v2.create_node(
        parent=tpu.parent(cluster.zone),
        node_id=node_id,
        node=tpu_v2.Node(accelerator_type=accelerator_type, runtime_version="tpu-ubuntu2204-base",
                         labels={CLUSTER_LABEL: cluster.name}),
    )  # fmt: skip
    return op.result(timeout=60).name


def alive_workers(cluster: Cluster) -> list[dict]:
    return [n for n in RayApi(cluster).nodes() if n["state"] == "ALIVE" and not n.get("is_head_node")]


def launch_failure(api: RayApi) -> dict | None:
    """The autoscaler's last failed launch of tpu-v4-8 as the dashboard reports it (v1 autoscaler:
    nodeAvailabilitySummary), with its time as `at`; None while that type is available."""
    report = api._get("/api/cluster_status")["data"]["clusterStatus"]["autoscalerReport"]
    summary = (report.get("nodeAvailabilitySummary") or {}).get("nodeAvailabilities") or {}
    entry = summary.get("tpu-v4-8")
    if not entry or entry["isAvailable"]:
        return None
    return {**entry["unavailableNodeInformation"], "at": entry["lastCheckedTimestamp"]}


def vm_processes(node_id: str) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(NODE_MARKER) == node_id:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def test_a_v4_8_created_through_the_api_joins_the_head_and_leaves_when_deleted(
    driver: LocalDriver, tpu: TpuApi
) -> None:
    cluster = driver.cluster
    name = create_node(tpu, cluster, "v4-8")
    node_id = name.rsplit("/", 1)[-1]
    joined = wait_for(
        lambda: [n for n in alive_workers(cluster) if "TPU-v4-8-head" in n["resources_total"]],
        JOIN_TIMEOUT_S,
        "the v4-8's Ray worker to join the head",
        interval=1,
    )
    assert joined[0]["resources_total"]["TPU"] == 4
    # A VM has nothing of ours: no secret of the process that started the simulator; the head's token.
    for pid in vm_processes(node_id):
        env = psutil.Process(pid).environ()
        assert SECRET_CANARY_VAR not in env and env["RAY_AUTH_MODE"] == "token"

    assert tpu.delete_node(name)
    wait_for(lambda: not vm_processes(node_id), GONE_TIMEOUT_S, "the deleted VM's processes to end")
    wait_for(
        lambda: not [n for n in alive_workers(cluster) if "TPU-v4-8-head" in n["resources_total"]],
        GONE_TIMEOUT_S,
        "Ray to see the deleted VM's worker gone",
        interval=1,
    )


def test_a_v4_16_gives_two_raylets_with_the_head_resource_on_host_0_and_a_preemption_ends_both(
    driver: LocalDriver, tpu: TpuApi
) -> None:
    cluster = driver.cluster
    name = create_node(tpu, cluster, "v4-16")
    node_id = name.rsplit("/", 1)[-1]
    workers = wait_for(
        lambda: (
            (w := [n for n in alive_workers(cluster) if n["resources_total"].get("TPU")])
            and len(w) == 2
            and w
        ),
        JOIN_TIMEOUT_S,
        "both hosts of the v4-16 to join",
        interval=1,
    )
    heads = [w for w in workers if "TPU-v4-16-head" in w["resources_total"]]
    assert len(heads) == 1 and all(w["resources_total"]["TPU"] == 4 for w in workers)
    # As a real TPU VM's raylets: the slice's name as a resource and a label on every host, worker ids.
    assert all(w["resources_total"].get(node_id) == 1 for w in workers)
    assert {w["labels"].get("ray.io/tpu-slice-name") for w in workers} == {node_id}
    assert sorted(w["labels"].get("ray.io/tpu-worker-id") for w in workers) == ["0", "1"]
    assert heads[0]["labels"]["ray.io/tpu-worker-id"] == "0"

    control(driver).preempt(name)
    wait_for(lambda: not vm_processes(node_id), GONE_TIMEOUT_S, "the preempted VM's processes to end")
    wait_for(lambda: not alive_workers(cluster), GONE_TIMEOUT_S, "Ray to see both hosts gone", interval=1)
    assert tpu.get_node(name).state == "PREEMPTED"  # still there, counting against quota
    tpu.delete_node(name)


def test_a_vm_added_by_hand_survives_a_stop_and_rejoins_the_next_head(
    driver: LocalDriver, tpu: TpuApi
) -> None:
    cluster = driver.cluster
    name = create_node(tpu, cluster, "v4-8")
    node_id = name.rsplit("/", 1)[-1]
    wait_for(lambda: alive_workers(cluster), JOIN_TIMEOUT_S, "the VM's worker to join", interval=1)

    driver.stop()
    assert not vm_processes(node_id)
    state = json.loads((driver.sim_dir / "state.json").read_text())
    assert name in state["nodes"]  # add-worker's VMs are not Ray's to delete

    driver.start()
    wait_for(
        lambda: alive_workers(cluster), JOIN_TIMEOUT_S, "the VM's worker to rejoin the new head", interval=1
    )
    assert tpu.delete_node(name)
    wait_for(lambda: not vm_processes(node_id), GONE_TIMEOUT_S, "the deleted VM's processes to end")
    wait_for(lambda: not alive_workers(cluster), GONE_TIMEOUT_S, "Ray to see the VM gone", interval=1)


def test_the_autoscaler_keeps_failing_under_a_stock_out_and_launches_when_it_clears(
    driver: LocalDriver, tpu: TpuApi
) -> None:
    cluster = driver.cluster
    # Demand only the autoscaler can meet: no TPU worker left by an earlier test (Ray may still count
    # a deleted VM's raylet alive for a moment, and would place the job there).
    wait_for(lambda: not alive_workers(cluster), GONE_TIMEOUT_S, "no TPU worker in Ray", interval=1)
    sim = control(driver)
    sim.add_fault("stock_out", zone=cluster.zone, accelerator_type="v4-8", times=None)
    api = RayApi(cluster)
    job = api.submit(entrypoint="python -c 'print(42)'", entrypoint_resources={"TPU-v4-8-head": 1})
    try:
        first = wait_for(
            lambda: launch_failure(api), JOIN_TIMEOUT_S, "a failed launch in /api/cluster_status"
        )
        assert first["category"] == "ResourceExhausted" and "no more capacity" in first["description"]
        # It keeps trying, and keeps failing: a later attempt, failed as well.
        wait_for(
            lambda: (f := launch_failure(api)) and f["at"] > first["at"],
            JOIN_TIMEOUT_S,
            "another failed launch",
            interval=1,
        )
        launched = tpu.list_nodes(cluster.zone, {RAY_CLUSTER_LABEL: cluster.ray_cluster_name})
        assert all(n.state == "CREATING" for n in launched), launched  # a retry in flight at most
        assert api.status(job) == "PENDING"

        sim.clear_faults()
        wait_for(lambda: api.status(job) == "SUCCEEDED", JOIN_TIMEOUT_S, "the job to run on a launched VM")
        launched = tpu.list_nodes(cluster.zone, {RAY_CLUSTER_LABEL: cluster.ray_cluster_name})
        assert [n.state for n in launched] == ["READY"]
    finally:
        sim.clear_faults()
        api.stop(job)

    # `local down` (the driver's stop) deletes what the autoscaler launched and leaves no VM process.
    vm_ids = [n.node_id for n in launched]
    sim_pid = json.loads((driver.sim_dir / "sim.json").read_text())["pid"]
    said = driver.stop()
    assert "1 autoscaled TPU VMs deleted" in said, said
    assert not psutil.pid_exists(sim_pid)
    assert not [pid for vm in vm_ids for pid in vm_processes(vm)]
    assert not driver._our_processes()
    state = json.loads((driver.sim_dir / "state.json").read_text())
    left = [n for n, v in state["nodes"].items() if v.get("labels", {}).get(RAY_CLUSTER_LABEL)]
    assert not left, left
