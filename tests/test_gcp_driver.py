"""The GCP driver up to its boundary: the exact `ray` command lines, their failures, and the dashboard probe.

No GCP here: commands go to a recording runner or, through the real default runner, to a fake `ray`
script; the probe talks to a tiny HTTP server on 127.0.0.1 that wants a bearer token, as Ray 2.60's
dashboard does with token auth (FINDINGS).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ops.drivers import driver_for
from ops.drivers.gcp import GcpDriver, RunResult, run_command
from ops.errors import OpsError
from ops.registry import REPO_ROOT, Cluster, TokenSource

TOKEN = "tok-3f9c2a7e5b1d"


def make_cluster(dashboard_url: str = "http://127.0.0.1:9", token_env: str | None = None) -> Cluster:
    return Cluster(
        name="us-central2",
        ray_cluster_name="marin-us-central2",
        project="hai-gcp-models",
        region="us-central2",
        zone="us-central2-b",
        tpu_generation="v4",
        worker_tpu_type="v4-8",
        min_workers=4,
        max_workers=1024,
        head_machine_type="n2-standard-8",
        dashboard_url=dashboard_url,
        token=TokenSource(env=token_env) if token_env else None,
    )


class Recorder:
    """A runner that records each call and answers with a canned result."""

    def __init__(self, result: RunResult | None = None) -> None:
        self.calls: list[tuple[list[str], float, Path]] = []
        self.result = result or RunResult(0, "ok\n")

    def __call__(self, argv, *, timeout, cwd):
        self.calls.append((list(argv), timeout, cwd))
        return self.result


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "infra"
    d.mkdir()
    (d / "us-central2.yaml").write_text("cluster_name: marin-us-central2\n")
    return d


def fake_ray(tmp_path: Path, body: str) -> str:
    """An executable standing in for `ray`: logs its arguments, then runs `body` (sh)."""
    path = tmp_path / "ray"
    path.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/argv.log\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- commands -------------------------------------------------------------------------------------


def test_driver_for_picks_gcp_and_the_generated_config_by_short_name():
    driver = driver_for(make_cluster())
    assert isinstance(driver, GcpDriver)
    assert driver.config_path == REPO_ROOT / "infra" / "us-central2.yaml"


def test_stop_runs_ray_down_on_the_clusters_config(config_dir):
    runner = Recorder()
    driver = GcpDriver(make_cluster(), runner=runner, ray_bin="ray", config_dir=config_dir, down_timeout_s=77)
    message = driver.stop()
    assert runner.calls == [(["ray", "down", "-y", str(config_dir / "us-central2.yaml")], 77, REPO_ROOT)]
    assert "marin-us-central2" in message and "us-central2-b" in message


def test_start_runs_ray_up_without_the_config_cache(config_dir):
    runner = Recorder()
    driver = GcpDriver(make_cluster(), runner=runner, ray_bin="ray", config_dir=config_dir, up_timeout_s=88)
    message = driver.start()
    config = str(config_dir / "us-central2.yaml")
    assert runner.calls == [(["ray", "up", "-y", "--no-config-cache", config], 88, REPO_ROOT)]
    assert "http://127.0.0.1:9" in message


def test_default_ray_is_the_one_next_to_this_python():
    driver = GcpDriver(make_cluster())
    assert driver.ray_bin in (str(Path(sys.executable).parent / "ray"), "ray")


def test_the_real_runner_passes_exactly_these_arguments(tmp_path, config_dir):
    ray = fake_ray(tmp_path, "echo done")
    driver = GcpDriver(make_cluster(), ray_bin=ray, config_dir=config_dir)
    driver.stop()
    driver.start()
    config = config_dir / "us-central2.yaml"
    assert (tmp_path / "argv.log").read_text().splitlines() == [
        f"down -y {config}",
        f"up -y --no-config-cache {config}",
    ]


# --- failures -------------------------------------------------------------------------------------


def test_missing_config_says_to_generate_it(tmp_path):
    runner = Recorder()
    driver = GcpDriver(make_cluster(), runner=runner, config_dir=tmp_path)
    with pytest.raises(OpsError) as err:
        driver.stop()
    assert "us-central2" in err.value.reason and "does not exist" in err.value.reason
    assert "python -m ops update-configs" in err.value.hint
    assert runner.calls == []


def test_non_zero_exit_names_command_and_cluster_and_shows_the_tail(tmp_path, config_dir, monkeypatch):
    monkeypatch.setenv("CLUSTERBOT_TEST_SECRET", "hunter2-very-secret")
    lines = "\n".join(f"echo line-{i}" for i in range(30))
    body = f"{lines}\necho 'auth with hunter2-very-secret failed' >&2\nexit 3"
    driver = GcpDriver(make_cluster(), ray_bin=fake_ray(tmp_path, body), config_dir=config_dir)
    with pytest.raises(OpsError) as err:
        driver.stop()
    e = err.value
    assert "`ray down -y" in e.reason and "us-central2" in e.reason and "exit code 3" in e.reason
    assert "line-29" in e.hint and "auth with *** failed" in e.hint  # stderr is in the tail too
    assert "line-19" in e.hint and "line-18" not in e.hint  # only the last 12 lines
    assert "hunter2-very-secret" not in str(e)


def test_cluster_token_never_reaches_the_error(config_dir, monkeypatch):
    monkeypatch.setenv("CB_TEST_RAY_TOKEN", TOKEN)
    runner = Recorder(RunResult(1, f"header Authorization: Bearer {TOKEN}\n"))
    driver = GcpDriver(make_cluster(token_env="CB_TEST_RAY_TOKEN"), runner=runner, config_dir=config_dir)
    with pytest.raises(OpsError) as err:
        driver.start()
    assert TOKEN not in str(err.value)


def test_missing_google_api_client_gets_a_hint(config_dir):
    output = "Traceback ...\nModuleNotFoundError: No module named 'googleapiclient'\n"
    driver = GcpDriver(make_cluster(), runner=Recorder(RunResult(1, output)), config_dir=config_dir)
    with pytest.raises(OpsError) as err:
        driver.start()
    assert "pip install google-api-python-client" in err.value.hint


def test_timeout_stops_the_command_and_says_the_cluster_may_be_half_done(tmp_path, config_dir):
    body = "echo deleting ray-marin-us-central2-worker-1-tpu\nexec sleep 30"
    driver = GcpDriver(
        make_cluster(), ray_bin=fake_ray(tmp_path, body), config_dir=config_dir, down_timeout_s=0.5
    )
    started = time.monotonic()
    with pytest.raises(OpsError) as err:
        driver.stop()
    assert time.monotonic() - started < 5
    assert "timed out after 0.5 s" in err.value.reason and "partly" in err.value.reason
    assert "worker-1-tpu" in err.value.hint


def test_timeout_kills_the_whole_process_group(tmp_path):
    # A child that ignores nothing but outlives its parent unless the group is killed.
    script = tmp_path / "spawn.sh"
    script.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {tmp_path}/child.pid\nwait\n")
    script.chmod(0o755)
    result = run_command([str(script)], timeout=0.5, cwd=tmp_path)
    assert result.timed_out and result.returncode is None
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        if "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break  # a zombie waiting for init: dead
        time.sleep(0.05)
    stat_file = Path(f"/proc/{child}/stat")
    assert not stat_file.exists() or stat_file.read_text().split()[2] == "Z"


def test_timeout_returns_even_when_an_escaped_process_holds_the_output(tmp_path):
    # A child in its own session (as a daemonizing helper would be) keeps the pipe open after the group
    # is killed: the runner must still return, with what was printed.
    script = tmp_path / "escape.sh"
    body = f"echo started\nsetsid sleep 30 &\necho $! > {tmp_path}/escaped.pid\nexec sleep 30\n"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    started = time.monotonic()
    try:
        result = run_command([str(script)], timeout=0.3, cwd=tmp_path, kill_grace_s=0.3)
    finally:
        pid_file = tmp_path / "escaped.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert time.monotonic() - started < 3
    assert result.timed_out and "started" in result.output


def test_missing_ray_cli_is_an_ops_error(tmp_path, config_dir):
    driver = GcpDriver(make_cluster(), ray_bin=str(tmp_path / "no-such-ray"), config_dir=config_dir)
    with pytest.raises(OpsError) as err:
        driver.start()
    assert "could not start" in err.value.reason and "Ray CLI" in err.value.hint


# --- is_up ----------------------------------------------------------------------------------------


class _Dashboard(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path != "/api/version":
            self.send_error(404)
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
        else:
            body = b'{"ray_version": "2.60.0"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_is_up_with_the_token(dashboard, monkeypatch):
    monkeypatch.setenv("CB_TEST_RAY_TOKEN", TOKEN)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")  # the tunnel is never proxied
    assert GcpDriver(make_cluster(dashboard + "/", token_env="CB_TEST_RAY_TOKEN")).is_up() is True


def test_is_not_up_when_the_dashboard_refuses_us(dashboard, monkeypatch, caplog):
    monkeypatch.delenv("CB_TEST_RAY_TOKEN", raising=False)
    assert GcpDriver(make_cluster(dashboard, token_env="CB_TEST_RAY_TOKEN")).is_up() is False
    assert "401" in caplog.text and "no token on this machine" in caplog.text
    monkeypatch.setenv("CB_TEST_RAY_TOKEN", "wrong-token")
    assert GcpDriver(make_cluster(dashboard, token_env="CB_TEST_RAY_TOKEN")).is_up() is False
    assert "wrong-token" not in caplog.text


def test_is_not_up_on_a_closed_port_and_says_so_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    assert GcpDriver(make_cluster(f"http://127.0.0.1:{port}")).is_up() is False
    assert time.monotonic() - started < 1


def test_is_not_up_when_the_head_hangs():
    with socket.socket() as s:  # accepts connections (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        driver = GcpDriver(make_cluster(f"http://127.0.0.1:{s.getsockname()[1]}"), probe_timeout_s=0.3)
        started = time.monotonic()
        assert driver.is_up() is False
        assert time.monotonic() - started < 2
