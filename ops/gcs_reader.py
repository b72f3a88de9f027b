"""How to run the GCS snapshot (ops/gcs_snapshot.py) for a cluster, fastest way first.

1. In this process, when this process has adopted the cluster's auth (`adopt_cluster_auth`: the CLI,
   which works on one cluster): Ray's GCS client takes its token from the process environment and
   caches it, so only a process dedicated to one cluster may do this.
2. In a child process, when this machine reaches the cluster's GCS port (the local cluster): the
   token goes in the child's environment, never on a command line.
3. As a job on the cluster itself, submitted through the dashboard with the cluster's token, when
   only the dashboard is reachable (the GCP clusters): the snapshot's source runs on the head and
   prints its result to the job's log, which we read back. Packages are capped in size there.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops import gcs_snapshot
from ops.errors import OpsError

if TYPE_CHECKING:
    from ops.ray_api import RayApi

MAX_PACKAGE_BYTES_VIA_JOB = 64 * 2**20  # base64 in a job log: beyond this, a package is not kept


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
    """The snapshot, taken by a job on the cluster itself (only its dashboard is reachable)."""
    from ops.ray_api import PROBE_PREFIX

    code = base64.b64encode(Path(gcs_snapshot.__file__).read_bytes()).decode()
    entrypoint = (
        f"python -c \"import base64; exec(base64.b64decode('{code}'))\" - {MAX_PACKAGE_BYTES_VIA_JOB}"
    )
    sid = f"{PROBE_PREFIX}snapshot-{uuid.uuid4().hex[:12]}"
    try:
        api.submit(entrypoint=entrypoint, submission_id=sid, entrypoint_num_cpus=0)
    except Exception as e:
        raise OpsError(f"the snapshot job was not accepted by {api.cluster.name}: {str(e)[:300]}") from None
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = api.status(sid)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.5)
    try:
        if status != "SUCCEEDED":
            raise OpsError(f"the snapshot job on {api.cluster.name} ended {status or 'unfinished'}")
        return _parse(api.jobs.get_job_logs(sid))
    finally:
        with contextlib.suppress(Exception):  # a leftover probe is hidden from job lists anyway
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                api.jobs.delete_job(sid)
            else:
                api.stop(sid)


def _parse(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(gcs_snapshot.MARKER):
            return json.loads(line[len(gcs_snapshot.MARKER) :])
    raise OpsError("the GCS snapshot printed no result")
