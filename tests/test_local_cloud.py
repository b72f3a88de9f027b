"""The local cluster is GCP-shaped, end to end through the CLI: `build-image --regions local-sim` pins an
image (simulated Cloud Build and Artifact Registry), `add-worker --cluster local v4-8 --capacity reserved`
goes through the Cloud TPU API (the simulator) with that image in its startup script, a Ray node with
`TPU-v4-8-head` joins the head, the ledger shows it, and a restart (which starts on the pinned image)
keeps it serving the new head."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from ops.context import Context
from ops.images import behind, started
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.workers import due_workers, ledger
from tests.localray import Env, wait_for

JOIN_TIMEOUT_S = 180


def v4_8_workers(cluster: Cluster) -> list[dict]:
    """Alive Ray nodes that are a v4-8 slice's host 0."""
    return [n for n in RayApi(cluster).nodes()
            if n.get("state") == "ALIVE" and "TPU-v4-8-head" in (n.get("resources_total") or {})]  # fmt: skip


@pytest.fixture
def no_reserved_left(cluster: Cluster) -> Iterator[None]:
    """The workers a test adds are deleted after it (the cloud's and the ledger's): later tests of the
    session share this cluster."""
    yield
    ctx = Context()
    try:
        for record in ledger(ctx, cluster.name):
            ctx.tpu(cluster).delete_queued_resource(record.qr_name, force=True)
            ctx.store.delete(f"workers/{cluster.name}/{record.qr_id}.json")
    finally:
        ctx.close()
    wait_for(lambda: not v4_8_workers(cluster), JOIN_TIMEOUT_S, "the reserved v4-8 to leave", interval=1)


def test_a_reserved_worker_joins_and_serves_the_head_after_a_restart(
    ops_env: Env, cluster: Cluster, no_reserved_left: None
) -> None:
    # The image first: built through the simulated Cloud Build into the local region's registry and
    # pinned; the worker's startup script and the restart's start both take the pin.
    built = ops_env.ops("build-image", "--regions", "local-sim", "--as", "alice", "--json",
                        extra_env={"CLUSTERBOT_GIT_SHA": "abc1234"})  # fmt: skip
    assert built.code == 0, built
    [pin] = built.json()["pins"].values()
    assert pin["tag"].startswith("abc1234-") and "local" in built.json()["to_restart"]

    added = ops_env.ops("add-worker", "v4-8", "--capacity", "reserved", "--cluster", "local",
                        "--reason", "eval sweep", "--as", "alice", "--json")  # fmt: skip
    assert added.code == 0, added
    ctx = Context()
    try:
        [record] = ledger(ctx, "local")
        api = ctx.tpu(cluster)
        node = api.clients.v2.get_node(name=f"{api.parent(record.zone)}/nodes/{record.qr_id}")
        assert f"{pin['tag']}@{pin['digest']}" in node.metadata["startup-script"]
    finally:
        ctx.close()
    wait_for(lambda: v4_8_workers(cluster), JOIN_TIMEOUT_S, "the reserved v4-8 to join the head", interval=1)
    view = ops_env.ops("workers", "--cluster", "local", "--json")
    assert view.code == 0, view
    assert "alice" in view.out and "eval sweep" in view.out

    restarted = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes", "--json")

    assert restarted.code == 0, restarted
    assert any("v4-8" in line for line in restarted.json()["workers"]), restarted.out
    ctx = Context()
    try:
        assert started(ctx, "local").tag == pin["tag"]  # the start ran the pinned image
        assert behind(ctx, ["local"]) == []
    finally:
        ctx.close()
    wait_for(lambda: v4_8_workers(cluster), JOIN_TIMEOUT_S, "the v4-8 to serve the new head", interval=1)

    gone = ops_env.ops("clean-preempted", "--cluster", "local", "--dry-run", "--json")
    assert gone.code == 0, gone  # nothing preempted: the worker is READY and stays
    assert v4_8_workers(cluster)


def test_an_idle_worker_is_due_to_whoever_added_it_and_a_busy_one_is_not(
    ops_env: Env, cluster: Cluster, no_reserved_left: None
) -> None:
    added = ops_env.ops("add-worker", "v4-8", "--capacity", "reserved", "--cluster", "local",
                        "--as", "alice", "--json")  # fmt: skip
    assert added.code == 0, added
    wait_for(lambda: v4_8_workers(cluster), JOIN_TIMEOUT_S, "the reserved v4-8 to join the head", interval=1)
    ctx = Context()
    try:
        [record] = ledger(ctx, "local")
        later = record.added_at + timedelta(hours=3)
        [due] = due_workers(ctx, "local", now=later)
        assert (due.qr_id, due.kind, due.added_by) == (record.qr_id, "idle", "alice")
        assert due.since == record.added_at
        assert due_workers(ctx, "local", now=record.added_at + timedelta(hours=1)) == []

        # A job whose driver needs the slice's head resource runs on it: the worker is busy.
        api = RayApi(cluster)
        job = api.submit(entrypoint="python -c 'import time; time.sleep(120)'",
                         entrypoint_resources={"TPU-v4-8-head": 1})  # fmt: skip
        try:
            wait_for(lambda: api.status(job) == "RUNNING", JOIN_TIMEOUT_S, "the job on the v4-8 to run")
            assert due_workers(ctx, "local", now=later) == []
            [record] = ledger(ctx, "local")
            assert record.busy_at == later  # idle time now counts from this check
        finally:
            api.stop(job)
        node = v4_8_workers(cluster)[0]["node_id"]
        wait_for(lambda: not api.state("actors", ("node_id", "=", node), ("state", "=", "ALIVE")),
                 JOIN_TIMEOUT_S, "the stopped job's supervisor to leave the v4-8")  # fmt: skip
        [due] = due_workers(ctx, "local", now=later + timedelta(hours=2, minutes=1))
        assert due.kind == "idle" and due.since == later
    finally:
        ctx.close()
