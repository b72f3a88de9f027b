"""Dashboard tunnels: one `ray dashboard` process per local port, forwarding it to a GCP head over SSH.

Shared by every driver object of a cluster in this process (a port can hold one tunnel); each runs in
its own process group with a minimal environment (TUNNEL_ENV, never ours wholesale) and ends with this
process. The GCP driver (ops/drivers/gcp.py) decides when to open, reopen and drop one.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ops.registry import REPO_ROOT

TAIL_LINES = 12
# Dashboards are reached through a local tunnel or the project's network: never an environment proxy.
# One opener for every probe (building one takes ~0.3 ms of CPU; /status probes every GCP cluster).
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_MAX_LINE = 240

# `ray dashboard` imports Ray, bootstraps the config (GCP API calls unless cached) and opens SSH.
DEFAULT_TUNNEL_OPEN_TIMEOUT_S = 60.0
TUNNEL_STOP_GRACE_S = 5.0
# What `ray dashboard`, its GCP provider and its ssh need from our environment; nothing else reaches it
# (never a token of ours). SSH_AUTH_SOCK for a key held by an agent; Google credentials for the provider.
TUNNEL_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "SSH_AUTH_SOCK",
    "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "CLOUDSDK_CORE_PROJECT",
    "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy",
)  # fmt: skip


class Tunnel:
    """One `ray dashboard` process forwarding a local port to a head's dashboard over SSH.

    It runs in its own process group: the port is held by its `ssh -L` child, so ending the tunnel
    means ending the group. Ray's ssh options include `ExitOnForwardFailure=yes` and keep-alives, so
    the process exits when the port is taken or the head VM is gone; `dashboard_url` then opens a new one.
    """

    def __init__(self, argv: list[str], url: str, log_path: Path) -> None:
        self.argv = argv
        self.url = url
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def open(self, timeout: float, probe_timeout: float) -> bool:
        """Start the process; True once the port answers, False when it exits first or `timeout` passed.

        Raises OSError when the program cannot be started."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO_ROOT,
                env=tunnel_env(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        end = time.monotonic() + timeout
        while not answers(self.url, probe_timeout):
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                self.proc.wait(timeout=min(0.1, left))  # returns at once when the tunnel gives up
                return False
            except subprocess.TimeoutExpired:
                pass
        return True

    def close(self, grace: float = TUNNEL_STOP_GRACE_S) -> None:
        """SIGTERM the tunnel's process group, SIGKILL it after `grace`; wait for the process."""
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)  # also after the leader exited: its ssh child may live on
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                try:  # the leader is gone; a child that ignored SIGTERM still holds the group
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return

    def output_tail(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return "\n".join(clip(line) for line in lines[-TAIL_LINES:])


# One tunnel per local port in this process, whichever driver object opened it: a port can hold one.
tunnels: dict[int, Tunnel] = {}
_port_locks: dict[int, threading.Lock] = {}
_registry_lock = threading.Lock()


def port_lock(port: int) -> threading.Lock:
    with _registry_lock:
        return _port_locks.setdefault(port, threading.Lock())


def close_tunnel(port: int) -> None:
    """End the tunnel this process keeps on `port`, if any."""
    with port_lock(port):
        tunnel = tunnels.pop(port, None)
        if tunnel is not None:
            tunnel.close()


@atexit.register
def close_alltunnels() -> None:
    """Every tunnel this process opened ends with it (a CLI run, the bot's exit)."""
    for port in list(tunnels):
        close_tunnel(port)


def tunnel_env() -> dict[str, str]:
    """The tunnel's environment: the variables of TUNNEL_ENV that are set here, never ours wholesale."""
    return {k: os.environ[k] for k in TUNNEL_ENV if k in os.environ}


def answers(url: str, timeout: float) -> bool:
    """Whether an HTTP server answers `GET <url>/api/version` at all (any status: a refused token is
    still a dashboard at the end of the tunnel). Never through an environment proxy."""
    try:
        with NO_PROXY.open(url.rstrip("/") + "/api/version", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def clip(line: str) -> str:
    """A line of a command's output as shown in an error hint: at most _MAX_LINE characters."""
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."
