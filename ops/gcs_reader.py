"""Read what only a cluster's GCS holds (JobInfo entrypoint resources, working_dir packages).

Ray's GCS client takes its auth token from the process environment, once per process. A process
that works on one cluster (the CLI) puts that cluster's auth there (`adopt_cluster_auth`) and reads
in-process; any other process (the bot, which serves every cluster) reads through a child process
(`python -m ops.gcs_reader`) per read, which keeps one cluster's token out of every other cluster's
calls, and out of the command line. Request on stdin, JSON on stdout.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

from ops.errors import OpsError


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


def read_gcs(address: str, token: str | None, request: dict[str, Any], timeout: float = 60) -> Any:
    """Run one request ({"op": "snapshot"}: job infos and packages of unfinished jobs) against the GCS."""
    if _process_has_auth(token):
        try:
            return _serve(address, request)
        except Exception:  # Ray read its auth before it was adopted (it caches it): use a child
            pass
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_AUTH_MODE="token" if token else "disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if token:
        env["RAY_AUTH_TOKEN"] = token
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ops.gcs_reader", address],
            input=json.dumps(request).encode(),
            capture_output=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise OpsError(f"reading the GCS at {address} took over {timeout:.0f}s") from None
    if proc.returncode != 0:
        last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise OpsError(f"reading the GCS at {address} failed: {last[0][:300]}")
    return json.loads(proc.stdout)


def _serve(address: str, request: dict[str, Any]) -> Any:
    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray._raylet import GcsClient
    from ray.dashboard.modules.job.common import JobInfoStorageClient

    gcs = GcsClient(address=address)
    if request["op"] == "snapshot":
        prefix = JobInfoStorageClient.JOB_DATA_KEY_PREFIX.encode()
        keys = gcs.internal_kv_keys(prefix, KV_NAMESPACE_JOB, timeout=20)
        values = gcs.internal_kv_multi_get(keys, KV_NAMESPACE_JOB, timeout=20) if keys else {}
        infos = {k[len(prefix) :].decode(): json.loads(v) for k, v in values.items()}
        uris = set()
        for info in infos.values():
            if info.get("status") in ("PENDING", "RUNNING"):
                env = json.loads(info.get("runtime_env_json") or "{}")
                uris.update(u for u in [env.get("working_dir"), *(env.get("py_modules") or [])]
                            if isinstance(u, str) and u.startswith("gcs://"))  # fmt: skip
        packages = {}
        for uri in sorted(uris):
            data = gcs.internal_kv_get(uri.encode(), None, timeout=60)
            packages[uri] = None if data is None else base64.b64encode(data).decode()
        return {"infos": infos, "packages": packages}
    raise ValueError(f"unknown op {request['op']!r}")


if __name__ == "__main__":
    json.dump(_serve(sys.argv[1], json.load(sys.stdin)), sys.stdout)
