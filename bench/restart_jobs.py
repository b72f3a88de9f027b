"""The restart benchmark's jobs, and what it checks about them after a restart.

The job mix is what a faithful restart must carry: every job has entrypoint resources (a share of a
CPU, and `node:__internal_head__`, which pins it to the head), and every other one runs from a
`working_dir` package (one per owner, `PACKAGE_KIB` of incompressible bytes plus the script), which
lives only in the cluster's GCS and is gone with the old head. The rest run the bare `sleep 3600`.

Also the dashboard-only view of a cluster (`dashboard_only`): the local cluster as a GCP cluster
looks from here, so the restart's backup takes its snapshot through a job on the cluster.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from ops.registry import Cluster

OWNERS = ("alice", "bob", "carol", "dave")
TAG = "bench_job"  # metadata key naming each benchmark job (j00, j01, ...)
ENTRYPOINT = "sleep 3600"
PACKAGED_ENTRYPOINT = "python job.py"
PACKAGE_KIB = 256
RESOURCES = {"entrypoint_num_cpus": 0.05, "entrypoint_resources": {"node:__internal_head__": 0.001}}
RESOURCE_FIELDS = ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources")


def make_workdirs(root: Path, package_kib: int = PACKAGE_KIB) -> dict[str, Path]:
    """One working_dir per owner: a script that sleeps, and `package_kib` of random bytes."""
    dirs = {}
    for owner in OWNERS:
        d = root / f"work-{owner}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.py").write_text(f"# {owner}'s training job\nimport time\ntime.sleep(3600)\n")
        (d / "weights.bin").write_bytes(os.urandom(package_kib * 1024))
        dirs[owner] = d
    return dirs


def job_spec(i: int, workdirs: dict[str, Path]) -> dict[str, Any]:
    """Job i: owner in metadata, or (every fifth) only in a `ray-run-<owner>-...` submission id;
    entrypoint resources always; every odd job runs from its owner's working_dir package."""
    owner, tag = OWNERS[i % len(OWNERS)], f"j{i:02d}"
    spec: dict[str, Any] = {"entrypoint": ENTRYPOINT, "metadata": {"user": owner, TAG: tag}, **RESOURCES}
    if i % 2 == 1:
        spec.update(entrypoint=PACKAGED_ENTRYPOINT, runtime_env={"working_dir": str(workdirs[owner])})
    if i % 5 == 4:
        spec.update(submission_id=f"ray-run-{owner}-bench-{tag}-{uuid.uuid4().hex[:6]}", metadata={TAG: tag})
    return spec


def has_resources(info: dict[str, Any] | None) -> bool:
    """Whether a JobInfo carries the benchmark jobs' entrypoint resources."""
    return info is not None and all(info.get(k) == v for k, v in RESOURCES.items())


def tag_of(d: Any) -> str | None:
    return (d.metadata or {}).get(TAG)


def _status(d: Any) -> str:
    return str(getattr(d.status, "value", d.status))


def outcome(
    cluster: Cluster, before: list[Any], infos_before: dict[str, Any], timeout: float
) -> dict[str, int]:
    """After a restart: wait (up to `timeout`) until every descendant of `before` has left PENDING,
    then count the descendants RUNNING ("running"), those also with the original's entrypoint
    resources ("faithful"), and the originals found by clusterbot's link or the benchmark's tag."""
    from ops.jobs import owner_of
    from ops.ray_api import RayApi

    api = RayApi(cluster)
    old_by_id = {d.submission_id: d for d in before}
    old_by_tag = {tag_of(d): d for d in before}

    def descendants() -> list[tuple[Any, Any]]:
        out = []
        for d in api.list_jobs():
            meta = d.metadata or {}
            old = old_by_id.get(meta.get("clusterbot_resubmitted_from")) or old_by_tag.get(meta.get(TAG))
            if old is not None:  # the old head's jobs are gone with its GCS: every job here is new
                out.append((old, d))
        return out

    deadline = time.monotonic() + timeout
    pairs = descendants()
    while any(_status(d) == "PENDING" for _, d in pairs) and time.monotonic() < deadline:
        time.sleep(1.0)
        pairs = descendants()
    infos = job_infos(cluster)
    running = {old.submission_id: d for old, d in pairs if _status(d) == "RUNNING"}
    faithful = sum(
        old_id in infos_before
        and d.submission_id in infos
        and all(infos[d.submission_id].get(f) == infos_before[old_id].get(f) for f in RESOURCE_FIELDS)
        for old_id, d in running.items()
    )
    owner_kept = sum(
        owner_of(old_id, old_by_id[old_id].metadata)[0] == owner_of(d.submission_id, d.metadata)[0]
        for old_id, d in running.items()
    )
    return {"running": len(running), "faithful": faithful, "owner_kept": owner_kept}


def job_infos(cluster: Cluster, tries: int = 3) -> dict[str, Any]:
    """Every job's JobInfo, from the GCS port (the benchmark's process has adopted the cluster's auth)."""
    from ops.ray_api import RayApi

    for _ in range(tries):
        snap = RayApi(cluster).snapshot(via_job=False)
        if snap is not None and snap.get("infos") is not None:
            return snap["infos"]
        time.sleep(1.0)
    raise RuntimeError(f"the {cluster.name} GCS could not be read {tries} times in a row")


def dashboard_only(cluster: Cluster) -> Cluster:
    """The same cluster, seen as if its GCS port were out of this machine's reach (a GCP cluster)."""

    class DashboardOnly(type(cluster)):
        @property
        def gcs_address(self) -> str | None:
            return None

    return DashboardOnly.model_validate(cluster.model_dump())
