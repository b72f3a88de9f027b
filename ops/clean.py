"""clean-preempted: delete a cluster's PREEMPTED / TERMINATED TPU VMs, which serve nobody and still count
against quota (GCP_API_FACTS.md 1.4, 2.4), and our queued resources left FAILED or SUSPENDED.

A VM is the cluster's when it carries Ray's `ray-cluster-name` label (the autoscaler's workers) or our
`clusterbot-cluster` label (add-worker's). Deletes run in parallel and are idempotent: one already gone
counts as done. A VM that came from a queued resource goes with it (the queued resource owns the VM).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from google.api_core import exceptions
from pydantic import BaseModel, Field

from ops.errors import OpsError
from ops.gcp.tpu import LABEL_CLUSTER, NodeInfo, QueuedResourceInfo, label_value
from ops.locks import acquire

if TYPE_CHECKING:
    from ops.context import Context
    from ops.locks import Lease
    from ops.registry import Cluster

RAY_CLUSTER_LABEL = "ray-cluster-name"  # Ray's own (GCP_API_FACTS.md 2.1)
DEAD_NODE_STATES = ("PREEMPTED", "TERMINATED")
DEAD_QR_STATES = ("FAILED", "SUSPENDED")
PARALLEL = 16
Progress = Callable[[str], None]


class Cleaned(BaseModel):
    name: str  # the TPU VM's (or the queued resource's) id
    kind: str  # node | queued-resource
    state: str  # what it was in: PREEMPTED, TERMINATED, FAILED, SUSPENDED
    accelerator_type: str
    owner: str  # ray (the autoscaler's) | clusterbot (add-worker's)
    outcome: str = "listed"  # listed (dry run) | deleted | already gone | failed
    error: str | None = None


class CleanResult(BaseModel):
    cluster: str
    zone: str
    dry_run: bool
    items: list[Cleaned] = Field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(i.outcome == "failed" for i in self.items)

    def summary(self) -> str:
        if not self.items:
            return f"{self.cluster}: no preempted or terminated TPU VMs in {self.zone}"
        verb = "would delete" if self.dry_run else "deleted"
        done = [i for i in self.items if i.outcome in ("listed", "deleted", "already gone")]
        lines = [
            f"{self.cluster}: {verb} {len(done)} of {len(self.items)} in {self.zone} ({self.seconds:.1f}s)"
        ]
        for i in self.items:
            note = f": {i.error}" if i.error else ""
            lines.append(
                f"  {i.name} ({i.kind}, {i.accelerator_type}, {i.owner}, {i.state}): {i.outcome}{note}"
            )
        return "\n".join(lines)


def owner_of(labels: dict[str, str], cluster: Cluster) -> str | None:
    """Whose TPU VM or queued resource of `cluster` this is, by its labels: "ray" (the autoscaler's),
    "clusterbot" (add-worker's), or None when it is not the cluster's."""
    if labels.get(RAY_CLUSTER_LABEL) == cluster.ray_cluster_name:
        return "ray"
    if labels.get(LABEL_CLUSTER) == label_value(cluster.name):
        return "clusterbot"
    return None


def find_dead(ctx: Context, cluster: Cluster) -> list[tuple[Cleaned, NodeInfo | QueuedResourceInfo]]:
    """The cluster's dead TPU VMs, and its queued resources that are FAILED / SUSPENDED with no VM."""
    api = ctx.tpu(cluster)
    nodes = api.list_nodes(cluster.zone)
    found: list[tuple[Cleaned, NodeInfo | QueuedResourceInfo]] = []
    qr_of_dead: set[str] = set()
    for node in nodes:
        owner = owner_of(node.labels, cluster)
        if owner is not None and node.state in DEAD_NODE_STATES:
            found.append((Cleaned(name=node.node_id, kind="node", state=node.state,
                                  accelerator_type=node.accelerator_type, owner=owner), node))  # fmt: skip
            if node.queued_resource:
                qr_of_dead.add(node.queued_resource)
    with_nodes = {n.queued_resource for n in nodes if n.queued_resource}
    for qr in api.list_queued_resources(cluster.zone):
        owner = owner_of(qr.labels, cluster)
        if owner is None or qr.state not in DEAD_QR_STATES or qr.name in with_nodes:
            continue
        found.append((Cleaned(name=qr.qr_id, kind="queued-resource", state=qr.state,
                              accelerator_type=qr.accelerator_type, owner=owner), qr))  # fmt: skip
    return found


def clean_preempted(
    ctx: Context,
    cluster_name: str,
    *,
    by: str,
    dry_run: bool = False,
    progress: Progress | None = None,
    lease: Lease | None = None,
    lease_s: float | None = None,
) -> CleanResult:
    """Delete the cluster's dead TPU VMs in parallel (a dry run only lists them). Holds the cluster's
    lock (`lease` when the caller took it, as the bot does; else taken here, Refused while another
    operation holds it); a dry run takes none."""
    cluster = ctx.cluster(cluster_name)
    started = time.monotonic()
    found = find_dead(ctx, cluster)
    result = CleanResult(
        cluster=cluster.name, zone=cluster.zone, dry_run=dry_run, items=[c for c, _ in found]
    )
    if dry_run or not found:
        result.seconds = time.monotonic() - started
        return result
    own = None
    if lease is None:
        op_id = f"{cluster.name}-clean-preempted-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        lease_s = lease_s or float(os.environ.get("CLUSTERBOT_LEASE_S", 60))
        own = acquire(ctx.store, cluster.name, op_id, "clean-preempted", by, lease_s)
        own.start_renewing()
    api = ctx.tpu(cluster)

    def delete(item: tuple[Cleaned, NodeInfo | QueuedResourceInfo]) -> Cleaned:
        cleaned, what = item
        try:
            if isinstance(what, NodeInfo) and what.queued_resource:
                gone = api.delete_queued_resource(what.queued_resource)  # takes its VM with it
                gone = api.delete_node(what.name) or gone  # and the VM, should it outlive its QR
            elif isinstance(what, NodeInfo):
                gone = api.delete_node(what.name)
            else:
                gone = api.delete_queued_resource(what.name)
        except (OpsError, exceptions.GoogleAPICallError, exceptions.RetryError) as e:
            cleaned = cleaned.model_copy(update={"outcome": "failed", "error": str(e)})
        else:
            cleaned = cleaned.model_copy(update={"outcome": "deleted" if gone else "already gone"})
        if progress is not None:
            progress(f"{cleaned.name}: {cleaned.outcome}")
        return cleaned

    try:
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(found)), thread_name_prefix="clean") as pool:
            result.items = list(pool.map(delete, found))
    finally:
        if own is not None:
            own.release()
    result.seconds = time.monotonic() - started
    return result
