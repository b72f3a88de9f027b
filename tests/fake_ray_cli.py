"""A fake `ray` CLI for the GCP driver's tests: the cluster-launcher commands, with a head that moves.

Run as `python tests/fake_ray_cli.py STATE_DIR <ray arguments>` (tests wrap it in a one-line script and
pass that as `GcpDriver(ray_bin=...)`, so the driver's real runner and tunnel run it). The cluster lives
in STATE_DIR/state.json:
  - `up` creates a new head: a new address (127.0.0.2, .3, ...: loopback addresses this machine
    answers on) and a "head VM" process serving a tiny dashboard there on `head_port`, whose
    `/api/version` names the head that answered;
  - `down` ends the head process and forgets the head;
  - `get-head-ip` prints the head's address, or fails as Ray 2.60 does ("Head node of cluster (...) not
    found!", after a warning when a head exists but is not up to date: `fail: "uninitialized"`);
    `fail: "credentials"` makes it fail as a missing Google credential would;
  - `dashboard --port P --remote-port R CONFIG` does what Ray's does over SSH: fails when there is no
    head, else runs a child (the `ssh -L`) that forwards 127.0.0.1:P to the head and exits when that
    head is gone (as ssh does when its VM is deleted); the parent waits for it. When the config names
    `auth.ssh_private_key`, the child reads it as ssh would, and fails without it.
Every call appends its arguments to STATE_DIR/argv.log; `dashboard` records its pid, its child's pid
and its environment (STATE_DIR/tunnel-<pid>.json) for the tests to check.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

NOT_FOUND = "RuntimeError: Head node of cluster ({}) not found!"


class State:
    """state.json under an exclusive lock (commands of one test may run at the same time)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "state.json"
        self.lock = state_dir / "state.lock"

    def read(self) -> dict:
        return json.loads(self.path.read_text())

    def update(self, change) -> dict:  # noqa: ANN001 - a function of the state dict
        with open(self.lock, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.read()
            change(state)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
            return state


def init_state(state_dir: Path, head_port: int) -> None:
    """A cluster with no head yet; heads will serve their dashboard on `head_port`."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(
        json.dumps({"head": None, "head_pid": None, "next": 2, "head_port": head_port, "fail": None})
    )


def cluster_name(config: str) -> str:
    return yaml.safe_load(Path(config).read_text())["cluster_name"]


# --- commands ---------------------------------------------------------------------------------------


def up(state: State, config: str) -> int:
    def new_head(s: dict) -> None:
        ip = f"127.0.0.{s['next']}"
        s["next"] += 1
        proc = subprocess.Popen(
            [sys.executable, __file__, str(state.path.parent), "_head", ip, str(s["head_port"])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the "VM" outlives `ray up`
        )
        s["head"], s["head_pid"] = ip, proc.pid

    down(state, config)
    s = state.update(new_head)
    wait_answering(f"http://{s['head']}:{s['head_port']}/api/version", 10)
    print(f"ray up: head {s['head']} of {cluster_name(config)} is up")
    return 0


def down(state: State, config: str) -> int:
    old: dict = {}

    def forget(s: dict) -> None:
        old.update(s)
        s["head"], s["head_pid"] = None, None

    state.update(forget)
    if old.get("head_pid"):
        try:
            os.kill(old["head_pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    print(f"ray down: {cluster_name(config)} has no head")
    return 0


def get_head_ip(state: State, config: str) -> int:
    s = state.read()
    name = cluster_name(config)
    if s["fail"] == "credentials":
        print("google.auth.exceptions.DefaultCredentialsError: Your default credentials were not found.")
        return 1
    if s["head"] and s["fail"] != "uninitialized":
        print(s["head"])
        return 0
    if s["head"]:
        print("Head node (ray-marin-head-1) is in state update-failed.")
    print("Traceback (most recent call last):\n  ...")
    print(NOT_FOUND.format(name))
    return 1


def dashboard(state: State, args: list[str]) -> int:
    port, remote_port = int(args[args.index("--port") + 1]), args[args.index("--remote-port") + 1]
    config = args[-1]
    record = {
        "pid": os.getpid(),
        "started": time.time(),
        "env": dict(os.environ),
        "port": port,
        "child": None,
    }
    recorded = state.path.parent / f"tunnel-{os.getpid()}.json"
    recorded.write_text(json.dumps(record))
    s = state.read()
    if not s["head"]:
        print(f"Failed to forward dashboard from remote port {remote_port} to local port {port}.")
        print(NOT_FOUND.format(cluster_name(config)))
        return 1
    key = (yaml.safe_load(Path(config).read_text()).get("auth") or {}).get("ssh_private_key")
    child = subprocess.Popen(
        [sys.executable, __file__, str(state.path.parent), "_forward", str(port), s["head"], str(key or "")]
    )
    record["child"] = child.pid
    recorded.write_text(json.dumps(record))
    return child.wait()


# --- the processes behind them ------------------------------------------------------------------------


def serve_head(ip: str, port: int) -> None:
    """The head VM's dashboard: answers /api/version with its own address."""

    class Head(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"ray_version": "2.60.0", "head": ip}).encode()
            self.send_response(200 if self.path == "/api/version" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    ThreadingHTTPServer((ip, port), Head).serve_forever()


def forward(state: State, port: int, head: str, key: str) -> int:
    """The `ssh -L` of a tunnel: relay GETs from 127.0.0.1:port to the head; end when the head is gone."""
    if key:
        try:
            Path(key).read_bytes()
        except OSError:
            print(f"Warning: Identity file {key} not accessible: No such file or directory.")
            print("ray@head: Permission denied (publickey).")
            return 255
    head_port = state.read()["head_port"]

    class Relay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            try:
                with urllib.request.urlopen(f"http://{head}:{head_port}{self.path}", timeout=5) as r:
                    status, body = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Relay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while state.read()["head"] == head:  # ssh notices a deleted VM by its keep-alives
        time.sleep(0.1)
    print(f"Connection to {head} closed by remote host.")
    return 255


def wait_answering(url: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"fake head at {url} did not answer within {timeout} s")


def main(argv: list[str]) -> int:
    state_dir, command, *args = argv
    state = State(Path(state_dir))
    if command == "_head":
        serve_head(args[0], int(args[1]))
        return 0
    if command == "_forward":
        return forward(state, int(args[0]), args[1], args[2])
    with open(Path(state_dir) / "argv.log", "a") as log:
        log.write(" ".join([command, *args]) + "\n")
    if command == "up":
        return up(state, args[-1])
    if command == "down":
        return down(state, args[-1])
    if command == "get-head-ip":
        return get_head_ip(state, args[-1])
    if command == "dashboard":
        return dashboard(state, args)
    print(f"fake ray: unknown command {command}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
