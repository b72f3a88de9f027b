"""The GCP driver: a cluster's Ray through Ray's cluster launcher (`ray up` / `ray down`).

The launcher reads the generated config `infra/<cluster>.yaml` (rendered from the one template by
`python -m ops update-configs`) and talks to Compute Engine and Cloud TPU itself; this module only runs
the two commands, as the runbooks do, and asks the dashboard whether the head answers.

Every command goes through one injectable runner (`Runner`), so tests check the exact command lines
without GCP, and a failure becomes one `OpsError` naming the command and the cluster, with the last
lines of the command's output (secret-looking environment values masked) as the hint.

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

import logging
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ops.errors import OpsError
from ops.registry import REPO_ROOT, Cluster

log = logging.getLogger(__name__)

DEFAULT_CONFIG_DIR = REPO_ROOT / "infra"
# `ray up` creates the head VM, pulls the cluster image and runs setup (~10-20 min in the runbooks);
# `ray down` deletes TPU VMs one at a time, each waiting for its operation.
DEFAULT_UP_TIMEOUT_S = 60 * 60.0
DEFAULT_DOWN_TIMEOUT_S = 60 * 60.0
DEFAULT_PROBE_TIMEOUT_S = 3.0
TAIL_LINES = 12
_MAX_LINE = 240
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
    """Start, stop and probe one GCP cluster with Ray's cluster launcher and its generated config."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        runner: Runner = run_command,
        ray_bin: str | None = None,
        config_dir: Path = DEFAULT_CONFIG_DIR,
        up_timeout_s: float = DEFAULT_UP_TIMEOUT_S,
        down_timeout_s: float = DEFAULT_DOWN_TIMEOUT_S,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
    ) -> None:
        self.cluster = cluster
        self.runner = runner
        self.ray_bin = ray_bin or default_ray_bin()
        self.config_dir = config_dir
        self.up_timeout_s = up_timeout_s
        self.down_timeout_s = down_timeout_s
        self.probe_timeout_s = probe_timeout_s

    @property
    def config_path(self) -> Path:
        return self.config_dir / f"{self.cluster.name}.yaml"

    def start(self) -> str:
        """`ray up -y --no-config-cache <config>`: create or update the head; the autoscaler adds workers."""
        self._ray(["up", "-y", "--no-config-cache"], self.up_timeout_s)
        c = self.cluster
        return f"{c.name}: ray up done for {c.ray_cluster_name} in {c.zone}; dashboard at {c.dashboard_url}"

    def stop(self) -> str:
        """`ray down -y <config>`: stop Ray on the head, then delete the head and every worker VM."""
        self._ray(["down", "-y"], self.down_timeout_s)
        c = self.cluster
        return f"{c.name}: ray down deleted the head and workers of {c.ray_cluster_name} in {c.zone}"

    def head_exists(self) -> bool | None:
        """`ray get-head-ip <config>`: an address means a head VM exists (True); Ray's "not found"
        means there is none (False); anything else (no credentials, a timeout) is None: unknown."""
        try:
            result = self._ray(["get-head-ip"], self.probe_timeout_s * 20)
        except OpsError as e:
            return False if "not found" in (e.hint or "").lower() else None
        lines = [line.strip() for line in result.output.splitlines() if line.strip()]
        return True if lines else None

    def dashboard_url(self) -> str:
        return self.cluster.dashboard_url

    def is_up(self) -> bool:
        """Whether the dashboard answers `GET /api/version` with 200 within the probe timeout.

        A 401/403 means a head is running but this machine's token is missing or wrong; that counts as
        not up (nothing else would work either) and is logged so the cause is visible.
        """
        url = self.cluster.dashboard_url.rstrip("/") + "/api/version"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        token = self.cluster.read_token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        # The dashboard is reached through a local tunnel: never through an environment proxy.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=self.probe_timeout_s) as response:
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

    def _ray(self, args: list[str], timeout: float) -> RunResult:
        config = self.config_path
        if not config.is_file():
            raise OpsError(
                f"no cluster config for {self.cluster.name}: {config} does not exist",
                "generate it with `python -m ops update-configs`",
            )
        argv = [self.ray_bin, *args, str(config)]
        shown = " ".join(["ray", *args, _relative(config)])
        log.info("%s: running %s", self.cluster.name, shown)
        try:
            result = self.runner(argv, timeout=timeout, cwd=REPO_ROOT)
        except OSError as e:
            raise OpsError(
                f"`{shown}` for cluster {self.cluster.name} could not start: {e.strerror or e}",
                f"is the Ray CLI installed? (looked for {self.ray_bin})",
            ) from None
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
        tail = [_clip(line) for line in lines[-TAIL_LINES:]]
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


def _redact(text: str, secrets: list[str]) -> str:
    for value in secrets:
        text = text.replace(value, "***")
    return text


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
