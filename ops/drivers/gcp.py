"""The GCP driver: a cluster's Ray through Ray's cluster launcher (`ray up`, `ray down`, `ray get-head-ip`,
`ray dashboard`), and how this machine reaches the head.

The launcher reads the generated config `infra/<cluster>.yaml` (rendered from the one template by
`python -m ops update-configs`) and talks to Compute Engine and Cloud TPU itself; this module runs its
commands, as the runbooks do, and asks the dashboard whether the head answers.

Every command that runs to completion goes through one injectable runner (`Runner`), so tests check the
exact command lines without GCP, and a failure becomes one `OpsError` naming the command and the
cluster, with the last lines of the command's output (secret-looking environment values masked) as the
hint. Commands that use SSH (`up`, `down`, `dashboard`) get, when the registry names an `ssh_key`, a
private copy of the config (`$CLUSTERBOT_HOME/gcp/configs/`, 0600) whose `auth.ssh_private_key` points
at it; Ray then registers no key of its own, and its launch hash (which hashes the key's content, not
its path) stays the same for everyone using that key.

Reaching the head (the registry's `reach`; `dashboard_url()` is where it answers now):
  - tunnel: `ray dashboard --port <the registry's local port> <config>` opens an `ssh -L` to the head's
    dashboard. The driver starts it as a child in its own process group, with a minimal environment
    (TUNNEL_ENV, never ours wholesale), its output in `$CLUSTERBOT_HOME/gcp/tunnels/<cluster>.log`.
    There is one tunnel per port in a process, shared by every driver object of the cluster, checked on
    every `dashboard_url()` and reopened when it ended: Ray's ssh exits when the head VM goes away
    (keep-alives) or the port is taken (ExitOnForwardFailure). `stop()` and `start()` drop it (the head
    will be a new VM); `close()` ends it, as does this process's exit. A port that already answers
    without a tunnel of ours (a person's own `ray dashboard`) is used as it is.
  - internal: `http://<address from ray get-head-ip>:8265`, for a bot on a VM in the project's network
    (the config then needs `provider.use_internal_ips: true`, or Ray prints the external address); the
    address is asked again whenever the last one stops answering.
`head_exists()` says False only on Ray's own "Head node of cluster (<name>) not found!" for this cluster
(and not after Ray's warning that a head exists but is not up to date); anything else it cannot read is
None, which never lets a restart go on without a backup.

The Ray token's version: the generated configs fetch the token secret at `latest` (what a person's own
`ray up` gets); `start` runs `ray up` on a private copy that fetches the version the cluster is pinned to
in the store (ops/tokens.py; `token_version_reader`, set by the Context), so a version added for another
cluster, or a rotation not yet rolled out here, never reaches this cluster's nodes. Likewise the image:
that private copy is rendered with the image pinned in the store (`config_renderer`, set by the Context:
ops/images.py `render_for_start`), so a push never changes what a started cluster's new workers pull.

Head-first deletion: decided against here, and left to `ray down`'s own ordering.
Marin's `stop-cluster` deletes the head VM through the Compute API before it deletes the TPUs and runs
`ray down`, so that the autoscaler cannot start workers while the cluster is torn down. Ray 2.60's
`ray down` (`teardown_cluster` in ray/autoscaler/_private/commands.py) already does this:
  1. it first runs `ray stop` on the head over SSH, which SIGTERMs the autoscaler (`monitor.py` is in
     RAY_PROCESSES), so nothing launches workers once deletion starts;
  2. it then deletes `head + workers`, the head first in that list (the GCP provider has no batch
     delete, so nodes are deleted one at a time, each waiting for its operation; with a docker
     `container_name` it first runs `docker stop` on every node in parallel);
  3. it lists the cluster's nodes again after each round and deletes whatever is still there, so a
     worker launched before the head was gone (head unreachable, step 1 skipped with a warning) is
     deleted too before `ray down` returns.
Doing it ourselves would need the Compute Engine API (the head is an n2 VM, not a TPU): neither
`google-cloud-compute` nor the `gcloud` CLI is a dependency of this project or guaranteed on the bot's
host (FINDINGS), and there is no fake for it to test against, so it would be untested code in the one
path that deletes a cluster. What `ray down` does not do is Marin's other gain: deleting the TPUs in
parallel. Its serial deletion is slow on a large cluster, hence the generous default stop timeout; a
parallel pre-delete through google-cloud-tpu (already a dependency, and faked in tests) is the better
follow-up if that proves too slow.

What this gives up: `ray down` only sees the TPU VMs its provider lists (first page of `nodes.list`,
PREEMPTED/TERMINATED filtered out, GCP_API_FACTS 2.3-2.4), so dead spot VMs survive it and keep counting
against quota. A pre-delete that lists TPUs by the `ray-cluster-name` label itself (as Marin's does)
would catch them; until that exists, the health cleanup of PREEMPTED/TERMINATED VMs has to.

Note that Ray's GCP node provider imports `googleapiclient` (the `google-api-python-client` package),
which `ray[default]` does not pull in; a failure for that reason gets a hint saying so.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from ops.drivers.tunnel import (
    DEFAULT_TUNNEL_OPEN_TIMEOUT_S,
    NO_PROXY,
    TAIL_LINES,
    Tunnel,
    answers,
    clip,
    close_tunnel,
    port_lock,
    tunnels,
)
from ops.errors import OpsError
from ops.registry import REPO_ROOT, Cluster, clusterbot_home

log = logging.getLogger(__name__)

DEFAULT_CONFIG_DIR = REPO_ROOT / "infra"
# `ray up` creates the head VM, pulls the cluster image and runs setup (~10-20 min in the runbooks);
# `ray down` deletes TPU VMs one at a time, each waiting for its operation.
DEFAULT_UP_TIMEOUT_S = 60 * 60.0
DEFAULT_DOWN_TIMEOUT_S = 60 * 60.0
DEFAULT_PROBE_TIMEOUT_S = 3.0
# The head's dashboard port: the template's `ray start --head --dashboard-host=0.0.0.0` keeps Ray's default.
HEAD_DASHBOARD_PORT = 8265
# Ray 2.60 (`_get_running_head_node`) warns so before it says "not found" about a head that exists.
_NOT_UP_TO_DATE = re.compile(r"Head node \(.*\) is in state ")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|PRIVATE", re.IGNORECASE)
_MIN_SECRET_LEN = 6


@dataclass(frozen=True)
class RunResult:
    """What a command did: its exit code (None when it was killed for its timeout) and its output
    (stdout and stderr interleaved)."""

    returncode: int | None
    output: str
    timed_out: bool = False


class Runner(Protocol):
    """Runs one command to completion or timeout; raises OSError only when it cannot start it."""

    def __call__(self, argv: Sequence[str], *, timeout: float, cwd: Path) -> RunResult: ...


def run_command(argv: Sequence[str], *, timeout: float, cwd: Path, kill_grace_s: float = 10.0) -> RunResult:
    """The default runner: run `argv` in its own process group, stdin closed, output captured.

    On timeout the whole group gets SIGTERM, then SIGKILL after `kill_grace_s`: `ray up` starts ssh and
    rsync children that would otherwise outlive it. Raises OSError when the program cannot be started.
    """
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return RunResult(proc.returncode, out or "")
    except subprocess.TimeoutExpired:
        return RunResult(None, _stop_group(proc, kill_grace_s), timed_out=True)


def _stop_group(proc: subprocess.Popen[str], grace: float) -> str:
    """SIGTERM, then SIGKILL, the command's process group; return the output read so far."""
    partial: str | bytes | None = None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=grace)
            return out or ""
        except subprocess.TimeoutExpired as e:
            partial = e.output
    # Something outside the group (it called setsid) still holds the pipe: stop reading.
    if proc.stdout:
        proc.stdout.close()
    proc.wait()
    return partial.decode(errors="replace") if isinstance(partial, bytes) else partial or ""


def default_ray_bin() -> str:
    """The `ray` of the environment clusterbot runs in (same Ray as the cluster image), else PATH's."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.is_file() else "ray"


class GcpDriver:
    """Start, stop, find and reach one GCP cluster's head with Ray's cluster launcher and its config."""

    # The version of the cluster's token secret its nodes must fetch (set by the Context); None: the
    # config's own (`latest`).
    token_version_reader: Callable[[], str] | None = None
    # The config a start must use, rendered with the store's image pin (set by the Context); None: the
    # generated file.
    config_renderer: Callable[[], str | None] | None = None
    # Reads the private half of the cluster's SSH key pair from Secret Manager (set by the Context):
    # a machine without the key file (a new bot deploy) gets the cluster's one pair, never a new one.
    ssh_key_reader: Callable[[], bytes] | None = None
    # How long a key that could not be read is not asked for again: /status asks on every read, and
    # each try makes a Secret Manager client (without credentials: a metadata-server probe, ~4 ms of
    # CPU per cluster; issue 10).
    key_retry_s: float = 60.0

    def __init__(
        self,
        cluster: Cluster,
        *,
        runner: Runner = run_command,
        ray_bin: str | None = None,
        config_dir: Path = DEFAULT_CONFIG_DIR,
        state_dir: Path | None = None,
        up_timeout_s: float = DEFAULT_UP_TIMEOUT_S,
        down_timeout_s: float = DEFAULT_DOWN_TIMEOUT_S,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        tunnel_open_timeout_s: float = DEFAULT_TUNNEL_OPEN_TIMEOUT_S,
        head_dashboard_port: int = HEAD_DASHBOARD_PORT,
    ) -> None:
        """`state_dir`: where this machine keeps the tunnel's log and the config `ray` gets with the
        registry's SSH key (default `$CLUSTERBOT_HOME/gcp`)."""
        self.cluster = cluster
        self.runner = runner
        self.ray_bin = ray_bin or default_ray_bin()
        self.config_dir = config_dir
        self.state_dir = state_dir or clusterbot_home() / "gcp"
        self.up_timeout_s = up_timeout_s
        self.down_timeout_s = down_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.tunnel_open_timeout_s = tunnel_open_timeout_s
        self.head_dashboard_port = head_dashboard_port
        self._head_ip: str | None = None  # reach "internal": the head's address last seen
        self._key_unread: tuple[float, str] | None = None  # (when, why) the key's secret was not read

    @property
    def config_path(self) -> Path:
        return self.config_dir / f"{self.cluster.name}.yaml"

    # -- the cluster's life ------------------------------------------------------------------------
    def start(self) -> str:
        """`ray up -y --no-config-cache <config>`: create or update the head; the autoscaler adds workers.

        The head may be a new VM: the old tunnel and address are dropped, the next `dashboard_url`
        reaches the new head."""
        self._forget_head()
        self._ray(["up", "-y", "--no-config-cache"], self.up_timeout_s, ssh=True, pin_token=True)
        c = self.cluster
        where = c.dashboard_url + " (tunnel)" if c.reach == "tunnel" else "the head's internal address"
        return f"{c.name}: ray up done for {c.ray_cluster_name} in {c.zone}; dashboard at {where}"

    def stop(self) -> str:
        """`ray down -y <config>`: stop Ray on the head, then delete the head and every worker VM."""
        self._forget_head()
        self._ray(["down", "-y"], self.down_timeout_s, ssh=True)
        c = self.cluster
        return f"{c.name}: ray down deleted the head and workers of {c.ray_cluster_name} in {c.zone}"

    def close(self) -> None:
        """End the tunnel this process keeps to the cluster's head, if any."""
        if self.cluster.tunnel_port is not None:
            close_tunnel(self.cluster.tunnel_port)

    def _forget_head(self) -> None:
        self._head_ip = None
        self.close()

    # -- the head --------------------------------------------------------------------------------------
    def tpu_endpoint(self) -> None:
        """Google's own endpoint (application default credentials)."""
        return None

    def head_exists(self) -> bool | None:
        """`ray get-head-ip <config>`: an address means a head VM exists (True). False only on Ray's own
        "Head node of cluster (<name>) not found!" for this cluster, without the warning Ray prints first
        when a head exists but is not up to date (that head may still run jobs: True). Anything else
        (no credentials, no config, a timeout) is None: unknown."""
        return self._find_head()[0]

    def _find_head(self) -> tuple[bool | None, str | None]:
        """(whether a head exists, its address when `ray get-head-ip` printed one)."""
        try:
            result, _ = self._run(["get-head-ip"], self.probe_timeout_s * 20, ssh=False)
        except OpsError as e:
            log.warning("%s: cannot tell whether a head exists: %s", self.cluster.name, e)
            return None, None
        lines = [line.strip() for line in result.output.splitlines() if line.strip()]
        if result.returncode == 0:
            return (True, _address(lines[-1])) if lines else (None, None)
        if any(_NOT_UP_TO_DATE.search(line) for line in lines):
            return True, None
        missing = f"Head node of cluster ({self.cluster.ray_cluster_name}) not found!"
        if not result.timed_out and any(line.endswith(missing) for line in lines):
            return False, None
        log.warning(
            "%s: `ray get-head-ip` %s; whether a head exists is unknown. %s",
            self.cluster.name,
            "timed out" if result.timed_out else f"failed with exit code {result.returncode}",
            self._hint(result.output),
        )
        return None, None

    def dashboard_url(self) -> str:
        """Where this machine reaches the head's dashboard now, by the registry's `reach`.

        tunnel: the registry's local URL, after making sure a tunnel serves it: ours while it runs, or a
        new `ray dashboard` (waited for until it answers, up to `tunnel_open_timeout_s`), or someone
        else's that answers there. internal: `http://<head address>:8265`, the address asked again when
        the last one stops answering (the registry's URL when no head was ever found). Nothing answering
        is not an error here (the caller's probe finds it, and asks `head_exists`); a missing config or
        SSH key is an OpsError."""
        if self.cluster.reach == "internal":
            return self._internal_url()
        return self._tunnel_url()

    def _internal_url(self) -> str:
        if self._head_ip and answers(self._url_at(self._head_ip), self.probe_timeout_s):
            return self._url_at(self._head_ip)
        exists, ip = self._find_head()
        if ip:
            self._head_ip = ip
        elif exists is False:
            self._head_ip = None
        return self._url_at(self._head_ip) if self._head_ip else self.cluster.dashboard_url

    def _url_at(self, ip: str) -> str:
        host = f"[{ip}]" if ":" in ip else ip
        return f"http://{host}:{self.head_dashboard_port}"

    def _tunnel_url(self) -> str:
        url = self.cluster.dashboard_url.rstrip("/")
        port = self.cluster.tunnel_port
        assert port is not None  # the registry checks that a tunnel's URL has a local port
        with port_lock(port):
            tunnel = tunnels.get(port)
            if tunnel is not None:
                # Alive is enough: a head whose dashboard does not answer yet (or any more) would not
                # answer through a new tunnel either, and ssh's keep-alives end one whose VM is gone.
                if tunnel.alive():
                    return url
                log.info("%s: the dashboard tunnel on port %d ended; reopening it", self.cluster.name, port)
                tunnel.close()
                del tunnels[port]
            elif answers(url, self.probe_timeout_s):
                log.info("%s: port %d answers (a tunnel this process did not open)", self.cluster.name, port)
                return url
            tunnel = self._open_tunnel(url, port)
            if tunnel.alive():
                tunnels[port] = tunnel
            else:
                tunnel.close()  # its ssh child may have outlived it
        return url

    def _open_tunnel(self, url: str, port: int) -> Tunnel:
        config = self._config(ssh=True)
        args = ["dashboard", "--port", str(port), "--remote-port", str(self.head_dashboard_port)]
        log_path = self.state_dir / "tunnels" / f"{self.cluster.name}.log"
        tunnel = Tunnel([self.ray_bin, *args, str(config)], url, log_path)
        shown = " ".join(["ray", *args, _relative(config)])
        log.info("%s: opening the dashboard tunnel: %s", self.cluster.name, shown)
        try:
            opened = tunnel.open(self.tunnel_open_timeout_s, self.probe_timeout_s)
        except OSError as e:
            raise OpsError(
                f"`{shown}` for cluster {self.cluster.name} could not start: {e.strerror or e}",
                f"is the Ray CLI installed? (looked for {self.ray_bin})",
            ) from None
        if not opened:
            state = "is still waiting" if tunnel.alive() else f"exited with code {tunnel.proc.returncode}"
            tail = _redact(tunnel.output_tail(), self._secrets())
            log.warning(
                "%s: the dashboard tunnel on port %d does not answer yet (`%s` %s); its output:\n%s",
                self.cluster.name,
                port,
                shown,
                state,
                tail,
            )
        return tunnel

    def is_up(self) -> bool:
        """Whether the dashboard, where `dashboard_url` reaches it, answers `GET /api/version` with 200
        within the probe timeout.

        A 401/403 means a head is running but this machine's token is missing or wrong; that counts as
        not up (nothing else would work either) and is logged so the cause is visible.
        """
        try:
            base = self.dashboard_url()
        except OpsError as e:
            log.warning("%s: cannot reach the dashboard: %s", self.cluster.name, e)
            return False
        url = base.rstrip("/") + "/api/version"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        token = self.cluster.read_token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with NO_PROXY.open(request, timeout=self.probe_timeout_s) as response:
                return response.status == 200
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                log.warning(
                    "%s: dashboard %s refused the probe with %d (%s)",
                    self.cluster.name,
                    url,
                    e.code,
                    "token rejected" if token else "no token on this machine",
                )
            return False
        except (urllib.error.URLError, OSError, ValueError):
            return False

    # -- running `ray` ---------------------------------------------------------------------------------
    def _config(self, ssh: bool, pin_token: bool = False) -> Path:
        """The config `ray` gets: the generated one, or a private copy: for commands that use SSH when
        the registry names a key, with `auth.ssh_private_key` pointing at it; for `up` (`pin_token`),
        rendered with the pinned image and fetching the token at the cluster's pinned version."""
        config = self.config_path
        if not config.is_file():
            raise OpsError(
                f"no cluster config for {self.cluster.name}: {config} does not exist",
                "generate it with `python -m ops update-configs`",
            )
        key = None if not ssh else self.cluster.ssh_key
        key_path = key.path() if key is not None else None
        unread = self._fetch_key(key_path) if key_path is not None and not key_path.is_file() else ""
        if key_path is not None and not key_path.is_file():  # before any work: /status asks this often
            raise OpsError(
                f"no SSH key for cluster {self.cluster.name}: {key_path} does not exist{unread}",
                "put there the private key whose public half is in the project's ssh-keys metadata for user "
                "`ray` (infra/clusters.yaml, field ssh_key), or name its secret (ssh_key.private_secret)",
            )
        version = self.token_version_reader() if pin_token and self.token_version_reader else None
        rendered = self.config_renderer() if pin_token and self.config_renderer else None
        if key_path is None and version is None and rendered is None:
            return config
        # libyaml's loader and dumper where PyYAML has them: the pure-Python ones take ~30 ms a config.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(rendered if rendered is not None else config.read_text(), Loader=loader)  # noqa: S506
        made = ["the pinned image"] if rendered is not None else []
        if key_path is not None:
            data.setdefault("auth", {})["ssh_private_key"] = str(key_path)
            made.append("this machine's SSH key")
        if version is not None:
            data = pin_token_version(data, self.cluster, version)
            made.append(f"token version {version}")
        out = self.state_dir / "configs" / config.name
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text = f"# {_relative(config)} with {' and '.join(made)} (ops/drivers/gcp.py)\n" + yaml.dump(
            data, Dumper=dumper, sort_keys=False
        )
        if not out.is_file() or out.read_text() != text:
            tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o600)
            os.replace(tmp, out)
        return out

    def _fetch_key(self, path: Path) -> str:
        """The private key from the cluster's `private_secret`, written 0600 where the registry says
        (`ssh_key.file`). "" when written or no secret is named; else why not, for the caller's error."""
        key = self.cluster.ssh_key
        if key is None or key.private_secret is None or self.ssh_key_reader is None:
            return ""
        if self._key_unread is not None and time.monotonic() - self._key_unread[0] < self.key_retry_s:
            return self._key_unread[1]
        try:
            data = self.ssh_key_reader()
        except Exception as e:  # no credentials, no such secret: said with the missing file
            why = f" and its secret {key.private_secret} could not be read ({type(e).__name__})"
            self._key_unread = (time.monotonic(), why)
            return why
        self._key_unread = None
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data if data.endswith(b"\n") else data + b"\n")
        os.replace(tmp, path)
        log.info("%s: SSH key written to %s from Secret Manager (%s)", self.cluster.name, path,
                 key.private_secret)  # fmt: skip
        return ""

    def _run(
        self, args: list[str], timeout: float, *, ssh: bool, pin_token: bool = False
    ) -> tuple[RunResult, str]:
        """Run `ray <args> <config>` through the runner: its result and the command as shown to people.
        OpsError only when it cannot run at all."""
        config = self._config(ssh, pin_token)
        argv = [self.ray_bin, *args, str(config)]
        shown = " ".join(["ray", *args, _relative(config)])
        log.info("%s: running %s", self.cluster.name, shown)
        try:
            return self.runner(argv, timeout=timeout, cwd=REPO_ROOT), shown
        except OSError as e:
            raise OpsError(
                f"`{shown}` for cluster {self.cluster.name} could not start: {e.strerror or e}",
                f"is the Ray CLI installed? (looked for {self.ray_bin})",
            ) from None

    def _ray(self, args: list[str], timeout: float, *, ssh: bool, pin_token: bool = False) -> RunResult:
        """`_run`, with a timeout or a non-zero exit as an OpsError naming the command and the cluster."""
        result, shown = self._run(args, timeout, ssh=ssh, pin_token=pin_token)
        if result.timed_out:
            raise OpsError(
                f"`{shown}` for cluster {self.cluster.name} timed out after {timeout:g} s and was "
                "stopped; the cluster may be partly up or partly deleted",
                self._hint(result.output),
            )
        if result.returncode != 0:
            raise OpsError(
                f"`{shown}` for cluster {self.cluster.name} failed with exit code {result.returncode}",
                self._hint(result.output),
            )
        return result

    def _hint(self, output: str) -> str:
        lines = [line.rstrip() for line in _redact(output, self._secrets()).splitlines() if line.strip()]
        if not lines:
            return "the command printed nothing"
        tail = [clip(line) for line in lines[-TAIL_LINES:]]
        hint = f"last {len(tail)} lines of its output:\n" + "\n".join(tail)
        if "googleapiclient" in output:
            hint += "\nRay's GCP provider needs `pip install google-api-python-client` where `ray` runs"
        return hint

    def _secrets(self) -> list[str]:
        values = [v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN]
        token = self.cluster.read_token()
        if token:
            values.append(token)
        return sorted(set(values), key=len, reverse=True)


def pin_token_version(config: dict, cluster: Cluster, version: str) -> dict:
    """The config with its one fetch of the token secret at `latest` (infra/cluster-template.yaml's
    setup_commands) made a fetch of `version`; OpsError when the config has not exactly one."""
    if not version.isdigit():
        raise OpsError(f"{cluster.name}'s token version {version!r} is not a version number")
    latest = f"versions access latest --secret={cluster.token_secret} "
    commands = list(config.get("setup_commands") or [])
    hits = [i for i, c in enumerate(commands) if isinstance(c, str) and latest in c]
    if len(hits) != 1:
        raise OpsError(
            f"{cluster.name}'s config has {len(hits)} fetches of secret {cluster.token_secret} at latest "
            "in its setup_commands, not one: cannot pin the token's version",
            "regenerate it from infra/cluster-template.yaml (`python -m ops update-configs`)",
        )
    commands[hits[0]] = commands[hits[0]].replace(latest, latest.replace("latest", version))
    return {**config, "setup_commands": commands}


def _address(text: str) -> str | None:
    """The IP address `ray get-head-ip` printed, or None (Ray prints "None" for a head without one)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _redact(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, "***")
    return text


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
