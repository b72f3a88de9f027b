"""The local cluster's Ray node provider: Ray's fake multi-node provider, whose launches and terminations
go through the Cloud TPU API of the simulator, so that a stock-out fails the autoscaler's launches as on GCP.

What Ray 2.60 allows here (read from ray/autoscaler/_private/providers.py and fake_multi_node/):
- `provider: {type: external, module: "ops.sim.node_provider.SimTpuNodeProvider", ...}`: Ray imports the
  class by its dotted path (`_import_external` -> `load_function_or_class`) in the monitor process, which
  runs with the head's environment and Python (our venv, where `ops` is installed). Every other key of
  the provider section reaches the constructor as `provider_config`.
- Subclassing `FakeMultiNodeProvider` keeps what the fake cluster needs (RAY_FAKE_CLUSTER=1, the head's
  entry, `use_node_id_as_ip` so that a node's "IP" is its Ray node id). Its own create starts a raylet in
  the monitor's process; we override create and terminate instead, and the raylets are started by what a
  VM does when it boots (ops/sim/workers.py, the simulator's on_ready hook), with the Ray node id we
  chose, passed in the TPU node's metadata.
- A launch that raises `NodeLaunchException` is counted as failed with its category and description:
  Ray's v1 autoscaler shows it under "Recent failures" in `ray status` and the dashboard's
  /api/cluster_status, and logs it in monitor.log; any other exception is logged only. The autoscaler
  then tries again on its next update (every AUTOSCALER_UPDATE_INTERVAL_S).
- `non_terminated_nodes` is asked every update: we answer from the TPU API (the nodes labelled with this
  cluster's `ray-cluster-name`, in the states Ray's GCP provider counts as non-terminated), so a node
  deleted or preempted in the cloud is gone for Ray as well, and a restarted monitor finds its nodes.
Tags are kept as the node's labels, as Ray's GCP provider does.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import threading
from pathlib import Path
from typing import Any

from google.api_core import exceptions
from google.cloud import tpu_v2
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.tags import (
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_CLUSTER_NAME,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from ops.gcp.tpu import TpuApi, tpu_clients
from ops.sim.workers import RAY_NODE_ID_KEY

log = logging.getLogger(__name__)

RAY_NODE_ID_LABEL = "ray-node-id"
# Ray's GCP provider: a TPU VM in any other state is terminated (SP/ray/autoscaler/_private/gcp/node.py).
NON_TERMINATED = ("CREATING", "STARTING", "RESTARTING", "READY")
LAUNCH_TIMEOUT_S = 300.0
_LABEL_VALUE = re.compile(r"[^a-z0-9_-]")


def sim_endpoint(state_dir: Path) -> str:
    """The simulator's gRPC address from its sim.json (written by `python -m ops.sim` once it serves)."""
    return json.loads((state_dir / "sim.json").read_text())["address"]


def label_value(text: str) -> str:
    """A tag value as a GCP label value (lowercase letters, digits, `_`, `-`; at most 63)."""
    return _LABEL_VALUE.sub("-", str(text).lower())[:63]


class SimTpuNodeProvider(FakeMultiNodeProvider):
    """provider_config: `sim_state_dir` (where sim.json is), `project`, `zone`, plus the fake provider's."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._sim_dir = Path(provider_config["sim_state_dir"])
        self._project = provider_config["project"]
        self._zone = provider_config["zone"]
        self._api_lock = threading.Lock()
        self._api_at: tuple[str, TpuApi] | None = None
        self._seen: dict[str, tuple[str, dict[str, str]]] = {}  # Ray node id -> (TPU node name, labels)
        self._tag_overrides: dict[str, dict[str, str]] = {}

    # -- the TPU API ----------------------------------------------------------------------------
    def _api(self) -> TpuApi:
        """Clients on the simulator's current address (it may have been restarted on another port)."""
        endpoint = sim_endpoint(self._sim_dir)
        with self._api_lock:
            if self._api_at is None or self._api_at[0] != endpoint:
                if self._api_at is not None:
                    self._api_at[1].clients.close()
                self._api_at = (endpoint, TpuApi(tpu_clients(endpoint), self._project))
            return self._api_at[1]

    def _parent(self) -> str:
        return f"projects/{self._project}/locations/{self._zone}"

    def _refresh(self) -> None:
        """Our TPU VMs as the API lists them now; the last listing stays when the API does not answer
        (the monitor must not die of a simulator restart)."""
        try:
            nodes = self._api().list_nodes(self._zone, {TAG_RAY_CLUSTER_NAME: label_value(self.cluster_name)})
        except (OSError, ValueError, KeyError, exceptions.GoogleAPICallError, exceptions.RetryError) as e:
            log.warning("cannot list the TPU VMs of %s: %s", self.cluster_name, e)
            return
        seen = {}
        for node in nodes:
            ray_id = node.labels.get(RAY_NODE_ID_LABEL)
            if ray_id and node.state in NON_TERMINATED:
                seen[ray_id] = (node.name, node.labels)
        with self.lock:
            self._seen = seen

    # -- NodeProvider ---------------------------------------------------------------------------
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        self._refresh()
        return [
            node_id
            for node_id in self._all_ids()
            if all(self.node_tags(node_id).get(k) == v for k, v in tag_filters.items())
        ]

    def _all_ids(self) -> list[str]:
        with self.lock:
            return [*self._nodes, *self._seen]

    def is_running(self, node_id: str) -> bool:
        with self.lock:
            return node_id in self._nodes or node_id in self._seen

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self.lock:
            if node_id in self._nodes:
                return self._nodes[node_id]["tags"]
            _, labels = self._seen.get(node_id, ("", {}))
            return {**labels, **self._tag_overrides.get(node_id, {})}

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        """Kept in memory (labels are what a restarted monitor reads; nothing we need survives there)."""
        with self.lock:
            self._tag_overrides.setdefault(node_id, {}).update(tags)

    def create_node_with_resources_and_labels(
        self,
        node_config: dict[str, Any],
        tags: dict[str, str],
        count: int,
        resources: dict[str, float],
        labels: dict[str, str],
    ) -> dict[str, Any]:
        """One TPU VM per node, created through the API and waited for (READY) as Ray's GCP provider
        does; a capacity error fails the launch with its message."""
        created = {}
        for _ in range(count):
            ray_id = secrets.token_hex(28)
            name = self._create(node_config, tags, ray_id)
            created[ray_id] = name
        return created

    def _create(self, node_config: dict[str, Any], tags: dict[str, str], ray_id: str) -> str:
        node_type = tags[TAG_RAY_USER_NODE_TYPE]
        node_id = f"{label_value(self.cluster_name)}-{label_value(node_type)}-{ray_id[:8]}"
        all_tags = {
            **tags,
            TAG_RAY_CLUSTER_NAME: self.cluster_name,
            TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
            TAG_RAY_NODE_NAME: node_id,
            TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,  # no updaters: the VM's boot starts Ray
            RAY_NODE_ID_LABEL: ray_id,
        }
        scheduling = node_config.get("schedulingConfig", {})
        node = tpu_v2.Node(
            accelerator_type=node_config["acceleratorType"],
            runtime_version=node_config.get("runtimeVersion", ""),
            labels={k: label_value(v) for k, v in all_tags.items()},
            metadata={RAY_NODE_ID_KEY: ray_id},
            scheduling_config=tpu_v2.SchedulingConfig(
                preemptible=bool(scheduling.get("preemptible", False)),
                spot=bool(scheduling.get("spot", False)),
            ),
        )
        api = self._api()
        try:
            op = api.clients.v2.create_node(
                parent=self._parent(), node=node, node_id=node_id, retry=api.retry
            )
            op.result(timeout=LAUNCH_TIMEOUT_S)
        except exceptions.GoogleAPICallError as e:
            category = type(e).__name__[:19]
            log.warning("TPU node %s (%s) not created: %s", node_id, node_config["acceleratorType"], e)
            raise NodeLaunchException(category, f"{node_id}: {e.message}", sys.exc_info()) from e
        log.info("TPU node %s READY for Ray node %s", node_id, ray_id)
        return node_id

    def terminate_node(self, node_id: str) -> None:
        """Delete the TPU VM (already gone counts as done); the simulator's on_gone hook stops its Ray."""
        with self.lock:
            name, _ = self._seen.pop(node_id, ("", {}))
            self._tag_overrides.pop(node_id, None)
        if not name:
            self._refresh()
            with self.lock:
                name, _ = self._seen.pop(node_id, ("", {}))
        if name:
            self._api().delete_node(name)
