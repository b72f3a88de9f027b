"""A restart never stops what it did not back up: a refused token, a stalled dashboard, a GCP head this
machine cannot reach. And "done" means the jobs run: a head that dies after the resubmission, or a
resubmission that fails, leaves the restart unfinished for `--resume`."""

from __future__ import annotations

import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from ops import journal
from ops.context import Context
from ops.drivers.gcp import GcpDriver, RunResult
from ops.drivers.tunnel import NO_PROXY
from ops.errors import OpsError, Refused
from ops.jobs import BackedUpJob, active_jobs, resubmitted_id
from ops.locks import current_lock
from ops.ray_api import RayApi
from ops.registry import DEFAULT_REGISTRY, Cluster, SshKeySource, load_registry
from ops.restart import (
    RestartRun,
    Settings,
    Step,
    _record_key,
    find_record,
    load_record,
    plan_restart,
    resume_restart,
    start_restart,
)
from ops.sim.server import SimServer
from ops.store import LocalStore, Store, dump, open_store
from tests.localray import Env, cont, dashboard_process, wait_for
from tests.test_restart import check_survived, stage_jobs


def _active(cluster: Cluster) -> set[str]:
    return {j.submission_id for j in active_jobs(RayApi(cluster))}


def test_a_refused_token_is_bad_input_and_stops_nothing(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """The cluster pinned to a token version its head does not run with: the dashboard refuses it."""
    from ops.tokens import ensure_pin, write_pin

    ids = stage_jobs(cluster, tmp_path)
    ctx = Context()
    try:
        version = ensure_pin(ctx, cluster).version
        wrong = ctx.secrets(cluster).add_version(cluster.token_secret, "not-the-heads-token").version
        write_pin(ctx.store, cluster, wrong, "test")
        try:
            r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes")
        finally:
            write_pin(ctx.store, cluster, version, "test")
            ctx.secrets(cluster).disable(cluster.token_secret, wrong)
    finally:
        ctx.close()

    assert r.code == 2, r
    assert "refused our token" in r.err and "Secret Manager" in r.err and "not-the-heads" not in r.err
    assert len(r.err.strip().splitlines()) <= 2, r.err  # one line (plus nothing else)
    assert _active(cluster) == set(ids.values())
    assert current_lock(open_store(), "local") is None


def test_a_dashboard_stalled_past_the_deadline_refuses_and_stops_nothing(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    ids = stage_jobs(cluster, tmp_path)
    proc = dashboard_process(cluster)
    proc.send_signal(signal.SIGSTOP)
    try:
        r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                        extra_env={"CLUSTERBOT_REACH_DEADLINE_S": "3"})  # fmt: skip
    finally:
        cont(proc)

    assert r.code == 3, r
    assert "did not answer" in r.err and "is running" in r.err and "--force-unbacked" in r.err
    wait_for(lambda: RayApi(cluster).reachable(), 30, "the dashboard to answer again")
    assert _active(cluster) == set(ids.values())
    assert current_lock(open_store(), "local") is None


def test_a_dashboard_stalled_for_a_while_is_waited_for_and_every_job_kept(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    ids = stage_jobs(cluster, tmp_path)
    proc = dashboard_process(cluster)
    proc.send_signal(signal.SIGSTOP)
    timer = threading.Timer(8.0, lambda: cont(proc))
    timer.start()
    try:
        r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes", "--json",
                        extra_env={"CLUSTERBOT_REACH_DEADLINE_S": "60"})  # fmt: skip
    finally:
        timer.cancel()
        cont(proc)

    assert r.code == 0, r
    check_survived(cluster, ids)


def test_a_dashboard_that_stalls_after_the_backup_stops_no_job(ops_env: Env, cluster: Cluster,
                                                               tmp_path: Path) -> None:  # fmt: skip
    """The same rule at the next step: the jobs submitted since the backup cannot be read, so the
    jobs are not stopped; the restart is left resumable and a resume keeps every job."""
    ids = stage_jobs(cluster, tmp_path)
    store = open_store()
    proc = dashboard_process(cluster)

    def progress(line: str) -> None:
        if line.startswith("backed up"):
            proc.send_signal(signal.SIGSTOP)

    run = start_restart(Context(store), cluster, "alice", True, Settings(reach_deadline_s=3), progress)
    try:
        with pytest.raises(Refused, match="did not answer"):
            run.run()
    finally:
        cont(proc)

    record = find_record(store, "local", run.record.op_id)
    assert record is not None and record.step == Step.BACKED_UP
    wait_for(lambda: RayApi(cluster).reachable(), 30, "the dashboard to answer again")
    assert _active(cluster) == set(ids.values())
    resumed = resume_restart(Context(store), cluster, "alice", Settings()).run()
    assert resumed.step == Step.DONE
    check_survived(cluster, ids)


def test_an_admin_may_force_a_restart_without_backup(
    ops_env: Env, cluster: Cluster, tmp_path: Path, stalled: psutil.Process
) -> None:
    store = open_store()
    settings = Settings(reach_deadline_s=2)
    plan = plan_restart(Context(store), cluster, "admin", True, force_unbacked=True, settings=settings)
    assert plan.unbacked and plan.jobs == []

    def progress(line: str) -> None:
        if "WITHOUT a backup" in line:
            cont(stalled)  # the backup step went on without: later steps find the head again

    run = start_restart(Context(store), cluster, "admin", True, settings, progress, force_unbacked=True)
    result = run.run()

    assert result.step == Step.DONE and result.unbacked
    assert any("NOT backed up" in n for n in result.not_preserved)


# -- GCP: a head this machine cannot reach ------------------------------------------------------------
class FakeRay:
    """The `ray` CLI of a GCP cluster, as seen through the driver's runner: records every command."""

    def __init__(self, head_ip: str | None) -> None:
        self.head_ip = head_ip
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, cwd: Path) -> RunResult:
        verb = argv[1]
        self.calls.append(verb)
        if verb == "get-head-ip":
            if self.head_ip is None:
                return RunResult(1, "Head node of cluster (marin-us-central2) not found!\n")
            return RunResult(0, f"{self.head_ip}\n")
        return RunResult(0, f"ray {verb} done\n")


def _unused_port() -> int:
    """A port nothing listens on (free a moment ago; nothing here binds it after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gcp_cluster() -> Cluster:
    """us-central2 as the registry has it, reached at its head's internal address (no tunnel to
    open), where nothing answers."""
    cluster = load_registry(DEFAULT_REGISTRY).get("us-central2")
    url = f"http://127.0.0.1:{_unused_port()}"
    return cluster.model_copy(
        update={
            "dashboard_url": url,
            "token": None,
            "reach": "internal",
            "ssh_key": None,
        }
    )


def test_jobs_whose_resources_and_packages_cannot_be_read_are_not_stopped(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """alice's working_dir package and carol's TPU request live only in the cluster's GCS: when it
    cannot be read, the restart refuses before stopping anything, rather than back up jobs that would
    come back without their code or on the wrong resources."""
    ids = stage_jobs(cluster, tmp_path)
    r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                    extra_env={"CLUSTERBOT_FAULT": "fail:snapshot"})  # fmt: skip
    assert r.code == 3, r
    assert "could not be read from the local GCS" in r.err and "nothing was stopped" in r.err
    assert set(ids.values()) <= _active(cluster)
    assert current_lock(open_store(), "local") is None  # given back


def test_a_gcp_head_that_exists_but_does_not_answer_is_never_taken_down(
    gcp_cluster: Cluster, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    ray = FakeRay(head_ip="127.0.0.9")
    driver = GcpDriver(gcp_cluster, runner=ray)
    settings = Settings(reach_deadline_s=1)

    ctx = Context(store, driver_factory=lambda _: driver)
    with pytest.raises(Refused, match="is running"):
        plan_restart(ctx, gcp_cluster, "alice", True, settings=settings)
    run = start_restart(ctx, gcp_cluster, "alice", True, settings)
    with pytest.raises(Refused):
        run.run()

    assert "down" not in ray.calls and "up" not in ray.calls
    assert current_lock(store, gcp_cluster.name) is None  # nothing was touched: the cluster is free
    record = find_record(store, gcp_cluster.name, run.record.op_id)
    assert record.step == Step.ABANDONED and "did not answer" in record.error
    assert [e["event"] for e in journal.read(store, record.scope)][-1] == "refused"


def test_a_gcp_head_that_does_not_exist_has_nothing_to_back_up(gcp_cluster: Cluster, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    ray = FakeRay(head_ip=None)
    driver = GcpDriver(gcp_cluster, runner=ray)
    settings = Settings(reach_deadline_s=1, head_timeout_s=1)

    # Its Secret Manager is the simulator's: `ray up` gets the token's pinned version from there.
    with SimServer(secrets={gcp_cluster.project: {gcp_cluster.token_secret: "tok-v1"}}) as sim:
        ctx = Context(store, driver_factory=lambda _: driver, cloud_endpoint=lambda _: sim.address)
        plan = plan_restart(ctx, gcp_cluster, "alice", True, settings=settings)
        assert "not running" in " ".join(plan.notes) and not plan.unbacked
        run = start_restart(ctx, gcp_cluster, "alice", True, settings)
        with pytest.raises(OpsError, match="did not accept a job submission"):
            run.run()  # the fake `ray up` starts no dashboard: the wait for the new head fails
        ctx.close()

    assert ray.calls.index("down") < ray.calls.index("up")
    assert find_record(store, gcp_cluster.name, run.record.op_id).step == Step.CLUSTER_STOPPED


# -- done means the jobs run -------------------------------------------------------------------------
def _raylet(cluster: Cluster) -> psutil.Process:
    from ops.drivers.local import LocalDriver

    marker = str(LocalDriver(cluster).temp_dir)
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "raylet" and proc.environ().get("CLUSTERBOT_LOCAL_HEAD") == marker:
                return proc
        except psutil.Error:
            continue
    raise AssertionError("the local head's raylet was not found")


def test_a_job_status_the_dashboard_does_not_give_is_not_gone(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the dashboard's "no such job" (404) is gone; a dashboard that does not answer, stalled or
    down, says nothing of the job: the restart's settle must not call the job gone on it. And Ray's
    job client, which has no timeout of its own, gives up on a stalled dashboard."""
    api = RayApi(cluster)
    sid = api.submit(entrypoint="true")
    wait_for(lambda: api.status(sid) == "SUCCEEDED", 60, "the job to end")
    assert api.status("raysubmit_never_submitted") is None

    monkeypatch.setattr("ops.ray_api.JOB_CLIENT_TIMEOUT_S", 1.0)
    dashboard = dashboard_process(cluster)
    dashboard.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(OpsError, match="cannot reach"):
            api.status(sid, timeout=1)
        with pytest.raises(OpsError, match="cannot list jobs"):
            api.list_jobs()  # its client was made before the stall
        with pytest.raises(OpsError, match="cannot reach"):
            RayApi(cluster).jobs  # noqa: B018 - making a client asks the dashboard's version
    finally:
        cont(dashboard)
    down = RayApi(cluster, url=f"http://127.0.0.1:{_unused_port()}")
    with pytest.raises(OpsError, match="cannot reach"):
        down.status(sid)
    assert api.status(sid) == "SUCCEEDED"


class _Forwarder(ThreadingHTTPServer):
    """An HTTP hop in front of the real dashboard that answers 503 to paths starting with `failing`:
    a state API that errs (a 429, a 500, a timeout) while the rest of the dashboard answers."""

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.target, self.failing, self.refused = target.rstrip("/"), "", 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(BaseHTTPRequestHandler):
    server: _Forwarder

    def _forward(self) -> None:
        hop = self.server
        if hop.failing and self.path.startswith(hop.failing):
            hop.refused += 1
            self.send_error(503)
            return
        size = int(self.headers.get("Content-Length") or 0)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        req = urllib.request.Request(hop.target + self.path, data=self.rfile.read(size) if size else None,
                                     headers=headers, method=self.command)  # fmt: skip
        try:
            with NO_PROXY.open(req, timeout=60) as resp:
                code, body, kind = resp.status, resp.read(), resp.headers.get("Content-Type")
        except urllib.error.HTTPError as e:
            code, body, kind = e.code, e.read(), e.headers.get("Content-Type")
        except OSError:  # the head is down (being restarted): as the dashboard's absence looks
            self.send_error(502)
            return
        self.send_response(code)
        self.send_header("Content-Type", kind or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


class _OddDashboard(BaseHTTPRequestHandler):
    """200 to everything with the server's `body`: empty, or a page that is no job list (a proxy)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body: bytes = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("body", [b"", b'{"detail": "signed out"}'])
def test_a_job_list_that_is_not_one_is_not_no_jobs(gcp_cluster: Cluster, body: bytes) -> None:
    """A backup that read "no jobs" from it would stop everyone's jobs with nothing kept."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddDashboard)
    server.body = body  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = RayApi(gcp_cluster, url=f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(OpsError, match="job list is not one"):
            active_jobs(api)
    finally:
        server.shutdown()
        server.server_close()


def test_a_head_whose_nodes_cannot_be_read_for_a_while_is_not_taken_for_dead(
    ops_env: Env, cluster: Cluster
) -> None:
    """After the resubmission, Ray's state API errs for 8 s while the dashboard answers: the settle
    looks again (it is neither alive nor dead), then sees the head stay up. Read as dead, the restart
    would go back to starting the cluster, and on GCP its `ray up` stops the jobs just resubmitted."""
    api = RayApi(cluster)
    sid = api.submit(entrypoint="sleep 900", metadata={"user": "erin"})
    wait_for(lambda: api.status(sid) == "RUNNING", 60, "erin's job to run")
    hop = _Forwarder(cluster.dashboard_url)
    threading.Thread(target=hop.serve_forever, daemon=True).start()

    def progress(line: str) -> None:
        if line.startswith("resubmitted") and not hop.failing:
            hop.failing = "/api/v0/nodes"
            threading.Timer(8.0, lambda: setattr(hop, "failing", "")).start()

    try:
        seen = cluster.model_copy(update={"dashboard_url": hop.url})
        run = start_restart(Context(open_store()), seen, "erin", True, Settings(settle_s=3), progress)
        result = run.run()
    finally:
        hop.shutdown()
        hop.server_close()
    assert result.step == Step.DONE and hop.refused > 0
    (back,) = result.resubmitted
    assert api.status(back.new_id) == "RUNNING"
    assert "head_died" not in [e["event"] for e in journal.read(open_store(), run.record.scope)]


def test_a_head_that_dies_after_the_resubmission_is_not_done(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    ids = stage_jobs(cluster, tmp_path)
    store = open_store()
    killed = threading.Event()

    def progress(line: str) -> None:
        if line.startswith("resubmitted") and not killed.is_set():
            killed.set()  # the jobs are on the new head now: it goes down, as seen in CI
            threading.Timer(1.0, lambda: os.kill(_raylet(cluster).pid, signal.SIGKILL)).start()

    run = start_restart(Context(store), cluster, "alice", True, Settings(settle_s=20), progress)
    with pytest.raises(OpsError, match="went down after the jobs were resubmitted"):
        run.run()

    record = find_record(store, "local", run.record.op_id)
    assert record.step == Step.CLUSTER_STOPPED and record.resubmitted == {}
    resumed = resume_restart(Context(store), cluster, "alice", Settings()).run()
    assert resumed.step == Step.DONE
    check_survived(cluster, ids)


def test_a_resubmission_that_fails_keeps_the_restart_unfinished(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """alice's working_dir package is missing from the store when the jobs go back: her resubmission
    fails, the restart is not done and says how to retry; once the package is back, a resume
    resubmits hers (and only hers: the others went back already)."""
    ids = stage_jobs(cluster, tmp_path)
    store = open_store()
    killed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes",
                         extra_env={"CLUSTERBOT_FAULT": "after:cluster_started"})  # fmt: skip
    assert killed.code == -9, killed
    held = current_lock(store, "local")
    package = next(k for k in store.list(f"operations/local/{held.op_id}/packages/"))
    data = store.read(package).data
    os.unlink(Path(store.url) / package)
    wait_for(lambda: current_lock(store, "local").expired(), 15, "the lease to expire")

    failed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--resume")

    assert failed.code == 1, failed
    assert ids["alice"] in failed.err and "--resume" in failed.err
    record = find_record(store, "local", held.op_id)
    assert record.step == Step.CLUSTER_STARTED
    assert record.resubmitted[ids["alice"]].status == "failed"
    assert current_lock(store, "local").expired()  # kept, resumable at once

    store.put(package, data)
    resumed = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--resume", "--json")

    assert resumed.code == 0, resumed
    check_survived(cluster, ids)


def _a_restart_where_dans_job_fails(cluster: Cluster, tmp_path: Path) -> tuple[Store, str, RestartRun]:
    """dan's job needs an input file that is gone when it comes back on the new head: its resubmission
    exits 1, and the restart is left unfinished at CLUSTER_STARTED. The input is back afterwards."""
    flag = tmp_path / "input-ready"
    flag.write_text("")
    api = RayApi(cluster)
    sid = api.submit(entrypoint=f"sh -c 'sleep 2; test -f {flag} && sleep 900'", metadata={"user": "dan"})
    wait_for(lambda: api.status(sid) == "RUNNING", 60, "dan's job to run")
    store = open_store()

    def progress(line: str) -> None:
        if line.startswith("resubmitted"):
            flag.unlink()  # on the new head, dan's job finds its input gone and exits 1

    # settle_s: long enough to see dan's job fail even when it is slow to start (a loaded machine)
    run = start_restart(Context(store), cluster, "dan", True, Settings(settle_s=20), progress)
    with pytest.raises(OpsError, match="did not keep running"):
        run.run()
    flag.write_text("")
    return store, sid, run


def test_a_job_that_fails_on_the_new_head_is_resubmitted_again_on_resume(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    store, sid, run = _a_restart_where_dans_job_fails(cluster, tmp_path)
    record = find_record(store, "local", run.record.op_id)
    assert record.step == Step.CLUSTER_STARTED and record.resubmitted[sid].status == "failed"

    result = resume_restart(Context(store), cluster, "dan", Settings(settle_s=3)).run()

    assert result.step == Step.DONE
    (again,) = result.resubmitted
    assert again.attempt == 2 and again.new_id.endswith("-2")
    assert RayApi(cluster).status(again.new_id) == "RUNNING"


def test_a_resubmission_whose_answer_was_lost_is_not_made_again_on_resume(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """dan's second attempt went through but its answer was lost (the record says failed): the resume
    finds that attempt running and takes it, rather than a third copy of his job beside it."""
    store, sid, run = _a_restart_where_dans_job_fails(cluster, tmp_path)
    record, version = load_record(store, "local", run.record.op_id)
    # Attempt 2 as a resume submitted it, the answer lost on the way back: failed, says the record.
    backup = BackedUpJob.model_validate_json(store.read(f"{record.scope}/jobs/{sid}.json").data)
    second = resubmitted_id(sid, record.op_id, 2)
    RayApi(cluster).submit(**backup.submit_kwargs(second, record.op_id))
    lost = record.resubmitted[sid].model_copy(
        update={"new_id": second, "attempt": 2, "error": "connection reset by peer"}
    )
    store.replace(_record_key("local", record.op_id), dump(record.model_copy(
        update={"resubmitted": {sid: lost}})), version)  # fmt: skip

    result = resume_restart(Context(store), cluster, "dan", Settings(settle_s=3)).run()

    (taken,) = result.resubmitted
    assert result.step == Step.DONE and taken.new_id == second and taken.attempt == 2
    copies = [d.submission_id for d in RayApi(cluster).list_jobs()
              if (d.metadata or {}).get("clusterbot_resubmitted_from") == sid]  # fmt: skip
    assert sorted(copies) == sorted([resubmitted_id(sid, record.op_id, 1), second])  # no third
    assert RayApi(cluster).status(second) == "RUNNING"


def test_a_gcp_cluster_this_machine_cannot_reach_at_all_is_given_back(
    gcp_cluster: Cluster, tmp_path: Path
) -> None:
    """No SSH key for its tunnel: the restart fails in its first step, before anything is stopped, and
    leaves no lock behind (nothing to resume)."""
    store = LocalStore(tmp_path / "store")
    cluster = gcp_cluster.model_copy(
        update={"reach": "tunnel", "ssh_key": SshKeySource(file=str(tmp_path / "missing.pem"))}
    )
    ray = FakeRay(head_ip="127.0.0.9")
    run = start_restart(
        Context(store, driver_factory=lambda c: GcpDriver(c, runner=ray)), cluster, "alice", True
    )

    with pytest.raises(OpsError, match="no SSH key"):
        run.run()

    assert "down" not in ray.calls
    assert current_lock(store, cluster.name) is None
    assert find_record(store, cluster.name, run.record.op_id).step == Step.ABANDONED
