"""The local driver before and around `ray start`: every port the head will use is checked first (a
taken one is named with its holder, and nothing starts), and the head starts from an allowlist of our
environment, so no job sees the secrets of the process that started it."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest
import yaml

from ops.drivers.local import LocalDriver
from ops.errors import OpsError
from ops.ray_api import RayApi
from ops.registry import DEFAULT_REGISTRY, Cluster, load_registry
from tests.localray import SECRET_CANARY, SECRET_CANARY_VAR, free_ports, ray_processes_with_marker, wait_for

JOB_TIMEOUT_S = 60.0


@pytest.fixture
def idle_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A `local` cluster of this test's own (home, free block of ports), not started."""
    monkeypatch.setenv("CLUSTERBOT_HOME", str(tmp_path / "home"))
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text())
    ports = free_ports()
    raw["clusters"]["local"]["local_ports"] = ports
    raw["clusters"]["local"]["dashboard_url"] = f"http://127.0.0.1:{ports['dashboard']}"
    registry = tmp_path / "clusters.yaml"
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    yield load_registry(registry).get("local")


def _hold(stack: ExitStack, port: int, how: str) -> None:
    """Take `port` on 127.0.0.1 in this process: a listener, or the local end of an outgoing connection
    (what any client may get from Linux's ephemeral range)."""
    s = stack.enter_context(socket.socket())
    s.bind(("127.0.0.1", port))
    if how == "listener":
        s.listen()
        return
    server = stack.enter_context(socket.socket())
    server.bind(("127.0.0.1", 0))
    server.listen()
    s.connect(server.getsockname())


@pytest.mark.parametrize(
    "how, which",
    [
        ("listener", "gcs"),
        ("listener", "runtime_env_agent"),  # the agent whose failed bind took a head down, seen live
        ("outgoing", "dashboard_agent_grpc"),
        ("listener", "worker range"),
    ],
)
def test_a_taken_port_stops_start_at_once_naming_port_and_holder(
    idle_cluster: Cluster, how: str, which: str
) -> None:
    driver = LocalDriver(idle_cluster)
    ports = idle_cluster.local_ports
    port = ports.min_worker + 7 if which == "worker range" else getattr(ports, which)
    with ExitStack() as stack:
        _hold(stack, port, how)
        t0 = time.monotonic()
        try:
            with pytest.raises(OpsError) as failed:
                driver.start()
        finally:
            driver.stop()  # a head started in spite of the taken port must not outlive the test
        elapsed = time.monotonic() - t0
    me = f"{psutil.Process().name()} (pid {os.getpid()})"
    assert f"port {port} " in failed.value.reason and f"taken by {me}" in failed.value.reason, failed.value
    assert "local_ports" in failed.value.hint
    assert elapsed < 5.0, f"start took {elapsed:.1f}s to refuse"
    assert not driver.pid_file.exists()
    assert not driver._our_processes() and not ray_processes_with_marker(str(driver.temp_dir))


def test_head_environment_is_an_allowlist(idle_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "DISCORD_TOKEN": "bot-token-canary",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json",
        "WANDB_API_KEY": "wandb-canary",
        "RAY_AUTH_TOKEN": "someone-elses-token",
    }
    kept = {"LC_ALL": "C.UTF-8", "TZ": "UTC", "RAY_BACKEND_LOG_LEVEL": "info", "HOME": "/home/alice"}
    for k, v in (secrets | kept).items():
        monkeypatch.setenv(k, v)
    env = LocalDriver(idle_cluster).env()
    assert not set(secrets) & set(env)
    assert not set(secrets.values()) & set(env.values())
    assert {k: env.get(k) for k in kept} == kept
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)  # jobs' `python` is ours
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"]  # the driver's own auth
    assert env["CLUSTERBOT_LOCAL_HEAD"] == str(LocalDriver(idle_cluster).temp_dir)


def test_no_job_sees_the_environment_that_started_its_head(cluster: Cluster) -> None:
    """The session's heads start with a secret canary in their starting environment (tests/localray.py)."""
    assert os.environ.get(SECRET_CANARY_VAR) == SECRET_CANARY
    api = RayApi(cluster)
    sid = api.submit(entrypoint="env", metadata={"user": "carol"})
    try:
        wait_for(lambda: api.status(sid) in ("SUCCEEDED", "FAILED", "STOPPED"), JOB_TIMEOUT_S, "the env job")
        assert api.status(sid) == "SUCCEEDED"
        logs = api.jobs.get_job_logs(sid)
    finally:
        api.jobs.delete_job(sid)
    seen = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    assert seen.get("CLUSTERBOT_LOCAL_HEAD") == str(LocalDriver(cluster).temp_dir)  # the head's own env
    assert seen["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert SECRET_CANARY_VAR not in seen and SECRET_CANARY not in logs
