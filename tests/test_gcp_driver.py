"""The GCP driver up to its boundary: the exact `ray` command lines, their failures, how it finds and
reaches the head (a `ray dashboard` tunnel or the head's internal address), and the dashboard probe.

No GCP here: commands go to a recording runner or, through the real default runner and the real tunnel
process, to a fake `ray` (tests/fake_ray_cli.py) whose head is a new address after every `ray up`, as a
new VM's would be; the probe talks to a tiny HTTP server on 127.0.0.1 that wants a bearer token, as Ray
2.60's dashboard does with token auth (FINDINGS).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
import yaml

from ops.drivers import driver_for
from ops.drivers.gcp import GcpDriver, RunResult, run_command
from ops.errors import OpsError
from ops.registry import DEFAULT_REGISTRY, REPO_ROOT, Cluster, SshKeySource, TokenSource, load_registry
from tests.fake_ray_cli import init_state

TOKEN = "tok-3f9c2a7e5b1d"


def make_cluster(
    dashboard_url: str = "http://127.0.0.1:9",
    token_env: str | None = None,
    reach: str | None = None,
    ssh_key: Path | None = None,
) -> Cluster:
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
        reach=reach,
        ssh_key=SshKeySource(file=str(ssh_key)) if ssh_key else None,
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


def test_is_not_up_on_a_closed_port_and_says_so_fast(fake_gcp):
    # No head: the tunnel's `ray dashboard` fails at once, and so does the probe.
    driver = fake_gcp.driver()
    started = time.monotonic()
    assert driver.is_up() is False
    assert time.monotonic() - started < 3
    assert fake_gcp.tunnel_records() and not driver_tunnel_alive(driver)


def test_is_not_up_when_the_head_hangs(fake_gcp):
    with socket.socket() as s:  # accepts connections (backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        driver = fake_gcp.driver(url=f"http://127.0.0.1:{s.getsockname()[1]}", probe_timeout_s=0.3)
        started = time.monotonic()
        assert driver.is_up() is False
        assert time.monotonic() - started < 3


# --- reaching the head: the fake `ray`, whose head moves on every `ray up` ------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its parent counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 5.0) -> bool:
    _, alive = psutil.wait_procs([p for p in map(_proc, pids) if p], timeout=timeout)
    return all(gone(p.pid) for p in alive)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def which_head(url: str) -> str:
    """The head that answered `GET <url>/api/version` (the fake head says its address)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url.rstrip("/") + "/api/version", timeout=5) as response:
        return json.loads(response.read())["head"]


def driver_tunnel_alive(driver: GcpDriver) -> bool:
    from ops.drivers.tunnel import tunnels as _tunnels

    tunnel = _tunnels.get(driver.cluster.tunnel_port or -1)
    return tunnel is not None and tunnel.alive()


class FakeGcp:
    """One GCP cluster behind the fake `ray` (tests/fake_ray_cli.py); every process it starts ends with
    the test: the drivers' tunnels through `close()`, the fake head by its pid."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "ray-state"
        self.head_port = free_port()
        init_state(self.state, self.head_port)
        self.ray_bin = tmp_path / "bin" / "ray"
        self.ray_bin.parent.mkdir()
        fake = REPO_ROOT / "tests" / "fake_ray_cli.py"
        self.ray_bin.write_text(f'#!/bin/sh\nexec {sys.executable} {fake} {self.state} "$@"\n')
        self.ray_bin.chmod(0o755)
        self.config_dir = tmp_path / "infra"
        self.config_dir.mkdir()
        (self.config_dir / "us-central2.yaml").write_text(
            "cluster_name: marin-us-central2\nauth: {ssh_user: ray}\n"
        )
        self.key = tmp_path / "keys" / "ray.pem"
        self.key.parent.mkdir()
        self.key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n")
        self.tunnel_port = free_port()
        self.drivers: list[GcpDriver] = []

    def driver(self, url: str | None = None, reach: str | None = None, **kwargs) -> GcpDriver:
        cluster = make_cluster(url or f"http://127.0.0.1:{self.tunnel_port}", reach=reach, ssh_key=self.key)
        driver = GcpDriver(
            cluster,
            ray_bin=str(self.ray_bin),
            config_dir=self.config_dir,
            state_dir=self.tmp / "clusterbot-gcp",
            head_dashboard_port=self.head_port,
            **{"probe_timeout_s": 1.0, "tunnel_open_timeout_s": 10.0, **kwargs},
        )
        self.drivers.append(driver)
        return driver

    def set(self, **fields) -> None:
        state = json.loads((self.state / "state.json").read_text())
        (self.state / "state.json").write_text(json.dumps({**state, **fields}))

    def head(self) -> str | None:
        return json.loads((self.state / "state.json").read_text())["head"]

    def tunnel_records(self) -> list[dict]:
        """Each `ray dashboard` the fake ran: its pid, its ssh-like child's pid, its environment."""
        records = [json.loads(p.read_text()) for p in self.state.glob("tunnel-*.json")]
        return sorted(records, key=lambda r: r["started"])

    def dashboard_calls(self) -> list[str]:
        log = self.state / "argv.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.startswith("dashboard ")]

    def cleanup(self) -> None:
        for driver in self.drivers:
            driver.close()
        pid = json.loads((self.state / "state.json").read_text())["head_pid"]
        if pid and not gone(pid):
            os.kill(pid, signal.SIGTERM)
            wait_gone([pid])
        pids = [pid for r in self.tunnel_records() for pid in (r["pid"], r.get("child")) if pid]
        assert wait_gone(pids), "a tunnel process outlived its driver's close()"


@pytest.fixture
def fake_gcp(tmp_path):
    fake = FakeGcp(tmp_path)
    yield fake
    fake.cleanup()


def test_the_tunnel_opens_on_the_clusters_port_with_the_registrys_key(fake_gcp):
    driver = fake_gcp.driver()
    driver.start()
    url = driver.dashboard_url()
    assert url == f"http://127.0.0.1:{fake_gcp.tunnel_port}"
    assert which_head(url) == "127.0.0.2"
    # `ray dashboard` on the cluster's local port, given a private copy of the config naming the key
    config = fake_gcp.tmp / "clusterbot-gcp" / "configs" / "us-central2.yaml"
    port, head_port = fake_gcp.tunnel_port, fake_gcp.head_port
    assert fake_gcp.dashboard_calls() == [f"dashboard --port {port} --remote-port {head_port} {config}"]
    assert yaml.safe_load(config.read_text())["auth"] == {
        "ssh_user": "ray",
        "ssh_private_key": str(fake_gcp.key),
    }
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    # `ray up` rides on SSH too: the same config
    assert f"up -y --no-config-cache {config}" in (fake_gcp.state / "argv.log").read_text()


def test_every_driver_of_the_cluster_shares_one_tunnel(fake_gcp):
    fake_gcp.driver().start()
    first, second = fake_gcp.driver(), fake_gcp.driver()
    assert which_head(first.dashboard_url()) == which_head(second.dashboard_url()) == "127.0.0.2"
    assert len(fake_gcp.dashboard_calls()) == 1


def test_a_tunnel_that_died_is_reopened(fake_gcp):
    driver = fake_gcp.driver()
    driver.start()
    url = driver.dashboard_url()
    [record] = fake_gcp.tunnel_records()
    os.kill(record["child"], signal.SIGKILL)  # the SSH connection drops; `ray dashboard` exits with it
    assert wait_gone([record["pid"]])
    assert driver.dashboard_url() == url and which_head(url) == "127.0.0.2"
    assert len(fake_gcp.tunnel_records()) == 2 and driver_tunnel_alive(driver)


def test_after_stop_and_start_the_url_reaches_the_new_head(fake_gcp):
    driver = fake_gcp.driver()
    driver.start()
    url = driver.dashboard_url()
    assert which_head(url) == "127.0.0.2"
    old = fake_gcp.tunnel_records()[0]
    driver.stop()
    assert wait_gone([old["pid"], old["child"]])  # stop() ends the tunnel to the head it deletes
    driver.start()
    assert fake_gcp.head() == "127.0.0.3"
    assert driver.dashboard_url() == url and which_head(url) == "127.0.0.3"


def test_a_restart_by_someone_else_is_followed_too(fake_gcp):
    # A person runs `ray down` / `ray up` by hand: the old tunnel dies with the old head.
    driver = fake_gcp.driver()
    driver.start()
    url = driver.dashboard_url()
    config = fake_gcp.config_dir / "us-central2.yaml"
    subprocess.run([fake_gcp.ray_bin, "up", "-y", config], check=True, capture_output=True, timeout=30)
    old = fake_gcp.tunnel_records()[0]
    assert wait_gone([old["pid"]])
    assert which_head(driver.dashboard_url()) == "127.0.0.3" and driver.dashboard_url() == url


def test_close_ends_the_tunnel_and_its_ssh_child(fake_gcp):
    driver = fake_gcp.driver()
    driver.start()
    url = driver.dashboard_url()
    [record] = fake_gcp.tunnel_records()
    assert not gone(record["pid"]) and not gone(record["child"])
    driver.close()
    assert gone(record["pid"]) and wait_gone([record["child"]])
    with pytest.raises(OSError):
        which_head(url)


def test_no_head_no_tunnel_and_no_long_wait(fake_gcp):
    driver = fake_gcp.driver()
    started = time.monotonic()
    assert driver.dashboard_url() == f"http://127.0.0.1:{fake_gcp.tunnel_port}"
    assert time.monotonic() - started < 5
    assert not driver_tunnel_alive(driver)


def test_a_port_that_already_answers_is_used_as_it_is(fake_gcp, dashboard):
    # A person's own `ray dashboard` holds the cluster's port: no second tunnel (it could not bind).
    driver = fake_gcp.driver(url=dashboard)
    assert driver.dashboard_url() == dashboard
    assert fake_gcp.dashboard_calls() == []


def test_a_tunnel_that_cannot_open_says_why_in_the_log(fake_gcp, caplog, monkeypatch):
    monkeypatch.setenv("CLUSTERBOT_TEST_SECRET", "marin-us-central2")  # masked wherever it appears
    driver = fake_gcp.driver()
    driver.dashboard_url()
    assert "does not answer yet" in caplog.text and "exited with code 1" in caplog.text
    assert "Head node of cluster (***) not found!" in caplog.text


def test_the_tunnel_gets_a_minimal_environment(fake_gcp, monkeypatch):
    monkeypatch.setenv("DISCORD_TOKEN", "canary-discord-7f3e")
    monkeypatch.setenv("CLUSTERBOT_CANARY", "canary-env-91ab")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "canary-ray-token-55c1")
    driver = fake_gcp.driver()
    driver.start()
    driver.dashboard_url()
    [record] = fake_gcp.tunnel_records()
    env = record["env"]
    assert not {k for k, v in env.items() if "canary" in v}
    assert env["HOME"] == os.environ["HOME"] and "PATH" in env


def test_a_missing_ssh_key_is_named_with_its_fix(fake_gcp):
    fake_gcp.key.unlink()
    driver = fake_gcp.driver()
    with pytest.raises(OpsError) as err:
        driver.dashboard_url()
    assert str(fake_gcp.key) in err.value.reason and "ssh_key" in err.value.hint
    assert driver.is_up() is False
    assert fake_gcp.dashboard_calls() == []


def test_is_up_follows_the_tunnel(fake_gcp):
    driver = fake_gcp.driver()
    assert driver.is_up() is False
    driver.start()
    assert driver.is_up() is True
    driver.stop()
    assert driver.is_up() is False


def test_internal_reach_follows_the_head_across_a_restart(fake_gcp):
    driver = fake_gcp.driver(reach="internal")
    driver.start()
    assert driver.dashboard_url() == f"http://127.0.0.2:{fake_gcp.head_port}"
    assert which_head(driver.dashboard_url()) == "127.0.0.2"
    driver.stop()
    driver.start()
    assert driver.dashboard_url() == f"http://127.0.0.3:{fake_gcp.head_port}"
    assert which_head(driver.dashboard_url()) == "127.0.0.3"
    assert fake_gcp.dashboard_calls() == []  # no tunnel


def test_internal_reach_notices_a_new_head_it_was_not_told_about(fake_gcp):
    driver = fake_gcp.driver(reach="internal")
    driver.start()
    assert which_head(driver.dashboard_url()) == "127.0.0.2"
    other = fake_gcp.driver(reach="internal")
    other.stop()
    other.start()
    assert driver.dashboard_url() == f"http://127.0.0.3:{fake_gcp.head_port}"


# --- head_exists: said positively, or None ---------------------------------------------------------


def test_head_exists_when_ray_prints_its_address(fake_gcp):
    driver = fake_gcp.driver()
    driver.start()
    assert driver.head_exists() is True


def test_no_head_when_ray_says_this_clusters_head_is_not_found(fake_gcp):
    assert fake_gcp.driver().head_exists() is False


@pytest.mark.parametrize(
    "fail, why",
    [
        ("uninitialized", "Ray warns that a head exists, not up to date, before its 'not found'"),
        ("credentials", "no Google credentials: Ray cannot look"),
    ],
)
def test_a_head_in_doubt_is_not_a_dead_head(fake_gcp, fail, why):
    driver = fake_gcp.driver()
    driver.start()
    fake_gcp.set(fail=fail)
    assert driver.head_exists() is (True if fail == "uninitialized" else None), why


def test_another_clusters_not_found_is_unknown(fake_gcp):
    (fake_gcp.config_dir / "us-central2.yaml").write_text("cluster_name: marin-elsewhere\n")
    assert fake_gcp.driver().head_exists() is None


@pytest.mark.parametrize(
    "result",
    [
        RunResult(None, "Head node of cluster (marin-us-central2) not found!\n", timed_out=True),
        RunResult(127, "sh: 1: ray: not found\n"),
        RunResult(1, "FileNotFoundError: credentials.json not found\n"),
        RunResult(0, ""),
    ],
    ids=["timeout", "no-ray", "other-not-found", "silent"],
)
def test_head_exists_is_unknown_unless_ray_says_so(config_dir, result):
    driver = GcpDriver(make_cluster(), runner=Recorder(result), config_dir=config_dir)
    assert driver.head_exists() is None


def test_head_exists_is_unknown_without_a_config(tmp_path):
    assert GcpDriver(make_cluster(), runner=Recorder(), config_dir=tmp_path).head_exists() is None


# --- the registry's fields for reaching a head --------------------------------------------------------


def test_the_real_gcp_clusters_use_tunnels_on_distinct_ports_with_one_key():
    clusters = [c for c in load_registry(DEFAULT_REGISTRY).clusters.values() if c.driver == "gcp"]
    assert len(clusters) == 7 and {c.reach for c in clusters} == {"tunnel"}
    assert len({c.tunnel_port for c in clusters}) == 7 and all(c.ssh_key for c in clusters)
    local = load_registry(DEFAULT_REGISTRY).get("local")
    assert local.reach is None and local.ssh_key is None and local.tunnel_port is None


def test_a_gcp_cluster_is_reached_by_tunnel_unless_told_otherwise():
    assert make_cluster().reach == "tunnel"
    assert make_cluster(reach="internal").tunnel_port is None


@pytest.mark.parametrize("url", ["http://10.0.0.5:8265", "http://127.0.0.1", "https://127.0.0.1:8266"])
def test_a_tunnel_needs_a_local_port(url):
    with pytest.raises(ValueError, match="not a local port"):
        make_cluster(url)
    assert make_cluster(url, reach="internal").reach == "internal"


def test_a_local_cluster_has_no_reach():
    raw = load_registry(DEFAULT_REGISTRY).get("local").model_dump()
    with pytest.raises(ValueError, match="for GCP clusters"):
        Cluster.model_validate({**raw, "reach": "tunnel"})


def test_a_machine_without_the_key_gets_the_clusters_pair_from_secret_manager(
    config_dir: Path, tmp_path: Path
) -> None:
    """A new bot deploy has no key file: `ray` gets the cluster's one private key, read from the
    secret the registry names and written 0600 where it says, never a key of its own."""
    from ops.context import Context
    from ops.sim.server import SimServer
    from ops.store import LocalStore

    key = tmp_path / "keys" / "marin-us-central2.pem"
    cluster = make_cluster(ssh_key=key).model_copy(update={"ssh_key": SshKeySource(
        file=str(key), private_secret="marin-us-central2-ssh-private-key")})  # fmt: skip
    runner = Recorder()
    private = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----"
    with SimServer(secrets={"hai-gcp-models": {"marin-us-central2-ssh-private-key": private}}) as sim:
        registry = load_registry(DEFAULT_REGISTRY).model_copy(update={"clusters": {"us-central2": cluster}})
        ctx = Context(LocalStore(tmp_path / "store"), registry, cloud_endpoint=lambda _: sim.address,
                      driver_factory=lambda c: GcpDriver(c, runner=runner, config_dir=config_dir,
                                                         state_dir=tmp_path / "gcp"))  # fmt: skip
        try:
            ctx.driver(cluster).stop()
        finally:
            ctx.close()
    assert key.read_text() == private + "\n" and stat.S_IMODE(key.stat().st_mode) == 0o600
    [(argv, _, _)] = runner.calls
    assert yaml.safe_load(Path(argv[-1]).read_text())["auth"]["ssh_private_key"] == str(key)
    assert private not in Path(argv[-1]).read_text()


def test_a_key_secret_that_cannot_be_read_is_not_asked_again_at_every_read(
    config_dir: Path, tmp_path: Path
) -> None:
    """/status reads every cluster often: a secret that could not be read (no credentials here) is
    said in the error every time, but asked again only after `key_retry_s`."""
    key = tmp_path / "keys" / "marin-us-central2.pem"
    cluster = make_cluster(ssh_key=key).model_copy(update={"ssh_key": SshKeySource(
        file=str(key), private_secret="marin-us-central2-ssh-private-key")})  # fmt: skip
    driver = GcpDriver(cluster, runner=Recorder(), config_dir=config_dir, state_dir=tmp_path / "gcp")
    asked = []

    def reader() -> bytes:
        asked.append(1)
        raise PermissionError("no credentials")

    driver.ssh_key_reader = reader
    for _ in range(3):
        with pytest.raises(OpsError, match="marin-us-central2-ssh-private-key could not be read"):
            driver.stop()
    assert len(asked) == 1
    driver.key_retry_s = 0.0
    with pytest.raises(OpsError, match="could not be read"):
        driver.stop()
    assert len(asked) == 2 and not key.exists()
