"""A real local Ray cluster for the tests, started once per session on ports of its own.

The session gets its own CLUSTERBOT_HOME, store and registry (a copy of infra/clusters.yaml whose
`local` cluster uses a free block of ports), so the tests never meet a developer's own local cluster
nor another test session's. Tests run `python -m ops` as a child process, as a user would, with `ops_env()`.
Import the fixtures in a test module with `from tests.localray import local_cluster, ...  # noqa: F401`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from ops.registry import DEFAULT_REGISTRY, Cluster, load_registry


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# Blocks below Linux's ephemeral range (32768-60999), where an outgoing connection may take any port
# (FINDINGS), and clear of the local default (6379, 8265, 10001, 11365-11368, workers 20000-20999),
# the GCP tunnels (8266-8272) and the restart bench (11100-11106, workers 11400-11999).
HEAD_BLOCKS = range(12000, 20000, 50)  # 7 ports each
WORKER_BLOCKS = range(21000, 32500, 500)  # 500 ports each (Ray skips a worker port found taken)


LOCKS_DIR = Path("/tmp/clusterbot-test-ports")
_held: list[Any] = []  # the lock files of this session's blocks, open until the process ends


def _claim(kind: str, block: int) -> bool:
    """Hold `block` for this process (an exclusive flock, let go when the process ends): two test
    sessions on one machine, xdist workers or runs side by side, never draw the same block, even where
    nothing listens yet (a head's worker range is bound only as its workers start)."""
    LOCKS_DIR.mkdir(exist_ok=True)
    f = open(LOCKS_DIR / f"{kind}-{block}", "a")  # noqa: SIM115 - held for the session
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _held.append(f)
    return True


def free_ports() -> dict[str, int]:
    """Ports for one session's head: blocks of its own, so parallel test sessions never share a head."""
    rng = random.Random(os.getpid() ^ time.time_ns())
    names = ["gcs", "dashboard", "dashboard_agent_listen", "dashboard_agent_grpc", "metrics_export",
             "runtime_env_agent", "ray_client_server"]  # fmt: skip
    head_blocks, worker_blocks = list(HEAD_BLOCKS), list(WORKER_BLOCKS)
    rng.shuffle(head_blocks)
    rng.shuffle(worker_blocks)
    size = len(names)
    base = next((b for b in head_blocks if all(_free(b + i) for i in range(size)) and _claim("head", b)), 0)
    workers = next((b for b in worker_blocks if _free(b) and _claim("workers", b)), 0)
    if not base or not workers:
        raise RuntimeError("no free block of ports for the test cluster")
    ports = {name: base + i for i, name in enumerate(names)}
    return ports | {"min_worker": workers, "max_worker": workers + 499}


LEASE_S = 3.0
# A secret in the environment of every process of the session, so of every head it starts (in-process
# or through `python -m ops`): no job may see it (LocalDriver starts heads from an allowlist).
SECRET_CANARY_VAR = "CLUSTERBOT_TEST_SECRET_CANARY"
SECRET_CANARY = f"canary-{os.getpid()}-{time.time_ns()}"


class Env:
    """The session's environment for `python -m ops` children."""

    def __init__(self, home: Path) -> None:
        self.home = home
        raw = yaml.safe_load(DEFAULT_REGISTRY.read_text())
        ports = free_ports()
        raw["clusters"]["local"]["local_ports"] = ports
        raw["clusters"]["local"]["dashboard_url"] = f"http://127.0.0.1:{ports['dashboard']}"
        self.registry = home / "clusters.yaml"
        self.registry.write_text(yaml.safe_dump(raw, sort_keys=False))
        self.vars = {
            "CLUSTERBOT_HOME": str(home),
            "CLUSTERBOT_REGISTRY": str(self.registry),
            "CLUSTERBOT_STORE": str(home / "store"),
            "CLUSTERBOT_LEASE_S": str(LEASE_S),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "CLUSTERBOT_SETTLE_S": "3",  # tests that need the real settle time set their own
            "CLUSTERBOT_REACH_DEADLINE_S": "10",
            SECRET_CANARY_VAR: SECRET_CANARY,
        }

    def ops(self, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 240) -> Result:
        """Run `python -m ops ARGS` and return its exit code, stdout and stderr."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "CLUSTERBOT_"))}
        env.update(self.vars, **(extra_env or {}))
        proc = subprocess.run(
            [sys.executable, "-m", "ops", *args],
            capture_output=True,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            cwd=Path(__file__).resolve().parent.parent,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


@pytest.fixture(scope="session")
def ops_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(tmp_path_factory.mktemp("cbhome"))
    saved = {k: os.environ.get(k) for k in env.vars}
    os.environ.update(env.vars)  # for in-process library calls too
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def local_cluster(ops_env: Env) -> Iterator[Cluster]:
    """The session's local cluster, up; stopped at the end, and nothing of it may be left running."""
    from ops.drivers.local import LocalDriver

    cluster = load_registry(ops_env.registry).get("local")
    driver = LocalDriver(cluster)
    driver.start()
    try:
        yield cluster
    finally:
        driver.stop()
        left = driver._our_processes()
        assert not left, f"processes of the local cluster survived stop: {[p.pid for p in left]}"


@pytest.fixture
def cluster(local_cluster: Cluster) -> Iterator[Cluster]:
    """The local cluster, up and accepting jobs, with no active job and no lock at the start of a test."""
    from ops.drivers.local import LocalDriver
    from ops.jobs import active_jobs
    from ops.locks import force_unlock
    from ops.ray_api import RayApi
    from ops.store import open_store

    force_unlock(open_store(), local_cluster.name)
    driver = LocalDriver(local_cluster)
    driver.start()
    api = RayApi(local_cluster)
    if active_jobs(api):
        # Ray cannot stop a job still pending on resources (its stop queues behind the job's
        # supervisor actor): a fresh head is the only clean slate.
        driver.stop()
        driver.start()
        api = RayApi(local_cluster)
    api.wait_accepting(90)
    yield local_cluster


def dashboard_process(cluster: Cluster) -> psutil.Process:
    """The local head's dashboard process (found by its port)."""
    port = cluster.local_ports.dashboard
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on the dashboard port {port}")


def cont(proc: psutil.Process) -> None:
    """SIGCONT, if the process is still there (a restart may have replaced it)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(signal.SIGCONT)


@pytest.fixture
def stalled(cluster: Cluster) -> Iterator[psutil.Process]:
    """The dashboard SIGSTOPped: a head that is up but does not answer; SIGCONT always at the end."""
    proc = dashboard_process(cluster)
    proc.send_signal(signal.SIGSTOP)
    try:
        yield proc
    finally:
        cont(proc)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `predicate` until it is truthy; fail the test after `timeout` seconds saying `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def ray_processes_with_marker(marker: str) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("CLUSTERBOT_LOCAL_HEAD") == marker:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out
