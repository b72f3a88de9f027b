"""What only a cluster's GCS holds, read in one go: the JobInfo of every job (entrypoint resources)
and the bytes of the `gcs://` packages that unfinished jobs use.

Standalone on purpose (the standard library and Ray only): besides running here, its source is
sent as a job to clusters whose GCS this machine cannot reach, and runs there on the head.

Run here (a child of ours), it prints its result to our pipe. Run as a job, it must not print it:
a job's stdout is its driver log on the head, which outlives the job (and `delete_job`), and the
result holds every job's runtime_env, env-var secrets included. There it hands the result over
(`hand_off`): a 0600 file with an unguessable name in the session's logs dir, which the dashboard's
log API serves to a caller holding the cluster's token; it prints only that name, then waits, and
deletes the file when stopped (SIGTERM/SIGINT/SIGHUP: `stop_job`) or at its own deadline, whichever
comes first. ops/gcs_reader.py says why this design.
"""

import base64
import json
import os
import secrets
import signal
import sys
import time

MARKER = "CLUSTERBOT-SNAPSHOT "  # result line of a child run here
HANDOFF_MARKER = "CLUSTERBOT-SNAPSHOT-FILE "  # a job's only line on success: the result file's name
FAILED_MARKER = "CLUSTERBOT-SNAPSHOT-FAILED "  # a job's only line on failure: the error's type
HANDOFF_PREFIX = ".clusterbot-snapshot-"  # result files: PREFIX + expiry (epoch s) + "-" + random + ".json"


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


def _logs_dir():
    """The session's logs dir, where the dashboard's log API reads: a job's stdout is its driver log
    there (`job-driver-<id>.log`, Ray's JobLogStorageClient), so this process's fd 1 points into it."""
    target = os.readlink("/proc/self/fd/1")
    if not os.path.basename(target).startswith("job-driver-"):
        raise RuntimeError("not run as a Ray job: stdout is not a job driver log")
    return os.path.dirname(target)


def _sweep(logs_dir, now):
    """Delete result files whose deadline passed (a job killed with SIGKILL could not delete its own)."""
    for name in os.listdir(logs_dir):
        if name.startswith(HANDOFF_PREFIX):
            try:
                expired = int(name[len(HANDOFF_PREFIX) :].split("-")[0]) < now
            except ValueError:
                continue
            if expired:
                try:
                    os.unlink(os.path.join(logs_dir, name))
                except OSError:
                    pass


def _stop(signum, frame):
    raise SystemExit(0)


def hand_off(address, max_package_bytes, hold_s):
    """As a job: the snapshot into a 0600 file for the dashboard's log API, its name on stdout, kept
    until the job is stopped or `hold_s` passed, then deleted. Nothing else is printed."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    path = None
    try:
        logs_dir = _logs_dir()
        now = time.time()
        _sweep(logs_dir, now)
        name = f"{HANDOFF_PREFIX}{int(now + hold_s) + 1}-{secrets.token_hex(16)}.json"
        path = os.path.join(logs_dir, name)
        data = json.dumps(snapshot(address, max_package_bytes)).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        print(HANDOFF_MARKER + name, flush=True)
        time.sleep(hold_s)
    except SystemExit:
        raise
    except BaseException as e:
        # the type only: a message could quote what was read (this line stays in the driver log)
        print(FAILED_MARKER + type(e).__name__, flush=True)
        raise SystemExit(1) from None
    finally:
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass


if __name__ == "__main__":
    # argv: [ADDRESS or "-" for the job's own cluster (RAY_ADDRESS), MAX_PACKAGE_BYTES or "-",
    #        HOLD_S: hand the result off as a job (see hand_off) instead of printing it]
    args = sys.argv[1:] + ["-", "-", "-"]
    address = os.environ["RAY_ADDRESS"] if args[0] == "-" else args[0]
    limit = None if args[1] == "-" else int(args[1])
    if args[2] == "-":
        print(MARKER + json.dumps(snapshot(address, limit)), flush=True)
    else:
        hand_off(address, limit, float(args[2]))
