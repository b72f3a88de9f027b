"""What only a cluster's GCS holds, read in one go: the JobInfo of every job (entrypoint resources)
and the bytes of the `gcs://` packages that unfinished jobs use.

Standalone on purpose (the standard library and Ray only): besides running here, its source is
sent as a job to clusters whose GCS this machine cannot reach, and runs there on the head.
"""

import base64
import json
import os
import sys

MARKER = "CLUSTERBOT-SNAPSHOT "


def snapshot(address, max_package_bytes=None):
    """{"infos": {submission id: JobInfo}, "packages": {uri: base64 or None}, "too_large": [uri]}."""
    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray._raylet import GcsClient
    from ray.dashboard.modules.job.common import JobInfoStorageClient

    gcs = GcsClient(address=address)
    prefix = JobInfoStorageClient.JOB_DATA_KEY_PREFIX.encode()
    keys = gcs.internal_kv_keys(prefix, KV_NAMESPACE_JOB, timeout=20)
    values = gcs.internal_kv_multi_get(keys, KV_NAMESPACE_JOB, timeout=20) if keys else {}
    infos = {k[len(prefix) :].decode(): json.loads(v) for k, v in values.items()}
    uris = set()
    for info in infos.values():
        if info.get("status") in ("PENDING", "RUNNING"):
            env = json.loads(info.get("runtime_env_json") or "{}")
            for uri in [env.get("working_dir"), *(env.get("py_modules") or [])]:
                if isinstance(uri, str) and uri.startswith("gcs://"):
                    uris.add(uri)
    packages, too_large, total = {}, [], 0
    for uri in sorted(uris):
        data = gcs.internal_kv_get(uri.encode(), None, timeout=60)
        if data is not None and max_package_bytes is not None and total + len(data) > max_package_bytes:
            too_large.append(uri)
            continue
        total += len(data or b"")
        packages[uri] = None if data is None else base64.b64encode(data).decode()
    return {"infos": infos, "packages": packages, "too_large": too_large}


if __name__ == "__main__":
    # argv: [ADDRESS or "-" for the job's own cluster (RAY_ADDRESS), MAX_PACKAGE_BYTES or "-"]
    args = sys.argv[1:] + ["-", "-"]
    address = os.environ["RAY_ADDRESS"] if args[0] == "-" else args[0]
    limit = None if args[1] == "-" else int(args[1])
    print(MARKER + json.dumps(snapshot(address, limit)), flush=True)
