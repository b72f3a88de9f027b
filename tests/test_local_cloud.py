"""The local cluster is GCP-shaped, end to end through the CLI: `add-worker --cluster local v4-8
--capacity reserved` goes through the Cloud TPU API (the simulator), a Ray node with `TPU-v4-8-head`
joins the head, the ledger shows it, and a restart keeps it serving the new head."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ops.context import Context
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.workers import ledger
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
    added = ops_env.ops("add-worker", "v4-8", "--capacity", "reserved", "--cluster", "local",
                        "--reason", "eval sweep", "--as", "alice", "--json")  # fmt: skip
    assert added.code == 0, added
    wait_for(lambda: v4_8_workers(cluster), JOIN_TIMEOUT_S, "the reserved v4-8 to join the head", interval=1)
    view = ops_env.ops("workers", "--cluster", "local", "--json")
    assert view.code == 0, view
    assert "alice" in view.out and "eval sweep" in view.out

    restarted = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes", "--json")

    assert restarted.code == 0, restarted
    assert any("v4-8" in line for line in restarted.json()["workers"]), restarted.out
    wait_for(lambda: v4_8_workers(cluster), JOIN_TIMEOUT_S, "the v4-8 to serve the new head", interval=1)

    gone = ops_env.ops("clean-preempted", "--cluster", "local", "--dry-run", "--json")
    assert gone.code == 0, gone  # nothing preempted: the worker is READY and stays
    assert v4_8_workers(cluster)
