"""How to run the GCS snapshot (ops/gcs_snapshot.py) for a cluster, fastest way first.

1. In this process, when this process has adopted the cluster's auth (`adopt_cluster_auth`: the CLI,
   which works on one cluster): Ray's GCS client takes its token from the process environment and
   caches it, so only a process dedicated to one cluster may do this.
2. In a child process, when this machine reaches the cluster's GCS port (the local cluster): the
   token goes in the child's environment, never on a command line.
3. As a job on the cluster itself, submitted through the dashboard with the cluster's token, when
   only the dashboard is reachable (the GCP clusters): the snapshot's source runs on the head and
   hands its result back through the dashboard, never through its log. Packages are capped in size.

Why a file read through the dashboard, for 3: the job's stdout is its driver log on the head, which
outlives the job (and `delete_job`), and the snapshot holds every job's runtime_env, env-var secrets
included. The job writes it to a 0600 file with an unguessable name in the session's logs dir, prints
only that name, and waits; we read the file through the dashboard's log API (`/api/v0/logs/file`,
which serves files under a node's logs dir, Ray 2.60 `LogAgentV1Grpc.StreamLog`) with the cluster's
token, then stop the job, which deletes the file on SIGTERM, or at its own deadline if we died. So
the data leaves the head only over the channel that already carries the token, and lives there only
while we read it (or until the deadline). Whoever can list or read that dir over HTTP (the log API,
the agent's `/logs`, both behind the token in token-auth mode) could as well submit a job reading the
GCS: the file adds no reader, only a window of seconds. The entrypoint (kept in the JobInfo, shown
in the dashboard) holds the snapshot's source and two numbers; the name is drawn on the head.
Rejected: encrypting the printed result to a key we pass in: the head has only the standard
library, so that means public-key crypto and a cipher written by hand, and the ciphertext would stay
in the log for good.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops import gcs_snapshot
from ops.errors import BadInput, OpsError

if TYPE_CHECKING:
    from ops.ray_api import RayApi

SNAPSHOT_PREFIX = "clusterbot-probe-snapshot-"  # starts with ray_api.PROBE_PREFIX: hidden from job lists
MAX_PACKAGE_BYTES_VIA_JOB = 64 * 2**20  # base64 through the log API: beyond this, a package is not kept


def adopt_cluster_auth(token: str | None) -> None:
    """For a process that works on one cluster: put its auth where Ray's clients read it."""
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    if token:
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    else:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_AUTH_TOKEN", None)


def _process_has_auth(token: str | None) -> bool:
    if token:
        return os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_AUTH_TOKEN") == token
    return os.environ.get("RAY_AUTH_MODE") == "disabled"


def read_gcs(address: str, token: str | None, timeout: float = 60) -> dict[str, Any]:
    """The snapshot of the GCS at `address` (reachable from here), in-process or in a child."""
    if _process_has_auth(token):
        try:
            return gcs_snapshot.snapshot(address)
        except Exception:  # Ray read its auth before it was adopted (it caches it): use a child
            pass
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_AUTH_MODE="token" if token else "disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if token:
        env["RAY_AUTH_TOKEN"] = token
    try:
        proc = subprocess.run([sys.executable, "-m", "ops.gcs_snapshot", address], capture_output=True,
                              env=env, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise OpsError(f"reading the GCS at {address} took over {timeout:.0f}s") from None
    if proc.returncode != 0:
        last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise OpsError(f"reading the GCS at {address} failed: {last[0][:300]}")
    return _parse(proc.stdout.decode())


def read_via_job(api: RayApi, timeout: float = 180) -> dict[str, Any]:
    """The snapshot, taken by a job on the cluster itself (only its dashboard is reachable); nothing
    of it printed on the head (see above). The job keeps its result at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    sid = submit_snapshot_job(api, hold_s=timeout)
    try:
        node_id, name = wait_for_handoff(api, sid, timeout=deadline - time.monotonic())
        return json.loads(fetch_log_file(api, node_id, name, timeout=max(deadline - time.monotonic(), 10)))
    finally:
        _end(api, sid, timeout=10)


def submit_snapshot_job(api: RayApi, hold_s: float) -> str:
    """Start the snapshot job (it keeps its result `hold_s` seconds at most); its submission id."""
    code = base64.b64encode(Path(gcs_snapshot.__file__).read_bytes()).decode()
    entrypoint = (
        f"python -c \"import base64; exec(base64.b64decode('{code}'))\" - {MAX_PACKAGE_BYTES_VIA_JOB} "
        f"{max(hold_s, 1):.0f}"
    )
    sid = f"{SNAPSHOT_PREFIX}{uuid.uuid4().hex[:12]}"
    try:
        api.submit(entrypoint=entrypoint, submission_id=sid, entrypoint_num_cpus=0)
    except Exception as e:
        raise OpsError(f"the snapshot job was not accepted by {api.cluster.name}: {str(e)[:300]}") from None
    return sid


def wait_for_handoff(api: RayApi, sid: str, timeout: float) -> tuple[str, str]:
    """(node id, result file name) once the job has written its result; OpsError if it failed."""
    deadline = time.monotonic() + timeout
    node_id = None
    while True:
        try:
            status = api.status(sid)
        except BadInput:  # a refused token: looking again will not change it
            raise
        except OpsError:  # no answer this time: the deadline bounds the looking
            status = None
        logs = "" if status in (None, "PENDING") else _job_logs(api, sid)
        for line in logs.splitlines():
            if line.startswith(gcs_snapshot.FAILED_MARKER):
                what = line[len(gcs_snapshot.FAILED_MARKER) :].strip()[:100]
                raise OpsError(f"the snapshot job on {api.cluster.name} failed: {what}")
            if line.startswith(gcs_snapshot.HANDOFF_MARKER):
                name = line[len(gcs_snapshot.HANDOFF_MARKER) :].strip()
                node_id = node_id or api.jobs.get_job_info(sid).driver_node_id
                if not name.startswith(gcs_snapshot.HANDOFF_PREFIX) or "/" in name or not node_id:
                    raise OpsError(f"the snapshot job on {api.cluster.name} named no usable result")
                return node_id, name
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            raise OpsError(f"the snapshot job on {api.cluster.name} ended {status} without a result")
        if time.monotonic() > deadline:
            raise OpsError(f"the snapshot job on {api.cluster.name} gave no result within {timeout:.0f}s")
        time.sleep(0.25)


def fetch_log_file(api: RayApi, node_id: str, name: str, timeout: float = 60) -> bytes:
    """The whole file `name` of the node's logs dir, through the dashboard's log API."""
    query = urllib.parse.urlencode(
        {"node_id": node_id, "filename": name, "lines": -1, "timeout": int(timeout)}
    )
    req = urllib.request.Request(f"{api.url}/api/v0/logs/file?{query}", headers=api.headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise api.token_refused(e.code) from None
        raise OpsError(f"reading the snapshot from {api.cluster.name} failed: HTTP {e.code}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise OpsError(
            f"reading the snapshot from {api.cluster.name} failed: {getattr(e, 'reason', e)}"
        ) from None


def _job_logs(api: RayApi, sid: str) -> str:
    try:
        return api.jobs.get_job_logs(sid)
    except Exception:  # not written yet: the next look will tell
        return ""


def _end(api: RayApi, sid: str, timeout: float) -> None:
    """Stop the job (it deletes its result on SIGTERM), wait for it to end, delete it. Best effort:
    a job left running deletes its result at its own deadline, and is hidden from job lists anyway."""
    with contextlib.suppress(Exception):
        if api.status(sid) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            api.stop(sid)
        end = time.monotonic() + timeout
        while api.status(sid) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.monotonic() < end:
            time.sleep(0.1)
        api.jobs.delete_job(sid)


def _parse(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(gcs_snapshot.MARKER):
            return json.loads(line[len(gcs_snapshot.MARKER) :])
    raise OpsError("the GCS snapshot printed no result")
