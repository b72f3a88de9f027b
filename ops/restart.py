"""Restart a cluster without losing a job: plan, back up, stop, start, resubmit; resumable at every step.

The restart is a sequence of steps, each recorded (by compare-and-set, under the cluster's lock) in
an operation record in the durable store before the next begins, and each journaled:

  planned -> backed_up -> jobs_stopped -> cluster_stopped -> cluster_started -> resubmitted -> done

Every step is idempotent, so a restart killed anywhere is continued by `resume` from the last
recorded step. Jobs are backed up (running and pending, with what the dashboard does not show)
before anything is stopped, and resubmitted under a deterministic new id, so a retried submission
is refused by Ray as a duplicate rather than run twice.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from ops import journal
from ops.drivers import Driver, driver_for
from ops.errors import OpsError, Refused
from ops.jobs import BackedUpJob, Job, active_jobs, owner_of, package_uris, resubmitted_id
from ops.locks import Lease, LockRecord, acquire, current_lock, take_over
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.store import Store, dump, read_model

Progress = Callable[[str], None]


class Step(StrEnum):
    PLANNED = "planned"
    BACKED_UP = "backed_up"
    JOBS_STOPPED = "jobs_stopped"
    CLUSTER_STOPPED = "cluster_stopped"
    CLUSTER_STARTED = "cluster_started"
    RESUBMITTED = "resubmitted"
    DONE = "done"
    ABANDONED = "abandoned"


ORDER = [Step.PLANNED, Step.BACKED_UP, Step.JOBS_STOPPED, Step.CLUSTER_STOPPED, Step.CLUSTER_STARTED,
         Step.RESUBMITTED, Step.DONE]  # fmt: skip


def _env_s(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


class Settings(BaseModel):
    """Timings of a restart; tests shorten them (fields, or the CLUSTERBOT_* variables)."""

    lease_s: float = Field(default_factory=lambda: _env_s("CLUSTERBOT_LEASE_S", 60))
    # How long a head that does not answer (timeouts, refused connections) is retried before the
    # restart refuses: unreachable is not dead.
    reach_deadline_s: float = Field(default_factory=lambda: _env_s("CLUSTERBOT_REACH_DEADLINE_S", 60))
    # "Done" only after the new head stayed up this long with every resubmitted job running.
    settle_s: float = Field(default_factory=lambda: _env_s("CLUSTERBOT_SETTLE_S", 30))
    stop_grace_s: float = 30.0  # how long jobs get to checkpoint after Ray's stop
    head_timeout_s: float | None = None  # None: by driver (local 120 s, GCP 20 min)


class Resubmission(BaseModel):
    old_id: str
    new_id: str
    owner: str | None
    status: str = "submitted"  # submitted | failed
    error: str | None = None


class RestartRecord(BaseModel):
    """The operation record: the source of truth a resume continues from."""

    op_id: str
    cluster: str
    requested_by: str
    preserve_jobs: bool
    created_at: datetime
    step: Step = Step.PLANNED
    jobs: list[str] = Field(default_factory=list)  # backed-up submission ids, in order
    resubmitted: dict[str, Resubmission] = Field(default_factory=dict)
    not_preserved: list[str] = Field(default_factory=list)
    durations: dict[str, float] = Field(default_factory=dict)
    resumed_by: list[str] = Field(default_factory=list)
    finished_at: datetime | None = None
    error: str | None = None

    @property
    def scope(self) -> str:
        return f"operations/{self.cluster}/{self.op_id}"


class RestartPlan(BaseModel):
    """What a restart would do, shown before anything happens (and all of `--dry-run`)."""

    cluster: str
    caller: str
    preserve_jobs: bool
    head_reachable: bool
    jobs: list[Job]
    owners: dict[str, int]  # owner label -> job count
    others_jobs: int  # jobs not the caller's (unknown owners included)
    notes: list[str] = Field(default_factory=list)

    @property
    def affected_owners(self) -> list[str]:
        return [o for o in self.owners if o != self.caller]


class RestartResult(BaseModel):
    op_id: str
    cluster: str
    step: Step
    preserve_jobs: bool
    resubmitted: list[Resubmission]
    not_preserved: list[str]
    durations: dict[str, float]
    total_s: float


def new_op_id(cluster: str) -> str:
    return f"{cluster}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _record_key(cluster: str, op_id: str) -> str:
    return f"operations/{cluster}/{op_id}/record.json"


def find_record(store: Store, cluster: str, op_id: str) -> RestartRecord | None:
    got = read_model(store, _record_key(cluster, op_id), RestartRecord)
    return None if got is None else got[0]


def load_record(store: Store, cluster: str, op_id: str) -> tuple[RestartRecord, str]:
    got = read_model(store, _record_key(cluster, op_id), RestartRecord)
    if got is None:
        raise OpsError(f"operation {op_id} has no record in the store {store.url}")
    return got


def check_protected(cluster: Cluster, override_protected: bool) -> None:
    if cluster.protected and not override_protected:
        raise Refused(
            f"{cluster.name} is protected: it is reserved and nobody else may restart it",
            "an admin may pass --override-protected",
        )


def check_unfinished(store: Store, cluster: Cluster) -> None:
    """Refuse to start while another operation (e.g. an unfinished restart) holds the cluster."""
    held = current_lock(store, cluster.name)
    if held is not None:
        raise Refused(f"{cluster.name} is locked by {held.describe()}", _resume_hint(cluster, held))


def _resume_hint(cluster: Cluster, held: LockRecord) -> str:
    if held.kind != "restart":
        return "wait for it to finish"
    if held.expired():
        return (
            f"its process stopped: `python -m ops restart --cluster {cluster.name} --resume` continues "
            f"it, `--abandon` gives it up"
        )
    return f"it is running on {held.host} (pid {held.pid}); wait for it"


def plan_restart(store: Store, cluster: Cluster, caller: str, preserve_jobs: bool) -> RestartPlan:
    """Look before acting: the jobs a restart would stop, whose they are, what can be kept."""
    check_unfinished(store, cluster)
    api = RayApi(cluster)
    notes = []
    reachable = api.reachable()
    jobs = active_jobs(api) if reachable else []
    if not reachable:
        notes.append("the head does not answer: no job can be listed or backed up")
    if not preserve_jobs and jobs:
        notes.append("--preserve-jobs 0: running and pending jobs are stopped and NOT resubmitted")
    owners = Counter(j.owner_label for j in jobs)
    others = sum(n for o, n in owners.items() if o != caller)
    return RestartPlan(
        cluster=cluster.name,
        caller=caller,
        preserve_jobs=preserve_jobs,
        head_reachable=reachable,
        jobs=jobs,
        owners=dict(owners),
        others_jobs=others,
        notes=notes,
    )


class RestartRun:
    """One restart operation in progress: owns the lease and the record, advances step by step."""

    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        lease: Lease,
        record: RestartRecord,
        version: str,
        settings: Settings,
        progress: Progress,
        driver: Driver | None = None,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.lease = lease
        self.record = record
        self._version = version
        self.settings = settings
        self.progress = progress
        self.driver = driver or driver_for(cluster)
        self.api = RayApi(cluster)

    # -- record keeping -------------------------------------------------------------------------
    def _save(self, **changes: Any) -> None:
        if self.lease.lost:
            raise Refused(
                f"lost the lock on {self.cluster.name}: another process resumed {self.record.op_id}"
            )
        record = self.record.model_copy(update=changes)
        self._version = self.store.replace(
            _record_key(self.cluster.name, record.op_id), dump(record), self._version
        )
        self.record = record

    def _advance(self, step: Step, started: float, **changes: Any) -> None:
        durations = dict(self.record.durations)
        durations[step.value] = durations.get(step.value, 0.0) + time.monotonic() - started
        self._save(step=step, durations=durations, **changes)
        journal.append(self.store, self.record.scope, step.value, by=self.lease.record.owner)
        _fault_point(f"after:{step.value}")

    # -- the steps --------------------------------------------------------------------------------
    def run(self) -> RestartResult:
        t0 = time.monotonic()
        self.lease.start_renewing()
        try:
            steps = {
                Step.PLANNED: self.backup,
                Step.BACKED_UP: self.stop_jobs,
                Step.JOBS_STOPPED: self.stop_cluster,
                Step.CLUSTER_STOPPED: self.start_cluster,
                Step.CLUSTER_STARTED: self.resubmit,
                Step.RESUBMITTED: self.finish,
            }
            while self.record.step in steps:
                steps[self.record.step]()
        except BaseException as e:
            self._fail(e)
            raise
        self.lease.release()
        r = self.record
        return RestartResult(
            op_id=r.op_id,
            cluster=r.cluster,
            step=r.step,
            preserve_jobs=r.preserve_jobs,
            resubmitted=list(r.resubmitted.values()),
            not_preserved=r.not_preserved,
            durations=r.durations,
            total_s=time.monotonic() - t0,
        )

    def _fail(self, e: BaseException) -> None:
        """Leave the operation resumable at once: the lock stays, its lease is ended now."""
        self.lease.stop_renewing()
        if self.lease.lost:
            return
        reason = e.reason if isinstance(e, OpsError) else f"{type(e).__name__}: {e}"
        try:
            self._save(error=reason)
            journal.append(self.store, self.record.scope, "failed", at_step=self.record.step.value,
                           error=reason)  # fmt: skip
            self.lease.expire()
        except Exception:  # the store is unreachable too: the lease then expires on its own
            return

    def _backup_jobs(self, jobs: list[Any]) -> tuple[list[str], list[str]]:
        """Write each job (and its packages) to the store: (ids written, what could not be kept)."""
        scope = self.record.scope
        snap = self.api.snapshot() or {"infos": None, "packages": {}, "too_large": []}
        written, notes = [], []
        for d in jobs:
            owner, source = owner_of(d.submission_id, d.metadata)
            job = BackedUpJob(
                submission_id=d.submission_id,
                status=str(getattr(d.status, "value", d.status)),
                owner=owner,
                owner_source=source,
                entrypoint=d.entrypoint,
                metadata=d.metadata or {},
                runtime_env=d.runtime_env or {},
            )
            info = (snap["infos"] or {}).get(d.submission_id)
            if info is not None:
                job.entrypoint_num_cpus = info.get("entrypoint_num_cpus")
                job.entrypoint_num_gpus = info.get("entrypoint_num_gpus")
                job.entrypoint_memory = info.get("entrypoint_memory")
                job.entrypoint_resources = info.get("entrypoint_resources")
            else:
                job.not_preserved.append("entrypoint resources (the cluster's GCS could not be read)")
            for uri in package_uris(job.runtime_env):
                data = snap["packages"].get(uri)
                if uri in snap["too_large"]:
                    job.not_preserved.append(f"package {uri} (too large to fetch through the dashboard)")
                    continue
                if data is None:
                    job.not_preserved.append(f"package {uri} (not readable from the cluster's GCS)")
                    continue
                key = f"{scope}/packages/{uri.removeprefix('gcs://')}"
                self.store.put(key, data)
                job.packages[uri] = key
            self.store.put(f"{scope}/jobs/{job.submission_id}.json", dump(job))
            written.append(job.submission_id)
            notes += [f"{job.submission_id}: {what}" for what in job.not_preserved]
        return written, notes

    def _backup_new(self) -> None:
        """Back up active jobs that appeared since the backup (submitted while we were working)."""
        if not self.record.preserve_jobs or not self.api.reachable():
            return
        known = set(self.record.jobs)
        fresh = [j for j in self._active_details() if j.submission_id not in known]
        if fresh:
            ids, notes = self._backup_jobs(fresh)
            self.progress(f"backed up {len(ids)} job(s) submitted meanwhile: {', '.join(ids)}")
            self._save(jobs=self.record.jobs + ids, not_preserved=self.record.not_preserved + notes)

    def _active_details(self) -> list[Any]:
        keep = {j.submission_id for j in active_jobs(self.api)}
        return [d for d in self.api.list_jobs() if d.submission_id in keep]

    def backup(self) -> None:
        t = time.monotonic()
        ids: list[str] = []
        notes: list[str] = []
        if self.record.preserve_jobs:
            if not self.api.reachable():
                notes.append("the head did not answer: no job could be backed up")
                self.progress("head unreachable: nothing to back up")
            else:
                details = self._active_details()
                if details:
                    ids, notes = self._backup_jobs(details)
                self.progress(f"backed up {len(ids)} job(s) to {self.store.url}")
        self._advance(Step.BACKED_UP, t, jobs=ids, not_preserved=notes)

    def backed_up(self, submission_id: str) -> BackedUpJob:
        got = read_model(self.store, f"{self.record.scope}/jobs/{submission_id}.json", BackedUpJob)
        if got is None:
            raise OpsError(f"the backup of {submission_id} is missing from {self.store.url}")
        return got[0]

    def stop_jobs(self) -> None:
        t = time.monotonic()
        if self.api.reachable():
            self._backup_new()
            active = active_jobs(self.api)

            def stop(job: Job) -> None:
                try:
                    self.api.stop(job.submission_id)
                except Exception as e:  # already finished, or the agent is gone: the stop covers it
                    self.progress(f"could not stop {job.submission_id} cleanly: {e}")

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(stop, active))
            # Only running jobs have work to checkpoint; a pending one may never see its stop
            # before the cluster goes (Ray queues it behind the supervisor actor's resources).
            deadline = time.monotonic() + self.settings.stop_grace_s
            running = {j.submission_id for j in active if j.status == "RUNNING"}
            while running and time.monotonic() < deadline:
                time.sleep(0.25)
                running &= {j.submission_id for j in active_jobs(self.api) if j.status == "RUNNING"}
            self.progress(
                f"stopped {len(active)} job(s)"
                + (f"; {len(running)} still running after the grace period" if running else "")
            )
        self._advance(Step.JOBS_STOPPED, t)

    def stop_cluster(self) -> None:
        t = time.monotonic()
        if self.api.reachable():
            self._backup_new()
        self.progress(self.driver.stop())
        self._advance(Step.CLUSTER_STOPPED, t)

    def start_cluster(self) -> None:
        t = time.monotonic()
        self.progress(self.driver.start())
        timeout = self.settings.head_timeout_s or (120.0 if self.cluster.driver == "local" else 1200.0)
        self.api = RayApi(self.cluster)
        self.api.wait_accepting(timeout)
        self.progress("head is accepting jobs")
        # Registered reserved workers are re-added here once add-worker exists (see the issues).
        self._advance(Step.CLUSTER_STARTED, t)

    def resubmit(self) -> None:
        """Resubmit every backed-up job not yet resubmitted, in parallel. Exactly once even across
        a crash: the new id is deterministic, so Ray refuses a second submission of it."""
        t = time.monotonic()
        jobs = [self.backed_up(sid) for sid in self.record.jobs if sid not in self.record.resubmitted]
        missing: dict[str, str] = {}
        for uri, key in sorted({(u, k) for job in jobs for u, k in job.packages.items()}):
            blob = self.store.read(key)
            try:
                if blob is None:
                    raise OpsError(f"package {uri} is missing from the store")
                self.api.upload_package(uri, blob.data)
            except OpsError as e:
                missing[uri] = e.reason

        def one(job: BackedUpJob) -> Resubmission:
            new_id = resubmitted_id(job.submission_id, self.record.op_id)
            try:
                lost = [missing[u] for u in job.packages if u in missing]
                if lost:
                    raise OpsError(lost[0])
                self._submit_once(job, new_id)
                return Resubmission(old_id=job.submission_id, new_id=new_id, owner=job.owner)
            except OpsError as e:
                return Resubmission(old_id=job.submission_id, new_id=new_id, owner=job.owner,
                                    status="failed", error=e.reason)  # fmt: skip

        done = dict(self.record.resubmitted)
        with ThreadPoolExecutor(max_workers=8) as pool:
            for n, entry in enumerate(pool.map(one, jobs)):
                done[entry.old_id] = entry
                self.record = self.record.model_copy(update={"resubmitted": done})  # saved on failure too
                journal.append(self.store, self.record.scope, "resubmit", **entry.model_dump())
                self.progress(
                    f"resubmitted {entry.old_id} -> {entry.new_id} ({entry.owner or 'owner unknown'})"
                )
                _fault_point(f"resubmit:{n + 1}")
        self._advance(Step.RESUBMITTED, t, resubmitted=done)

    def _submit_once(self, job: BackedUpJob, new_id: str) -> None:
        """Submit under `new_id`; a job already there from an earlier attempt counts as submitted."""
        try:
            self.api.submit(**job.submit_kwargs(new_id, self.record.op_id))
            return
        except Exception as e:
            first_error = e
        try:
            info = self.api.jobs.get_job_info(new_id)
        except Exception:
            info = None
        if info is not None and (info.metadata or {}).get("clusterbot_operation") == self.record.op_id:
            return
        raise OpsError(f"resubmitting {job.submission_id} failed: {str(first_error).strip()[:300]}")

    def finish(self) -> None:
        t = time.monotonic()
        self.api.delete_finished_probes()
        self._advance(Step.DONE, t, finished_at=datetime.now(UTC), error=None)


def _fault_point(name: str) -> None:
    """Test fault injection: CLUSTERBOT_FAULT=<name> kills this process here, like a crash would;
    CLUSTERBOT_FAULT=fail:<name> fails the step here, like an error would."""
    fault = os.environ.get("CLUSTERBOT_FAULT")
    if fault == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == f"fail:{name}":
        raise OpsError(f"injected failure at {name}")


def start_restart(
    store: Store,
    cluster: Cluster,
    caller: str,
    preserve_jobs: bool,
    settings: Settings | None = None,
    progress: Progress = lambda _: None,
    lease: Lease | None = None,
) -> RestartRun:
    """Take the cluster's lock (or use `lease`, held since the bot announced the restart) and create
    the operation record; `.run()` then executes it."""
    settings = settings or Settings()
    if lease is None:
        lease = acquire(store, cluster.name, new_op_id(cluster.name), "restart", caller, settings.lease_s)
    op_id = lease.record.op_id
    record = RestartRecord(
        op_id=op_id,
        cluster=cluster.name,
        requested_by=caller,
        preserve_jobs=preserve_jobs,
        created_at=datetime.now(UTC),
    )
    try:
        version = store.create(_record_key(cluster.name, op_id), dump(record))
        journal.append(store, record.scope, "requested", by=caller, preserve_jobs=preserve_jobs)
    except BaseException:
        lease.release()
        raise
    return RestartRun(store, cluster, lease, record, version, settings, progress)


def resume_restart(
    store: Store,
    cluster: Cluster,
    caller: str,
    settings: Settings | None = None,
    progress: Progress = lambda _: None,
    holder: str | None = None,
) -> RestartRun:
    """Continue the unfinished restart of `cluster` whose process died (its lease expired, or it was
    the same `holder`, e.g. the bot restarted)."""
    settings = settings or Settings()
    held = current_lock(store, cluster.name)
    if held is None or held.kind != "restart":
        raise Refused(f"there is no unfinished restart on {cluster.name} to resume")
    if read_model(store, _record_key(cluster.name, held.op_id), RestartRecord) is None:
        raise Refused(
            f"{held.describe()} has not started executing (it waits for consent in chat)",
            "cancel it in chat, or an admin force-unlocks the cluster",
        )
    lease = take_over(store, cluster.name, held.op_id, caller, settings.lease_s, holder=holder)
    record, version = load_record(store, cluster.name, held.op_id)
    run = RestartRun(store, cluster, lease, record, version, settings, progress)
    run._save(resumed_by=record.resumed_by + [caller], error=None)
    journal.append(store, record.scope, "resumed", by=caller, at_step=record.step.value)
    progress(f"resuming {record.op_id} at step {record.step.value}")
    return run


class AbandonResult(BaseModel):
    op_id: str
    cluster: str
    step: Step
    backups: str  # where the backups stay
    not_resubmitted: list[str]


def abandon_restart(store: Store, cluster: Cluster, caller: str, lease_s: float) -> AbandonResult:
    """Give up an unfinished restart whose process died: release the lock, keep every backup."""
    held = current_lock(store, cluster.name)
    if held is None or held.kind != "restart":
        raise Refused(f"there is no unfinished restart on {cluster.name} to abandon")
    lease = take_over(store, cluster.name, held.op_id, caller, lease_s)
    record, version = load_record(store, cluster.name, held.op_id)
    left = [sid for sid in record.jobs if sid not in record.resubmitted]
    record = record.model_copy(update={"step": Step.ABANDONED, "finished_at": datetime.now(UTC)})
    store.replace(_record_key(cluster.name, record.op_id), dump(record), version)
    journal.append(store, record.scope, "abandoned", by=caller, not_resubmitted=left)
    lease.release()
    return AbandonResult(
        op_id=record.op_id,
        cluster=cluster.name,
        step=record.step,
        backups=f"{store.url}/{record.scope}/jobs/",
        not_resubmitted=left,
    )
