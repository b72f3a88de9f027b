"""What a simulated TPU VM does when it boots: its Ray workers join the local head, and go when it goes.

On GCP the cluster's startup script runs on every host of a TPU node and starts `ray start --address`
with the cluster's image and token. Here the simulator calls `VmBoot.on_ready(node)` when a node of the
local cluster is READY: one `ray start --block` per host (a v4-16 has two), host 0 alone carrying
`TPU-<type>-head`, every host `TPU: <chips per host>`, from a minimal environment (the head's token and
Ray's settings, nothing of ours). `on_gone(node)` (deleted, preempted) ends those process trees by pid.
Pids are kept under the state dir, so a restarted simulator still stops what an earlier one started.

A node launched by our Ray node provider (ops/sim/node_provider.py) carries the Ray node id the
autoscaler gave it in its metadata (`ray-node-id`); host 0 starts with that id, as Ray's fake multi-node
provider does, so the autoscaler recognises the node it launched.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ops.processes import end as end_processes
from ops.tpu_types import parse_tpu_type

log = logging.getLogger(__name__)

# Labels that say which cluster a TPU node serves: Ray's own (nodes our node provider launched) and
# ours (nodes add-worker created, which must not carry Ray's node-type labels).
RAY_CLUSTER_LABEL = "ray-cluster-name"
CLUSTER_LABEL = "clusterbot-cluster"
RAY_NODE_ID_KEY = "ray-node-id"  # metadata: the Ray node id host 0 takes (node provider launches)
RAY_NODE_TYPE_LABEL = "ray-user-node-type"
# Every process of a simulated VM carries this variable (its node name), so leftovers are findable.
NODE_MARKER = "CLUSTERBOT_SIM_NODE"

# What a worker may inherit from the simulator's environment: a VM has nothing of ours.
ENV_ALLOWED = ("PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "USER", "LOGNAME", "TZ")
_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")

# One host's Ray node, as Ray's fake multi-node provider starts its nodes (ray._private.node.Node), in a
# process of its own that lives until SIGTERM. Not `ray start --address`: with 127.0.0.1 it rewrites the
# head's address to the machine's primary one, where the head does not listen, and with
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which prevents that) it refuses to start a worker node at all
# ("Multi-node Ray clusters are not supported on Windows and OSX", on Linux too; seen with Ray 2.60).
# argv: GCS address, the head's temp dir, the resources as JSON, a socket dir of the host's own (Ray
# numbers socket files by what exists, and two hosts starting at once took the same plasma socket: "bind:
# Address already in use"), the node labels as JSON. The node id comes from the environment.
_HOST_PROGRAM = """
import json, signal, sys, threading
import ray._private.node, ray._private.parameter
gcs, temp_dir, resources, sockets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
labels = json.loads(sys.argv[5])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
params = ray._private.parameter.RayParams(
    node_ip_address="127.0.0.1", gcs_address=gcs, redis_address=gcs, temp_dir=temp_dir, num_cpus=1,
    resources=resources, labels=labels, min_worker_port=0, max_worker_port=0, dashboard_agent_listen_port=0,
    plasma_store_socket_name=sockets + "/plasma", raylet_socket_name=sockets + "/raylet",
)
try:
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    print("ray node started", node.node_id, flush=True)
except Exception as e:  # Ray gives a raylet 30 s to register; a loaded machine takes longer, and the
    node = None         # raylet it started registers later: keep the VM up, as a real one would stay
    print("ray node slow to start:", e, flush=True)
stop.wait()
if node is not None:
    node.kill_all_processes(check_alive=False, allow_graceful=False)
"""


@dataclass(frozen=True)
class Head:
    """The head a booting VM joins: what the startup script finds from the node's labels and the token."""

    ray_cluster_name: str  # matched against the node's `ray-cluster-name` label
    cluster: str  # matched against the node's `clusterbot-cluster` label
    gcs_address: str  # 127.0.0.1:PORT
    temp_dir: Path  # the head's (short) Ray temp dir: raylets on one machine share its session
    state_dir: Path  # where the workers' pids are kept
    token_path: Path | None = None
    # Extra environment for the workers (e.g. CLUSTERBOT_LOCAL_HEAD, so the local driver's stop finds them)
    env: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """Write it where the simulator's process reads it (`boot_hooks`)."""
        data = {**self.__dict__, "temp_dir": str(self.temp_dir), "state_dir": str(self.state_dir)}
        data["token_path"] = None if self.token_path is None else str(self.token_path)
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> Head:
        data = json.loads(path.read_text())
        token = data.pop("token_path")
        return cls(**{**data, "temp_dir": Path(data["temp_dir"]), "state_dir": Path(data["state_dir"])},
                   token_path=None if token is None else Path(token))  # fmt: skip

    def serves(self, labels: dict[str, str]) -> bool:
        """Whether a node with these labels belongs to this head's cluster."""
        return (
            labels.get(RAY_CLUSTER_LABEL) == self.ray_cluster_name
            or labels.get(CLUSTER_LABEL) == self.cluster
        )


@dataclass(frozen=True)
class VmNode:
    """The fields of a TPU node that booting needs (from a v2 / v2alpha1 Node or the simulator's record)."""

    name: str  # the short id, e.g. ray-clusterbot-local-worker-1a2b
    accelerator_type: str
    labels: dict[str, str]
    metadata: dict[str, str]


def vm_node(node: Any) -> VmNode:
    """A VmNode from a tpu_v2 / tpu_v2alpha1 Node, or from anything that holds one as `.node`."""
    inner = getattr(node, "node", None)
    if inner is not None and hasattr(inner, "accelerator_type"):
        node = inner
    name = str(getattr(node, "name", "") or getattr(node, "node_id", ""))
    return VmNode(
        name=name.rsplit("/", 1)[-1],
        accelerator_type=str(node.accelerator_type),
        labels=dict(getattr(node, "labels", {}) or {}),
        metadata=dict(getattr(node, "metadata", {}) or {}),
    )


class VmBoot:
    """Starts and stops the Ray workers of the head's TPU nodes; the simulator's on_ready / on_gone hooks."""

    def __init__(self, head: Head) -> None:
        self.head = head
        self._lock = threading.Lock()

    # -- the hooks ------------------------------------------------------------------------------
    def on_ready(self, node: Any) -> list[int]:
        """Start one raylet per host of a READY node of this cluster (not yet started); their pids."""
        vm = vm_node(node)
        if not self.head.serves(vm.labels):
            return []
        tpu = parse_tpu_type(vm.accelerator_type)
        pids = []
        with self._lock:
            for host in range(tpu.hosts):
                if self._alive(vm.name, host) is not None:
                    continue
                pids.append(self._start(vm, host))
        return pids

    def on_gone(self, node: Any) -> int:
        """Stop every process of the node's hosts (deleted, preempted); how many there were."""
        return self.stop_node(vm_node(node).name)

    # -- by node name ---------------------------------------------------------------------------
    def stop_node(self, name: str) -> int:
        """End the process trees this VM started (by the pids kept, and by the marker for strays)."""
        with self._lock:
            procs = self._processes(name)
            end_processes(procs)
            for pid_file in self._node_dir(name).glob("host-*.pid"):
                shutil.rmtree(self._sockets(name, int(pid_file.stem.split("-")[1])), ignore_errors=True)
                pid_file.unlink(missing_ok=True)
            return len(procs)

    def stop_all(self) -> int:
        """Stop the workers of every node (the simulator is going away with the cluster)."""
        root = self.head.state_dir / "vms"
        names = [d.name for d in root.iterdir() if any(d.glob("host-*.pid"))] if root.is_dir() else []
        return sum(self.stop_node(name) for name in names)

    # -- internals ------------------------------------------------------------------------------
    def _node_dir(self, name: str) -> Path:
        return self.head.state_dir / "vms" / _SAFE.sub("_", name)

    def _alive(self, name: str, host: int) -> psutil.Process | None:
        pid_file = self._node_dir(name) / f"host-{host}.pid"
        try:
            proc = psutil.Process(int(pid_file.read_text().split()[0]))
            if proc.status() == psutil.STATUS_ZOMBIE or proc.environ().get(NODE_MARKER) != name:
                return None
        except (FileNotFoundError, ValueError, IndexError, psutil.Error):
            return None
        return proc

    def env(self, vm: VmNode, host: int) -> dict[str, str]:
        """The environment of one host's `ray start`: a VM's (PATH, HOME, locale), Ray's settings, the
        cluster's token, and for host 0 of a node our provider launched, the Ray node id it expects."""
        env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith("LC_")}
        env.update(
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # every address stays 127.0.0.1 (FINDINGS)
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="disabled",
            PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        )
        env.update(self.head.env)
        env[NODE_MARKER] = vm.name
        if self.head.token_path is not None:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.head.token_path))
        node_id = vm.metadata.get(RAY_NODE_ID_KEY)
        if host == 0 and node_id:
            env.update(RAY_OVERRIDE_NODE_ID_FOR_TESTING=node_id, RAY_CLOUD_INSTANCE_ID=node_id)
        node_type = vm.labels.get(RAY_NODE_TYPE_LABEL)
        if node_type:
            env["RAY_NODE_TYPE_NAME"] = node_type
        return env

    def command(self, vm: VmNode, host: int) -> list[str]:
        """The host's Ray node: the type's resources, every port chosen free by Ray (the head's fixed
        ports and worker range stay the head's), the head's temp dir. See _HOST_PROGRAM for why not
        `ray start --address`."""
        tpu = parse_tpu_type(vm.accelerator_type)
        slice_name = vm.name
        # What the raylet of a real TPU VM detects (GCP_API_FACTS 2.5): chips, the slice's name as a
        # resource on every host, the pod type's head resource on host 0, and the TPU node labels.
        resources: dict[str, float] = {"TPU": tpu.chips_per_host, slice_name: 1}
        if host == 0:
            resources[tpu.head_resource] = 1
        labels = {"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": str(host),
                  "ray.io/tpu-pod-type": tpu.name}  # fmt: skip
        return [sys.executable, "-c", _HOST_PROGRAM, self.head.gcs_address, str(self.head.temp_dir),
                json.dumps(resources), str(self._sockets(vm.name, host)), json.dumps(labels)]  # fmt: skip

    def _sockets(self, name: str, host: int) -> Path:
        """Short (Ray refuses socket paths over 107 bytes), under the head's temp dir, one per host."""
        return self.head.temp_dir / "vms" / f"{_SAFE.sub('_', name)[:40]}-{host}"

    def _start(self, vm: VmNode, host: int) -> int:
        node_dir = self._node_dir(vm.name)
        node_dir.mkdir(parents=True, exist_ok=True)
        # A socket file left by the VM's last boot (its processes killed) makes the new raylet's bind fail.
        shutil.rmtree(self._sockets(vm.name, host), ignore_errors=True)
        with open(node_dir / f"host-{host}.log", "ab") as out:
            proc = subprocess.Popen(
                self.command(vm, host),
                env=self.env(vm, host),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=node_dir,
            )
        (node_dir / f"host-{host}.pid").write_text(f"{proc.pid}\n")
        # Reap it when it exits (else a zombie per stopped VM in the simulator's process).
        threading.Thread(target=proc.wait, name=f"reap-{vm.name}-{host}", daemon=True).start()
        log.info("tpu-sim: %s host %d booted: ray start (pid %d)", vm.name, host, proc.pid)
        return proc.pid

    def _processes(self, name: str) -> list[psutil.Process]:
        """Every process of the VM: the kept pids' trees and anything carrying its marker."""
        procs: dict[int, psutil.Process] = {}
        for pid_file in self._node_dir(name).glob("host-*.pid"):
            proc = self._alive(name, int(pid_file.stem.split("-")[1]))
            if proc is not None:
                procs[proc.pid] = proc
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(NODE_MARKER) == name:
                    procs[proc.pid] = proc
            except psutil.Error:
                continue
        for proc in list(procs.values()):
            try:
                for child in proc.children(recursive=True):
                    procs[child.pid] = child
            except psutil.Error:
                continue
        procs.pop(os.getpid(), None)
        return list(procs.values())


HEAD_FILE = "head.json"


def boot_hooks(state_dir: Path) -> VmBoot:
    """The simulator's hooks (`python -m ops.sim --hooks ops.sim.workers:boot_hooks`): the head its VMs
    join, from STATE_DIR/head.json, written by the local driver before it starts the simulator."""
    return VmBoot(Head.load(Path(state_dir) / HEAD_FILE))
