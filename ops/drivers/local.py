"""The local cluster: a real Ray head on 127.0.0.1 with Ray's fake multi-node autoscaler.

Worker node types carry TPU resources (`TPU`, `TPU-<type>-head`) so jobs and demand look like the
real clusters'. Every process is ours by construction: `ray start --head --block` runs in its own
session and we remember its pid; `stop` ends that process tree (never `ray stop`, which kills every
Ray process on the machine). Pitfalls this works around are in shared/FINDINGS.md: a short temp dir,
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 to stay on 127.0.0.1, explicit ports per head, explicit auth mode,
every port checked free before `ray start` (a head whose agent cannot bind dies seconds after "started"),
and a head started from an allowlist of our environment (every job sees the head's environment).

Its cloud is the TPU simulator (ops.sim), a process started beside the head (pid, port and state under
CLUSTERBOT_HOME/local/<name>/sim) before it: the autoscaler launches TPU VMs through the simulator's API
(ops/sim/node_provider.py), and a READY VM's Ray workers join the head (ops/sim/workers.py). `stop`
deletes the autoscaled VMs as `ray down` does, stops the simulator, and leaves no process of either;
VMs created by hand (add-worker) stay in the simulator's state and rejoin the head at the next start.

Token auth, as on the GCP clusters: the head (and the simulator's VMs) read the token from a 0600 file
in the state dir, written at each start from the simulated Secret Manager at the cluster's pinned
version (`token_reader`, given by the Context: ops/tokens.py). The same value goes to this machine's
copy (the registry's `token.file`, where `ops token` writes it): for the local cluster, this machine is
its only user. A driver built without a Context (tests' fixtures) starts the head from that copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import yaml

from ops.errors import OpsError
from ops.processes import end as end_processes
from ops.registry import Cluster, clusterbot_home
from ops.sim.workers import CLUSTER_LABEL, HEAD_FILE, RAY_CLUSTER_LABEL, Head, VmBoot

if TYPE_CHECKING:
    from ops.ray_api import RayApi

# What a head may inherit from our environment: every job on it sees that environment, and ours holds
# secrets (the bot's DISCORD_TOKEN, cloud credentials). RAY_AUTH* is the driver's own to set.
ENV_ALLOWED = ("PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "USER", "LOGNAME", "TZ")
ENV_ALLOWED_PREFIXES = ("LC_", "RAY_")

log = logging.getLogger(__name__)

START_TIMEOUT_S = 90.0
SIM_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 2.0  # how long a port a leftover of ours held may take to be free once it is reaped


class LocalDriver:
    # How to read the cluster's Ray token at its pinned version (set by the Context); None: this
    # machine's copy (the registry's `token`), made up when missing.
    token_reader: Callable[[], str | None] | None = None
    # Called at each start with no config to render (the local head is this machine's Ray): it records
    # the image the cluster's nodes run (the store's pin), as a GCP start does (set by the Context).
    config_renderer: Callable[[], str | None] | None = None

    def __init__(self, cluster: Cluster) -> None:
        assert cluster.local_ports is not None
        self.cluster = cluster
        self.ports = cluster.local_ports
        self.state_dir = clusterbot_home() / "local" / cluster.name
        # Ray refuses socket paths over 107 bytes: keep the temp dir short but unique per state dir.
        digest = hashlib.sha1(str(self.state_dir.resolve()).encode()).hexdigest()[:8]
        self.temp_dir = Path(f"/tmp/cb-{digest}")
        self.pid_file = self.state_dir / "head.pid"
        self.log_file = self.state_dir / "head.log"
        self.sim_dir = self.state_dir / "sim"  # the simulator's state, sim.json (pid, port), head.json
        self.head_token_file = self.state_dir / "head_token"  # what the head and its VMs run with

    # -- what the cluster looks like -------------------------------------------------------------
    def autoscaling_config(self) -> dict:
        tpu = self.cluster.worker_tpu
        worker_type = f"tpu-{tpu.name}"
        return {
            "cluster_name": self.cluster.ray_cluster_name,
            "max_workers": self.cluster.max_workers,
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 1,
            # Ray's fake multi-node provider, launching through the simulator's Cloud TPU API.
            "provider": {
                "type": "external",
                "module": "ops.sim.node_provider.SimTpuNodeProvider",
                "sim_state_dir": str(self.sim_dir),
                "project": self.cluster.project,
                "zone": self.cluster.zone,
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "gcs_address": f"127.0.0.1:{self.ports.gcs}",
            },
            "available_node_types": {
                "ray.head.default": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0},
                worker_type: {
                    # The resources host 0 of the VM registers (ops/sim/workers.py), as Ray must know.
                    "resources": {"CPU": 1, "TPU": tpu.chips_per_host, tpu.head_resource: 1},
                    # As Ray's GCP provider reads a TPU node_config: spot workers, as on the real clusters.
                    "node_config": {
                        "acceleratorType": tpu.name,
                        "runtimeVersion": tpu.runtime_version,
                        "schedulingConfig": {"preemptible": True},
                    },
                    "min_workers": self.cluster.min_workers,
                    "max_workers": self.cluster.max_workers,
                },
            },
            "head_node_type": "ray.head.default",
            "auth": {"ssh_user": "ubuntu"},
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }

    def token_path(self) -> Path | None:
        """The file the head and its VMs read the token from; None when the cluster has no token auth."""
        if self.cluster.token is None and self.cluster.token_secret is None:
            return None
        return self.head_token_file

    def _write_head_token(self) -> None:
        """The token for the head about to start: Secret Manager's at the pinned version (also written
        to this machine's copy), or without a Context that copy (made up when there is none)."""
        from ops.tokens import write_private

        copy = None if self.cluster.token is None else self.cluster.token.path()
        if self.token_reader is not None:
            value = self.token_reader()
            if value and copy is not None:
                write_private(copy, value)
        else:
            value = self.cluster.read_token()
            if not value and copy is not None:
                value = secrets.token_hex(32)
                write_private(copy, value)
        if value:
            write_private(self.head_token_file, value)

    def env(self) -> dict[str, str]:
        """The environment `ray start` runs in, and so every job's: an allowlist of ours (ENV_ALLOWED),
        what the driver needs, token auth when the registry gives the cluster a token."""
        env = {
            k: v
            for k, v in os.environ.items()
            if (k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES)) and not k.startswith("RAY_AUTH")
        }
        env.update(
            RAY_FAKE_CLUSTER="1",
            AUTOSCALER_UPDATE_INTERVAL_S="1",
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="disabled",
            CLUSTERBOT_LOCAL_HEAD=str(self.temp_dir),  # inherited by every process: how stop() finds them
            # The autoscaler imports our node provider (ops.sim.node_provider) from this checkout.
            PYTHONPATH=str(Path(__file__).resolve().parents[2]),
            # Job entrypoints say `python`: on a real cluster that is the image's, with Ray; here ours.
            PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        )
        token_path = self.token_path()
        if token_path is not None:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
        return env

    def command(self, config_path: Path) -> list[str]:
        p = self.ports
        ray_bin = str(Path(sys.executable).with_name("ray"))
        return [
            ray_bin, "start", "--head", "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={p.gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={p.dashboard}",
            f"--dashboard-agent-listen-port={p.dashboard_agent_listen}",
            f"--dashboard-agent-grpc-port={p.dashboard_agent_grpc}",
            f"--metrics-export-port={p.metrics_export}",
            f"--runtime-env-agent-port={p.runtime_env_agent}",
            f"--ray-client-server-port={p.ray_client_server}",
            f"--min-worker-port={p.min_worker}",
            f"--max-worker-port={p.max_worker}",
            "--num-cpus=2",
            f"--temp-dir={self.temp_dir}",
            f"--autoscaling-config={config_path}",
            "--disable-usage-stats",
        ]  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------------
    def _head_process(self) -> psutil.Process | None:
        try:
            pid = int(self.pid_file.read_text().split()[0])
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            cmd = " ".join(proc.cmdline())
        except (FileNotFoundError, ValueError, IndexError, psutil.Error):
            return None
        return proc if str(self.temp_dir) in cmd else None

    def is_up(self) -> bool:
        return self._head_process() is not None

    def head_exists(self) -> bool:
        """The head process is ours and on this machine: its absence is certain."""
        return self.is_up()

    def dashboard_url(self) -> str:
        return self.cluster.dashboard_url

    def tpu_endpoint(self) -> str:
        """The simulator's gRPC address (host:port); OpsError when it is not running."""
        info = self._sim_info()
        if info is None:
            raise OpsError(
                "the local cluster's TPU simulator is not running", "start the local cluster: ops local up"
            )
        return info["address"]

    def close(self) -> None:
        """Nothing held open: the dashboard is on this machine."""

    def start(self) -> str:
        """Start the head and wait until its own node is registered and alive (the dashboard answers
        earlier than that). A head that dies while starting (seen under load: its raylet missed the
        registration deadline) is cleaned up and started once more."""
        url = self.cluster.dashboard_url
        if self.is_up():
            return f"local cluster already up, dashboard at {url}"
        if self.config_renderer is not None:
            self.config_renderer()
        for attempt in (1, 2):
            try:
                pid = self._start_once()
                break
            except _HeadDied:
                if attempt == 2:
                    raise OpsError(
                        "the local Ray head exited twice while starting", f"see {self.log_file}"
                    ) from None
        return f"local cluster up (pid {pid}), dashboard at {url}"

    def check_ports(self) -> None:
        """Every port the head will bind is free, and no one listens in its worker range; else an
        OpsError naming the port and its holder. Ray's own checks miss some: an agent that cannot
        bind takes the raylet down seconds after `ray start` said the head was up (FINDINGS)."""
        p = self.ports
        fixed = {
            "gcs": p.gcs,
            "dashboard": p.dashboard,
            "dashboard agent": p.dashboard_agent_listen,
            "dashboard agent gRPC": p.dashboard_agent_grpc,
            "metrics export": p.metrics_export,
            "runtime-env agent": p.runtime_env_agent,
            "Ray client server": p.ray_client_server,
        }
        for name, port in fixed.items():
            if not _bindable(port) and not self._free_of_leftovers(port):
                raise OpsError(
                    f"port {port} ({name}) of the local cluster is taken by {_holder(port)}",
                    "stop that process, or give the cluster other ports (local_ports in the registry)",
                )
        listening = _listeners(range(p.min_worker, p.max_worker + 1))
        if listening:
            port, holder = min(listening.items())
            raise OpsError(
                f"port {port} in the local cluster's worker range {p.min_worker}-{p.max_worker} is taken"
                f" by {holder}",
                "stop that process, or give the cluster another worker range (local_ports in the registry)",
            )

    def _free_of_leftovers(self, port: int) -> bool:
        """End what of an earlier head of ours still holds `port` (seen: its dashboard agent outliving a
        raylet that died), then whether the port is free. Anyone else's process is never touched."""
        try:
            pids = {c.pid for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port}
        except psutil.Error:
            return False
        ours = []
        for pid in pids - {None}:
            try:
                proc = psutil.Process(pid)
                proc.info = {"name": proc.name()}
                if self._is_ours(proc):
                    ours.append(proc)
            except psutil.Error:
                continue
        if ours:
            end_processes(ours)
        deadline = time.monotonic() + STOP_TIMEOUT_S  # a socket is closed when its process is reaped
        while not _bindable(port):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _start_once(self) -> int:
        self.stop()  # leftovers of a head that died leave ports taken
        self.check_ports()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._start_sim()
        if self.token_path() is not None:
            self._write_head_token()  # after the simulator: its Secret Manager holds the token
        config_path = self.state_dir / "autoscaler.yaml"
        config_path.write_text(yaml.safe_dump(self.autoscaling_config(), sort_keys=False))
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self.command(config_path),
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.state_dir,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        from ops.ray_api import RayApi

        api = RayApi(self.cluster)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                self.stop()
                raise _HeadDied()
            if api.reachable() and self._head_alive(api):
                try:
                    self._reboot_vms()
                except Exception as e:  # the head is up; a VM that does not rejoin is the health check's
                    log.warning("TPU VMs of %s not rebooted: %s", self.cluster.name, e)
                return proc.pid
            if time.monotonic() > deadline:
                self.stop()
                raise OpsError(
                    f"the local Ray head did not come up within {START_TIMEOUT_S:.0f}s",
                    f"see {self.log_file}",
                )
            time.sleep(0.5)

    @staticmethod
    def _head_alive(api: RayApi) -> bool:
        try:
            return any(n.get("is_head_node") and n.get("state") == "ALIVE" for n in api.nodes())
        except OpsError:
            return False

    def _our_processes(self) -> list[psutil.Process]:
        """The head's process tree, plus any process that carries our marker (orphaned workers) or,
        having renamed itself `ray::...`, writes into our temp dir (Ray starts its dashboard agent
        without our environment: orphaned when its raylet dies, only its open logs say whose it is)."""
        procs: dict[int, psutil.Process] = {}
        head = self._head_process()
        if head is not None:
            procs[head.pid] = head
            for child in head.children(recursive=True):
                procs[child.pid] = child
        for proc in psutil.process_iter(["pid", "name"]):
            try:
                if proc.pid != os.getpid() and self._is_ours(proc):
                    procs[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        procs[child.pid] = child
            except psutil.Error:
                continue
        return list(procs.values())

    def _is_ours(self, proc: psutil.Process) -> bool:
        marker = str(self.temp_dir)
        if proc.environ().get("CLUSTERBOT_LOCAL_HEAD") == marker:
            return True
        if not (proc.info.get("name") or proc.name()).startswith("ray::"):
            return False
        return any(f.path.startswith(marker + "/") for f in proc.open_files())

    def stop(self) -> str:
        """Stop the head (so its autoscaler launches nothing more), delete the TPU VMs it launched as
        `ray down` does, stop the simulator, and end whatever of ours is left (the VMs' Ray workers)."""
        sim = self._sim_process()
        head_procs = [p for p in self._our_processes() if sim is None or p.pid != sim.pid]
        end_processes(head_procs)
        self._cleanup_pidfile()
        deleted = self._delete_autoscaled() if sim is not None else []
        if sim is not None:
            end_processes([sim])
            (self.sim_dir / "sim.json").unlink(missing_ok=True)
        vm_procs = VmBoot(self.head()).stop_all()  # the VMs' workers, their pid files and sockets
        rest = self._our_processes()
        end_processes(rest)
        count = len(head_procs) + vm_procs + len(rest) + (sim is not None)
        if not count:
            return "local cluster is not running"
        vms = f", {len(deleted)} autoscaled TPU VMs deleted" if deleted else ""
        return f"local cluster stopped ({count} processes{vms})"

    # -- the simulator beside the head --------------------------------------------------------------
    def head(self) -> Head:
        """The head the simulator's VMs join (ops/sim/workers.py)."""
        return Head(
            ray_cluster_name=self.cluster.ray_cluster_name,
            cluster=self.cluster.name,
            gcs_address=f"127.0.0.1:{self.ports.gcs}",
            temp_dir=self.temp_dir,
            state_dir=self.sim_dir,
            token_path=self.token_path(),
            env={"CLUSTERBOT_LOCAL_HEAD": str(self.temp_dir)},  # so stop() finds every VM's processes
        )

    def _sim_info(self) -> dict | None:
        """sim.json of a running simulator of ours, else None."""
        try:
            info = json.loads((self.sim_dir / "sim.json").read_text())
            proc = psutil.Process(int(info["pid"]))
            if proc.status() == psutil.STATUS_ZOMBIE or str(self.sim_dir) not in " ".join(proc.cmdline()):
                return None
        except (FileNotFoundError, ValueError, KeyError, psutil.Error):
            return None
        return info

    def _sim_process(self) -> psutil.Process | None:
        info = self._sim_info()
        return None if info is None else psutil.Process(int(info["pid"]))

    def _start_sim(self) -> str:
        """`python -m ops.sim` with our VM hooks, from a minimal environment; its address once it serves."""
        self.sim_dir.mkdir(parents=True, exist_ok=True)
        self.head().save(self.sim_dir / HEAD_FILE)
        (self.sim_dir / "sim.json").unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith("LC_")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # this checkout's ops
        # The ports it had before when they are free: clients built before a restart (a Context's
        # TpuApi) keep reaching it.
        last = self.sim_dir / "ports.json"
        ports = json.loads(last.read_text()) if last.is_file() else {"port": 0, "control_port": 0}
        ports = {k: v if v and _bindable(v) else 0 for k, v in ports.items()}
        cmd = [sys.executable, "-m", "ops.sim", f"--state-dir={self.sim_dir}",
               "--hooks=ops.sim.workers:boot_hooks", f"--port={ports['port']}",
               f"--control-port={ports['control_port']}"]  # fmt: skip
        with open(self.sim_dir / "sim.log", "ab") as log_file:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.sim_dir,
            )
        deadline = time.monotonic() + SIM_START_TIMEOUT_S
        while (info := self._sim_info()) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                end_processes([psutil.Process(proc.pid)] if proc.poll() is None else [])
                raise OpsError("the local TPU simulator did not start", f"see {self.sim_dir / 'sim.log'}")
            time.sleep(0.1)
        control_port = int(info["control_url"].rstrip("/").rsplit(":", 1)[1])
        last.write_text(json.dumps({"port": info["port"], "control_port": control_port}))
        return info["address"]

    def _tpu(self):  # noqa: ANN202 - ops.gcp.tpu.TpuApi, imported late (grpc)
        from ops.gcp.tpu import TpuApi, tpu_clients

        return TpuApi(tpu_clients(self.tpu_endpoint()), self.cluster.project)

    def _delete_autoscaled(self) -> list[str]:
        """Delete the TPU VMs Ray's autoscaler launched (labelled with the Ray cluster name), as
        `ray down` does; what add-worker created carries no such label and stays."""
        api = self._tpu()
        try:
            nodes = api.list_nodes(self.cluster.zone, {RAY_CLUSTER_LABEL: self.cluster.ray_cluster_name})
            for node in nodes:
                api.delete_node(node.name)
            return [n.node_id for n in nodes]
        except Exception as e:  # the stop goes on; what is left is said
            log.warning("could not delete the autoscaled TPU VMs of %s: %s", self.cluster.name, e)
            return []
        finally:
            api.clients.close()

    def _reboot_vms(self) -> None:
        """The cluster's READY VMs created by hand (add-worker) rejoin the new head, as their startup
        script makes real ones do: the simulator kept them across the stop, their processes did not."""
        api = self._tpu()
        try:
            nodes = api.list_nodes(self.cluster.zone, {CLUSTER_LABEL: self.cluster.name})
        finally:
            api.clients.close()
        boot = VmBoot(self.head())
        for node in nodes:
            if node.state == "READY":
                boot.on_ready(node)

    def _cleanup_pidfile(self) -> None:
        self.pid_file.unlink(missing_ok=True)


def _bindable(port: int) -> bool:
    """Whether a server could bind `port` on every address now. SO_REUSEADDR as Ray's servers set it:
    a listener or an outgoing connection on the port blocks it, a closed connection's TIME_WAIT not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _describe(pid: int | None) -> str | None:
    if not pid:
        return None
    try:
        return f"{psutil.Process(pid).name()} (pid {pid})"
    except psutil.Error:
        return None


def _holder(port: int) -> str:
    """Who holds `port`: a process name and pid when this user may see it (a listener first)."""
    try:
        conns = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    except psutil.Error:
        conns = []
    conns.sort(key=lambda c: c.status != psutil.CONN_LISTEN)
    return next((d for c in conns if (d := _describe(c.pid))), "another process")


def _listeners(ports: range) -> dict[int, str]:
    """Ports in `ports` someone listens on (TCP), with their holder."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return {}
    return {
        c.laddr.port: _describe(c.pid) or "another process"
        for c in conns
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports
    }


class _HeadDied(Exception):
    """The `ray start` process exited before its head was up."""
