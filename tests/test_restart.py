"""Restart on a real local Ray cluster: no job lost, none run twice, resumable after a crash anywhere."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ops.context import Context
from ops.jobs import active_jobs
from ops.locks import current_lock
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.store import open_store
from tests.localray import Env, wait_for

SECRET = "s3cr3t-value-never-shown"


def stage_jobs(cluster: Cluster, tmp_path: Path) -> dict[str, str]:
    """alice's job (owner in metadata), bob's (ray-run-bob-... id), an unknown owner's (raysubmit_*),
    and carol's pending job that waits for a TPU slice no node type offers."""
    api = RayApi(cluster)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import time\nprint('training', flush=True)\ntime.sleep(900)\n")
    ids = {
        "alice": api.submit(
            entrypoint="python train.py",
            metadata={"user": "alice"},
            runtime_env={"working_dir": str(work), "env_vars": {"WANDB_API_KEY": SECRET}},
        ),
        "bob": api.submit(entrypoint="sleep 900", submission_id="ray-run-bob-eval-20261122"),
        "unknown": api.submit(entrypoint="sleep 901"),
        "carol": api.submit(
            entrypoint="sleep 902",
            metadata={"user": "carol"},
            entrypoint_num_cpus=0.5,
            entrypoint_resources={"TPU-v5p-8-head": 1},
        ),
    }
    wait_for(lambda: api.status(ids["alice"]) == "RUNNING", 60, "alice's job to run")
    return ids


def resubmissions(cluster: Cluster) -> Counter[str]:
    """How many jobs name each old submission id as the one they replace."""
    return Counter(
        (d.metadata or {}).get("clusterbot_resubmitted_from")
        for d in RayApi(cluster).list_jobs()
        if (d.metadata or {}).get("clusterbot_resubmitted_from")
    )


def check_survived(cluster: Cluster, ids: dict[str, str]) -> None:
    api = RayApi(cluster)
    jobs = {j.submission_id: j for j in active_jobs(api)}
    by_old = {}
    for d in api.list_jobs():
        old = (d.metadata or {}).get("clusterbot_resubmitted_from")
        if old and d.submission_id in jobs:
            by_old[old] = jobs[d.submission_id]
    assert set(by_old) == set(ids.values()), f"not every job came back: {sorted(by_old)}"
    counts = resubmissions(cluster)
    assert all(counts[i] == 1 for i in ids.values()), f"a job was resubmitted more than once: {counts}"
    assert by_old[ids["alice"]].owner == "alice"
    assert by_old[ids["bob"]].owner == "bob"
    assert by_old[ids["carol"]].owner == "carol"
    assert by_old[ids["unknown"]].owner is None
    assert by_old[ids["alice"]].entrypoint == "python train.py"
    assert by_old[ids["unknown"]].entrypoint == "sleep 901"
    # The working_dir package came back with the job: it runs on the new cluster.
    wait_for(lambda: api.status(by_old[ids["alice"]].submission_id) == "RUNNING", 60, "alice's job to run")
    # The pending job kept its entrypoint resources, so it is still waiting, not running.
    infos = api.snapshot()["infos"]
    new_carol = by_old[ids["carol"]].submission_id
    assert infos[new_carol]["entrypoint_resources"] == {"TPU-v5p-8-head": 1}
    assert infos[new_carol]["entrypoint_num_cpus"] == 0.5
    assert api.status(new_carol) == "PENDING"


def test_jobs_of_every_owner_kind_survive_a_restart(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    ids = stage_jobs(cluster, tmp_path)

    r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes", "--json")

    assert r.code == 0, r
    result = r.json()
    assert result["step"] == "done"
    assert sorted(x["old_id"] for x in result["resubmitted"]) == sorted(ids.values())
    assert all(x["status"] == "submitted" for x in result["resubmitted"])
    assert SECRET not in r.out + r.err
    check_survived(cluster, ids)
    assert current_lock(open_store(), "local") is None


FAULTS = ["after:backed_up", "after:jobs_stopped", "after:cluster_stopped", "after:cluster_started",
          "resubmit:2"]  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_a_restart_killed_at_any_step_is_resumed(
    ops_env: Env, cluster: Cluster, tmp_path: Path, fault: str
) -> None:
    ids = stage_jobs(cluster, tmp_path)

    killed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                         extra_env={"CLUSTERBOT_FAULT": fault})  # fmt: skip
    assert killed.code == -9, killed

    # While the dead restart holds the cluster, another restart is refused and says what to do.
    again = ops_env.ops("restart", "--cluster", "local", "--as", "bob", "--yes")
    assert again.code == 3, again
    assert "locked by restart" in again.err and "alice" in again.err
    status = ops_env.ops("status", "--cluster", "local", "--json")
    assert status.code == 0 and "restart" in status.json()["operation"]

    # A resume waits for the dead process's lease to expire before taking over.
    wait_for(lambda: current_lock(open_store(), "local").expired(), 15, "the dead restart's lease to expire")
    resumed = ops_env.ops("restart", "--cluster", "local", "--as", "bob", "--resume", "--json")

    assert resumed.code == 0, resumed
    assert resumed.json()["step"] == "done"
    check_survived(cluster, ids)
    assert current_lock(open_store(), "local") is None


def test_a_resume_is_refused_while_the_restart_is_alive(ops_env: Env, cluster: Cluster) -> None:
    from ops.restart import Settings, start_restart

    run = start_restart(Context(open_store()), cluster, "alice", True, Settings(lease_s=60))
    try:
        r = ops_env.ops("restart", "--cluster", "local", "--as", "bob", "--resume")
        assert r.code == 3, r
        assert "still alive" in r.err
    finally:
        run.lease.release()


def test_abandon_keeps_the_backups_and_frees_the_cluster(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    ids = stage_jobs(cluster, tmp_path)
    killed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                         extra_env={"CLUSTERBOT_FAULT": "after:cluster_stopped"})  # fmt: skip
    assert killed.code == -9, killed
    wait_for(lambda: current_lock(open_store(), "local").expired(), 15, "the lease to expire")

    r = ops_env.ops("restart", "--cluster", "local", "--as", "bob", "--abandon", "--json")

    assert r.code == 0, r
    done = r.json()
    assert sorted(done["not_resubmitted"]) == sorted(ids.values())
    store = open_store()
    assert current_lock(store, "local") is None
    scope = f"operations/local/{done['op_id']}"
    kept = {Path(k).stem for k in store.list(f"{scope}/jobs/")}
    assert kept == set(ids.values())


def test_preserve_jobs_0_starts_with_a_clean_slate(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    ids = stage_jobs(cluster, tmp_path)

    r = ops_env.ops(
        "restart", "--cluster", "local", "--as", "alice", "--yes", "--preserve-jobs", "0", "--json"
    )

    assert r.code == 0, r
    assert r.json()["resubmitted"] == []
    assert active_jobs(RayApi(cluster)) == []
    assert not resubmissions(cluster).keys() & set(ids.values())


def test_others_jobs_need_yes_and_nothing_is_stopped(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    ids = stage_jobs(cluster, tmp_path)

    r = ops_env.ops("restart", "--cluster", "local", "--as", "alice")

    assert r.code == 3, r
    assert "other users" in r.err and "bob" in r.err and "--yes" in r.err
    assert {j.submission_id for j in active_jobs(RayApi(cluster))} == set(ids.values())
    assert current_lock(open_store(), "local") is None


def test_own_jobs_only_still_need_a_terminal_or_yes(ops_env: Env, cluster: Cluster) -> None:
    RayApi(cluster).submit(entrypoint="sleep 600", metadata={"user": "alice"})

    r = ops_env.ops("restart", "--cluster", "local", "--as", "alice")

    assert r.code == 3, r
    assert "--yes" in r.err
    assert len(active_jobs(RayApi(cluster))) == 1


def test_dry_run_shows_the_plan_and_changes_nothing(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    ids = stage_jobs(cluster, tmp_path)

    r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--dry-run")

    assert r.code == 0, r
    for sid in ids.values():
        assert sid in r.out
    assert "alice: 1" in r.out and "bob: 1" in r.out and "unknown: 1" in r.out
    assert "dry run" in r.out
    assert {j.submission_id for j in active_jobs(RayApi(cluster))} == set(ids.values())
    assert SECRET not in r.out + r.err


def test_a_failed_restart_can_be_resumed_at_once(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    ids = stage_jobs(cluster, tmp_path)

    failed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                         extra_env={"CLUSTERBOT_FAULT": "fail:after:cluster_stopped"})  # fmt: skip
    assert failed.code == 1, failed
    assert "injected failure at after:cluster_stopped" in failed.err
    held = current_lock(open_store(), "local")
    assert held is not None and held.expired()  # kept, but resumable without waiting for the lease

    resumed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--resume", "--json")

    assert resumed.code == 0, resumed
    check_survived(cluster, ids)


def test_a_restart_killed_with_its_journal_on_gcs_is_resumed(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """The same durability with `CLUSTERBOT_STORE=gs://...` (fake-gcs-server): the backup, the lock and
    the journal live in the bucket, so a resume from another process finds everything there."""

    from ops.store import GcsStore
    from tests.gcs_emulator import GcsEmulator

    with GcsEmulator() as gcs:
        bucket = gcs.create_bucket("clusterbot-state")
        env = {"CLUSTERBOT_STORE": f"gs://{bucket}/prod", "STORAGE_EMULATOR_HOST": gcs.url}
        ids = stage_jobs(cluster, tmp_path)
        killed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                             extra_env=env | {"CLUSTERBOT_FAULT": "after:cluster_stopped"})  # fmt: skip
        assert killed.code == -9, killed
        store = GcsStore(f"gs://{bucket}/prod", client=gcs.client())
        wait_for(lambda: current_lock(store, "local").expired(), 15, "the lease to expire")
        backups = [k for k in store.list("operations/local/") if "/jobs/" in k]
        assert len(backups) == len(ids)

        resumed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--resume", extra_env=env)

        assert resumed.code == 0, resumed
        check_survived(cluster, ids)
        assert current_lock(store, "local") is None


def test_a_cluster_whose_gcs_is_out_of_reach_is_read_through_a_job(cluster: Cluster, tmp_path: Path) -> None:
    """For the GCP clusters only the dashboard is reachable: the snapshot then runs as a job on the
    cluster itself and must bring back what reading the GCS port brings (resources, packages)."""
    ids = stage_jobs(cluster, tmp_path)
    api = RayApi(cluster)

    direct = api.snapshot(via_job=False)
    remote = api.snapshot(via_job=True)

    assert direct is not None and remote is not None
    for sid in ids.values():
        for field in ("entrypoint", "entrypoint_num_cpus", "entrypoint_resources", "metadata"):
            assert remote["infos"][sid].get(field) == direct["infos"][sid].get(field), (sid, field)
    assert remote["infos"][ids["carol"]]["entrypoint_resources"] == {"TPU-v5p-8-head": 1}
    assert remote["packages"] == direct["packages"] and len(remote["packages"]) == 1
    assert all(data for data in remote["packages"].values())
    # the snapshot job cleans up after itself and never shows as a job
    assert {j.submission_id for j in active_jobs(api)} == set(ids.values())
