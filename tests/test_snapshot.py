"""The snapshot job (clusters whose GCS this machine cannot reach) on the session's real local cluster:
it brings back every job's JobInfo and working_dir package, and leaves no secret on the head, neither
in its driver log nor in a result file, whether we read its result, stop it first, or vanish."""

from __future__ import annotations

import base64
import io
import time
import uuid
import zipfile
from pathlib import Path

from ops import gcs_reader, gcs_snapshot
from ops.drivers.local import LocalDriver
from ops.ray_api import RayApi
from ops.registry import Cluster
from tests.localray import wait_for

# Ray's own runtime-env agent logs every job's runtime_env, env vars included: Ray's, out of scope
# (issue 6). The only file left out; everything else under the session's logs must not hold the canary.
RAYS_OWN = {"runtime_env_agent.log"}


def logs_dir(cluster: Cluster) -> Path:
    return LocalDriver(cluster).temp_dir / "session_latest" / "logs"


def handoff_files(cluster: Cluster) -> list[Path]:
    return sorted(logs_dir(cluster).glob(gcs_snapshot.HANDOFF_PREFIX + "*"))


def files_holding(cluster: Cluster, secret: bytes) -> list[str]:
    """Names (relative to the logs dir) of the files under it that hold `secret`, Ray's own left out."""
    root = logs_dir(cluster)
    found = []
    for path in root.rglob("*"):
        if path.is_file() and path.name not in RAYS_OWN and secret in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


def submit_canary_job(cluster: Cluster, tmp_path: Path, canary: str) -> str:
    """alice's job: a secret in its env, a working_dir package, an entrypoint resource; RUNNING."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import time\ntime.sleep(3600)\n")
    api = RayApi(cluster)
    sid = api.submit(
        entrypoint="python train.py",
        runtime_env={"working_dir": str(work), "env_vars": {"WANDB_API_KEY": canary}},
        entrypoint_num_cpus=0.25,
        metadata={"user": "alice"},
    )
    wait_for(lambda: api.status(sid) == "RUNNING", 90, "alice's job to run")
    return sid


def test_the_snapshot_job_returns_jobinfo_and_packages_and_leaves_no_secret_on_the_head(
    cluster: Cluster, tmp_path: Path
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    sid = submit_canary_job(cluster, tmp_path, canary)
    api = RayApi(cluster)
    try:
        for attempt in (1, 2):  # twice in a row: nothing left behind stands in the way
            got = gcs_reader.read_via_job(api, timeout=90)

            info = got["infos"][sid]
            assert info["entrypoint_num_cpus"] == 0.25, attempt
            assert canary in info["runtime_env_json"], attempt  # the backup keeps it: it must resubmit
            uri = info["runtime_env_json"].split('"working_dir": "')[1].split('"')[0]
            package = zipfile.ZipFile(io.BytesIO(base64.b64decode(got["packages"][uri])))
            assert "train.py" in package.namelist(), attempt
            assert handoff_files(cluster) == [], attempt

        drivers = list(logs_dir(cluster).glob(f"job-driver-{gcs_reader.SNAPSHOT_PREFIX}*.log"))
        assert len(drivers) >= 2, "the snapshot jobs' driver logs are where they were looked for"
        assert files_holding(cluster, canary.encode()) == []
    finally:
        api.stop(sid)


def test_a_snapshot_job_stopped_before_its_result_is_read_deletes_it(cluster: Cluster) -> None:
    api = RayApi(cluster)
    sid = gcs_reader.submit_snapshot_job(api, hold_s=120)
    node_id, name = gcs_reader.wait_for_handoff(api, sid, timeout=60)
    result = logs_dir(cluster) / name
    assert result.exists() and result.stat().st_mode & 0o777 == 0o600
    assert node_id

    api.stop(sid)

    wait_for(lambda: not result.exists(), 15, "the stopped job to delete its result")
    wait_for(lambda: api.status(sid) == "STOPPED", 15, "the job to stop")


def test_a_snapshot_job_whose_reader_vanished_deletes_its_result_at_its_own_timeout(
    cluster: Cluster,
) -> None:
    api = RayApi(cluster)
    hold_s = 4.0
    sid = gcs_reader.submit_snapshot_job(api, hold_s=hold_s)
    _, name = gcs_reader.wait_for_handoff(api, sid, timeout=60)
    result = logs_dir(cluster) / name
    assert result.exists()
    t0 = time.monotonic()

    # the reader is gone: nobody reads, nobody stops the job

    wait_for(lambda: not result.exists(), hold_s + 10, "the job to delete its result at its timeout")
    assert time.monotonic() - t0 < hold_s + 10
    wait_for(lambda: api.status(sid) == "SUCCEEDED", 15, "the job to end on its own")
    assert handoff_files(cluster) == []
