"""The ops CLI as a user runs it: output, JSON, exit codes, bad input and refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ops import journal
from ops.context import Context
from ops.locks import acquire, current_lock
from ops.registry import REPO_ROOT, Cluster, load_registry
from ops.restart import Settings, Step, find_record, start_restart
from ops.store import LocalStore, Store, open_store
from tests.localray import Env, wait_for


def run_ops(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERBOT_")} | env
    return subprocess.run([sys.executable, "-m", "ops", *args], capture_output=True, text=True, env=full,
                          stdin=subprocess.DEVNULL, timeout=120, cwd=REPO_ROOT)  # fmt: skip


def test_unknown_cluster_is_one_line_naming_the_valid_ones(ops_env: Env) -> None:
    r = ops_env.ops("jobs", "--cluster", "us-central3")
    assert r.code == 2
    assert r.err.strip().count("\n") == 0
    assert "unknown cluster 'us-central3'" in r.err and "us-central2" in r.err and "big-run" in r.err


def test_bad_flag_is_one_line_and_exit_2(ops_env: Env) -> None:
    r = ops_env.ops("restart", "--cluster", "local", "--preserve-jobs", "maybe")
    assert r.code == 2
    assert r.err.strip().count("\n") == 0
    assert "invalid choice" in r.err and "'1'" in r.err and "'0'" in r.err
    r = ops_env.ops("frobnicate")
    assert r.code == 2 and "invalid choice" in r.err and "restart" in r.err


def test_json_errors_are_one_document(ops_env: Env) -> None:
    r = ops_env.ops("jobs", "--cluster", "nope", "--json")
    assert r.code == 2
    assert json.loads(r.out)["exit_code"] == 2


def test_clusters_lists_the_registry(ops_env: Env) -> None:
    r = ops_env.ops("clusters", "--json")
    assert r.code == 0
    rows = {c["name"]: c for c in r.json()["clusters"]}
    assert set(rows) == {"us-central2", "us-west4", "eu-west4", "us-east5", "us-east1", "us-central1",
                         "big-run", "local"}  # fmt: skip
    assert rows["big-run"]["protected"] and rows["eu-west4"]["zone"].startswith("europe-west4")
    text = ops_env.ops("clusters")
    assert "marin-us-central2" in text.out and "protected" in text.out


def test_protected_cluster_refuses_without_override(ops_env: Env) -> None:
    r = ops_env.ops("restart", "--cluster", "big-run", "--yes")
    assert r.code == 3 and "protected" in r.err and "--override-protected" in r.err
    # With the override the protection no longer refuses; what stops it then is the head, which this
    # machine cannot reach (the look before acting needs it).
    r = ops_env.ops("restart", "--cluster", "big-run", "--override-protected", "--dry-run",
                    extra_env={"CLUSTERBOT_REACH_DEADLINE_S": "1"})  # fmt: skip
    assert r.code != 0 and "protected" not in r.err, r


def test_submit_jobs_and_status_show_owners_and_hide_secrets(ops_env: Env, cluster: Cluster) -> None:
    r = ops_env.ops("submit", "--cluster", "local", "--as", "dora", "--", "sleep", "600")
    assert r.code == 0, r
    sid = r.out.split()[1]
    from ops.ray_api import RayApi

    RayApi(cluster).submit(entrypoint="sleep 601", metadata={"user": "erin"},
                           runtime_env={"env_vars": {"HF_TOKEN": "hf_do_not_show"}})  # fmt: skip

    jobs = ops_env.ops("jobs", "--cluster", "local", "--json")
    assert jobs.code == 0
    by_owner = {j["owner"]: j for j in jobs.json()["jobs"]}
    assert by_owner["dora"]["submission_id"] == sid
    assert by_owner["erin"]["runtime_env"]["env_vars"] == {"HF_TOKEN": "<redacted>"}
    assert "hf_do_not_show" not in jobs.out
    text = ops_env.ops("jobs", "--cluster", "local")
    assert "dora" in text.out and "sleep 600" in text.out and "hf_do_not_show" not in text.out

    status = ops_env.ops("status", "--cluster", "local", "--json")
    assert status.code == 0, status
    s = status.json()
    assert s["head_up"] is True
    assert s["jobs_by_owner"]["dora"] == 1 and s["jobs_by_owner"]["erin"] == 1
    assert s["operation"] is None
    assert "hf_do_not_show" not in status.out


def test_status_shows_an_operation_in_progress(ops_env: Env, cluster: Cluster) -> None:
    run = start_restart(Context(open_store()), cluster, "frank", True, Settings(lease_s=60))
    try:
        r = ops_env.ops("status", "--cluster", "local")
        assert r.code == 0
        assert f"restart {run.record.op_id} by frank" in r.out
    finally:
        run.lease.release()


def test_local_up_is_idempotent(ops_env: Env, cluster: Cluster) -> None:
    r = ops_env.ops("local", "up")
    assert r.code == 0 and "already up" in r.out
    r = ops_env.ops("local", "status", "--json")
    assert r.json()["up"] is True
    r = ops_env.ops("local", "up", "--cluster", "us-central2")
    assert r.code == 2 and "not a local cluster" in r.err


def test_update_configs_check_fails_on_drift_and_regenerating_fixes_it(tmp_path: Path) -> None:
    infra = tmp_path / "infra"
    shutil.copytree(REPO_ROOT / "infra", infra)
    env = {"CLUSTERBOT_REGISTRY": str(infra / "clusters.yaml"), "CLUSTERBOT_HOME": str(tmp_path)}
    assert run_ops("update-configs", "--check", env=env).returncode == 0

    edited = infra / "us-east5.yaml"
    edited.write_text(edited.read_text().replace("max_workers: 1024", "max_workers: 12", 1))
    before = edited.read_text()
    r = run_ops("update-configs", "--check", env=env)
    assert r.returncode == 1, r
    assert "us-east5.yaml" in r.stdout and "max_workers: 12" in r.stdout
    assert edited.read_text() == before  # --check writes nothing

    assert run_ops("update-configs", env=env).returncode == 0
    assert run_ops("update-configs", "--check", env=env).returncode == 0


# -- locks a person can always clear -----------------------------------------------------------------
def lock_bytes(store: Store, cluster: str) -> bytes:
    got = store.read(f"locks/{cluster}.json")
    assert got is not None
    return got.data


OwnStore = tuple[LocalStore, dict[str, str]]


@pytest.fixture
def own_store(tmp_path: Path) -> OwnStore:
    """A store of this test's own (the session's is shared with the local cluster's tests)."""
    store = LocalStore(tmp_path / "store")
    return store, {"CLUSTERBOT_STORE": str(store.root)}


@pytest.mark.parametrize("phase", ["announced", "executing"])
def test_a_lock_without_record_is_cleared_by_unlock_and_nothing_else_changes_it(
    ops_env: Env, own_store: OwnStore, phase: str
) -> None:
    """The chat exited while waiting for consent (announced), or a restart was killed between its lock
    and its record (executing): --resume and --abandon refuse and change nothing; unlock clears it."""
    store, env = own_store
    acquire(store, "us-east1", "op-1", "restart", "alice", lease_s=0.05, phase=phase)  # type: ignore[arg-type]
    wait_for(lambda: current_lock(store, "us-east1").expired(), 5, "the lease to end")
    before = lock_bytes(store, "us-east1")

    for action in ("--resume", "--abandon"):
        r = ops_env.ops("restart", "--cluster", "us-east1", action, extra_env=env)
        assert r.code == 3, r
        assert "no operation record" in r.err and "unlock --cluster us-east1 --op op-1 --yes" in r.err
        assert ("waiting for consent" in r.err) == (phase == "announced")
        assert lock_bytes(store, "us-east1") == before, f"{action} changed the lock"

    r = ops_env.ops("unlock", "--cluster", "us-east1", "--op", "op-2", "--yes", extra_env=env)
    assert r.code == 3 and "op-2 does not hold the lock" in r.err and "--op op-1" in r.err, r
    r = ops_env.ops("unlock", "--cluster", "us-east1", "--op", "op-1", extra_env=env)  # no terminal, no --yes
    assert r.code == 3 and "not a terminal" in r.err and "--yes" in r.err, r
    assert lock_bytes(store, "us-east1") == before

    r = ops_env.ops(
        "unlock", "--cluster", "us-east1", "--op", "op-1", "--yes", "--as", "carol", extra_env=env
    )
    assert r.code == 0, r
    assert "unlocked us-east1" in r.out and "op-1 by alice" in r.out
    assert current_lock(store, "us-east1") is None
    entries = journal.read(store, "operations/us-east1/op-1")
    assert [(e["event"], e["by"], e["phase"]) for e in entries] == [("unlocked", "carol", phase)]
    r = ops_env.ops("unlock", "--cluster", "us-east1", "--op", "op-1", "--yes", extra_env=env)
    assert r.code == 3 and "not locked" in r.err


def test_unlock_of_a_stalled_restart_keeps_its_record_and_says_where_the_backups_are(
    ops_env: Env, own_store: OwnStore
) -> None:
    store, env = own_store
    run = start_restart(
        Context(store),
        load_registry(Path(os.environ["CLUSTERBOT_REGISTRY"])).get("us-east1"),
        "alice",
        True,
        Settings(lease_s=30),
    )
    run.lease.expire()
    r = ops_env.ops("unlock", "--cluster", "us-east1", "--op", run.record.op_id, "--yes", "--json",
                    extra_env=env)  # fmt: skip
    assert r.code == 0, r
    assert r.json()["record_step"] == "planned" and "its process stopped" in r.json()["was"]
    assert current_lock(store, "us-east1") is None
    assert store.read(f"{run.record.scope}/record.json") is not None


def test_status_shows_the_phase_of_the_lock(ops_env: Env, own_store: OwnStore) -> None:
    store, env = own_store
    lease = acquire(store, "us-east1", "op-1", "restart", "alice", lease_s=30, phase="announced")
    r = ops_env.ops("status", "--cluster", "us-east1", extra_env=env)
    assert r.code == 0, r
    assert "restart op-1 by alice" in r.out and "waiting for consent in chat since" in r.out
    # Its head is not reached from here: what it runs is not known, never "0 jobs".
    assert "workers and jobs: not known" in r.out and "0 running" not in r.out
    lease.set_phase("executing")
    r = ops_env.ops("status", "--cluster", "us-east1", extra_env=env)
    assert "running on" in r.out and "waiting for consent" not in r.out
    lease.release()


def test_submit_keeps_the_quoting_of_its_words(ops_env: Env, cluster: Cluster) -> None:
    from ops.ray_api import RayApi

    r = ops_env.ops("submit", "--cluster", "local", "--as", "dora", "--", "sh", "-c", "echo a b")
    assert r.code == 0, r
    sid = r.out.split()[1]
    api = RayApi(cluster)
    wait_for(lambda: api.status(sid) in ("SUCCEEDED", "FAILED", "STOPPED"), 60, f"{sid} to end")
    assert api.status(sid) == "SUCCEEDED"
    assert api.jobs.get_job_info(sid).entrypoint == "sh -c 'echo a b'"
    # Joined unquoted (`sh -c echo a b`), the shell would run `echo` alone and print an empty line.
    # The log may lag the job's end: wait (bounded) for the line.
    wait_for(lambda: "a b" in api.jobs.get_job_logs(sid).splitlines(), 30, "the job's output in its log")


def test_force_unbacked_reaches_the_restart_itself(ops_env: Env, cluster: Cluster) -> None:
    """A head that is up but does not answer: the restart refuses; an admin forces it, the plan and the
    record say the jobs were not backed up. The restart is killed right after that step (nothing is
    stopped) and the cluster is unlocked by hand."""
    port = cluster.local_ports.dashboard
    dashboard = next(psutil.Process(c.pid) for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid)  # fmt: skip
    fast = {"CLUSTERBOT_REACH_DEADLINE_S": "1"}
    dashboard.send_signal(signal.SIGSTOP)
    try:
        refused = ops_env.ops("restart", "--cluster", "local", "--dry-run", extra_env=fast)
        plan = ops_env.ops("restart", "--cluster", "local", "--force-unbacked", "--dry-run", extra_env=fast)
        r = ops_env.ops("restart", "--cluster", "local", "--force-unbacked", "--yes",
                        extra_env=fast | {"CLUSTERBOT_FAULT": "after:backed_up"})  # fmt: skip
    finally:
        dashboard.send_signal(signal.SIGCONT)
    assert refused.code == 3 and "did not answer" in refused.err and "--force-unbacked" in refused.err
    assert plan.code == 0 and "will NOT be backed up" in plan.out, plan
    assert r.code == -signal.SIGKILL, r  # the fault point, after the backup step
    store = open_store()
    held = current_lock(store, "local")
    record = find_record(store, "local", held.op_id)
    assert record is not None and record.step == Step.BACKED_UP
    assert record.force_unbacked and record.unbacked and record.jobs == []
    r = ops_env.ops("unlock", "--cluster", "local", "--op", held.op_id, "--yes")
    assert r.code == 0 and "stays at step backed_up" in r.out, r
