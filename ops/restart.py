"""Restart a cluster without losing a job: plan, back up, stop, start, resubmit; resumable at every step.

The restart is a sequence of steps, each recorded (by compare-and-set, under the cluster's lock) in
an operation record in the durable store before the next begins, and each journaled:

  planned -> backed_up -> jobs_stopped -> cluster_stopped -> cluster_started -> resubmitted -> done

Nothing is stopped that was not backed up: wherever a step reads the head (plan, backup, job stop,
the last backup before the cluster stops) a head that does not answer is retried up to a deadline,
a 401/403 is bad input naming the token source, and the restart goes on without a backup only when
the driver says positively that there is no head, or when an admin forces it (`force_unbacked`).
"Done" means the jobs run: the new head stayed up for a settle time with every resubmitted job
running (or pending on resources); a head that died meanwhile sends the restart back to starting
the cluster, a job that failed back to resubmitting it, both for `resume` to continue.

A token rotation (ops/tokens.py) is a restart whose record carries a `TokenRotation`: the steps up to
cluster_stopped read the head with the old token; starting the cluster first moves the cluster's pin to
the new version (recorded as `live` in the record, then in the pin), so the new head, the resubmission
and the settle use the new token; before "done" the dashboard must accept the new token and refuse
the old, and the old version is disabled unless another cluster pins it.

Every step is idempotent, so a restart killed anywhere is continued by `resume` from the last
recorded step. Jobs are backed up (running and pending, with what the dashboard does not show)
before anything is stopped, and resubmitted under a deterministic new id, so a retried submission
is refused by Ray as a duplicate rather than run twice.
"""

from __future__ import annotations

import os
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
from ops.context import Context
from ops.drivers import Driver
from ops.errors import OpsError, Refused
from ops.jobs import BackedUpJob, Job, active_jobs, owner_of, package_uris, resubmitted_id
from ops.locks import (
    Lease,
    LockRecord,
    acquire,
    current_lock,
    held_refusal,
    new_op_id,
    operation_scope,
    take_over,
)
from ops.ray_api import RayApi
from ops.registry import Cluster
from ops.store import Store, dump, read_model
from ops.tokens import TokenRotation

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


RESTARTING_KINDS = ("restart", "rotate-token")  # locks whose operation is a RestartRun (resume, abandon)

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
    attempt: int = 1  # a failed job is resubmitted again under a new id per attempt


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
    force_unbacked: bool = False  # an admin allowed going on when the head cannot be read
    unbacked: bool = False  # it went on without a backup (forced): jobs may be lost
    skip_resubmit: dict[str, str] = Field(default_factory=dict)  # job id -> who asked to leave it out
    head_node: str | None = None  # the new head's node id, checked while settling
    workers: list[str] = Field(default_factory=list)  # the ledger's workers after the restart, one line each
    token: TokenRotation | None = None  # a token rotation: which version is live, what is verified

    @property
    def scope(self) -> str:
        return operation_scope(self.cluster, self.op_id)


class RestartPlan(BaseModel):
    """What a restart would do, shown before anything happens (and all of `--dry-run`)."""

    cluster: str
    caller: str
    preserve_jobs: bool
    head_reachable: bool
    unbacked: bool = False  # the head does not answer and the caller forced it: no backup
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
    unbacked: bool = False
    left_out: dict[str, str] = Field(default_factory=dict)  # job id -> who asked not to resubmit it
    workers: list[str] = Field(default_factory=list)  # reserved workers re-added, one line each
    token: TokenRotation | None = None  # a rotation: its versions, verified, the old one disabled


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
        raise held_refusal(held)


def _no_record(cluster: Cluster, held: LockRecord, what: str) -> Refused:
    """A lock whose operation never wrote a record (chat waiting for consent, a restart killed
    between lock and record): nothing to resume or abandon, but a person can always clear it."""
    return Refused(
        f"{cluster.name} is locked by {held.describe()}; it has no operation record, so there is nothing "
        f"to {what}",
        f"`python -m ops unlock --cluster {cluster.name} --op {held.op_id} --yes` clears the lock",
    )


class Head(StrEnum):
    """What a step may do with the head, from `read_head`."""

    ANSWERS = "answers"  # read it: list, back up, stop
    GONE = "gone"  # the driver says there is no head: nothing runs, nothing to lose
    FORCED = "forced"  # it does not answer and an admin said go on anyway: jobs are not backed up


NOT_BACKED_UP = "the head did not answer: jobs were NOT backed up (forced by an admin)"


def read_head(
    api: RayApi, driver: Driver, settings: Settings, force_unbacked: bool, progress: Progress = lambda _: None
) -> Head:
    """Whether a step may read the head, may go on without it, or must refuse.

    Unreachable is not dead: timeouts and refused connections are retried up to the deadline; then
    only the driver saying positively that no head exists lets the restart go on without a backup,
    or an admin's `force_unbacked`. A 401/403 raises TokenRefused at once (bad input)."""
    if api.wait_reachable(min(settings.reach_deadline_s, 2.0)):
        return Head.ANSWERS
    progress(f"the {api.cluster.name} head does not answer; retrying for {settings.reach_deadline_s:.0f}s")
    if api.wait_reachable(settings.reach_deadline_s):
        return Head.ANSWERS
    exists = driver.head_exists()
    if exists is False:
        return Head.GONE
    if force_unbacked:
        return Head.FORCED
    state = "is running" if exists else "may be running (the driver cannot tell)"
    raise Refused(
        f"the {api.cluster.name} head did not answer at {api.url} for {settings.reach_deadline_s:.0f}s "
        f"but {state}: its jobs cannot be backed up, so nothing was stopped",
        "check the head (or this machine's way to it) and try again; an admin may force a restart "
        "without backup (--force-unbacked)",
    )


def plan_restart(
    ctx: Context,
    cluster: Cluster,
    caller: str,
    preserve_jobs: bool,
    force_unbacked: bool = False,
    settings: Settings | None = None,
    progress: Progress = lambda _: None,
) -> RestartPlan:
    """Look before acting: the jobs a restart would stop, whose they are, what can be kept.

    Refused when the head cannot be read and is not known to be gone (unless `force_unbacked`)."""
    check_unfinished(ctx.store, cluster)
    settings = settings or Settings()
    driver = ctx.driver(cluster)
    api = ctx.ray(cluster)
    head = read_head(api, driver, settings, force_unbacked, progress)
    notes = []
    jobs = active_jobs(api) if head == Head.ANSWERS else []
    if head == Head.GONE:
        notes.append("the head is not running: there are no jobs to back up")
    if head == Head.FORCED:
        notes.append("the head does not answer: its jobs cannot be listed and will NOT be backed up")
    if not preserve_jobs and jobs:
        notes.append("--preserve-jobs 0: running and pending jobs are stopped and NOT resubmitted")
    owners = Counter(j.owner_label for j in jobs)
    others = sum(n for o, n in owners.items() if o != caller)
    return RestartPlan(
        cluster=cluster.name,
        caller=caller,
        preserve_jobs=preserve_jobs,
        head_reachable=head == Head.ANSWERS,
        unbacked=head == Head.FORCED,
        jobs=jobs,
        owners=dict(owners),
        others_jobs=others,
        notes=notes,
    )


class RestartRun:
    """One restart operation in progress: owns the lease and the record, advances step by step."""

    def __init__(
        self,
        ctx: Context,
        cluster: Cluster,
        lease: Lease,
        record: RestartRecord,
        version: str,
        settings: Settings,
        progress: Progress,
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.cluster = cluster
        self.lease = lease
        self.record = record
        self._version = version
        self.settings = settings
        self.progress = progress
        self.driver = ctx.driver(cluster)
        self._api: RayApi | None = None  # reached when a step needs it: a failure then fails that step

    @property
    def api(self) -> RayApi:
        if self._api is None:
            self._api = self.ctx.ray(self.cluster)
        return self._api

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
                Step.RESUBMITTED: self.settle,
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
            unbacked=r.unbacked,
            left_out=r.skip_resubmit,
            workers=r.workers,
            token=r.token,
        )

    def _fail(self, e: BaseException) -> None:
        """Leave the operation resumable at once: the lock stays, its lease is ended now. A restart
        that failed in its first step (refused, or it could not reach the head) stopped nothing: it
        gives the cluster back instead."""
        self.lease.stop_renewing()
        if self.lease.lost:
            return
        reason = e.reason if isinstance(e, OpsError) else f"{type(e).__name__}: {e}"
        untouched = self.record.step == Step.PLANNED
        try:
            if untouched:
                self._save(error=reason, step=Step.ABANDONED, finished_at=datetime.now(UTC))
                self._drop_unused_version()
                event = "refused" if isinstance(e, Refused) else "failed_untouched"
                journal.append(self.store, self.record.scope, event, error=reason)
                self.lease.release()
                return
            self._save(error=reason)
            journal.append(self.store, self.record.scope, "failed", at_step=self.record.step.value,
                           error=reason)  # fmt: skip
            self.lease.expire()
        except Exception:  # the store is unreachable too: the lease then expires on its own
            return

    def _drop_unused_version(self) -> None:
        """A rotation that stopped nothing: its new version was never pinned; disable it (best effort)."""
        rotation = self.record.token
        if rotation is None:
            return
        try:
            self.ctx.secrets(self.cluster).disable(rotation.secret, rotation.new_version)
        except Exception as e:  # it stays enabled and unpinned: harmless, and said
            self.progress(f"could not disable the unused version {rotation.new_version}: {type(e).__name__}")

    def _head(self) -> Head:
        return read_head(self.api, self.driver, self.settings, self.record.force_unbacked, self.progress)

    def _gcs_snapshot(self) -> dict[str, Any]:
        """What only the cluster's GCS holds: the jobs' entrypoint resources and working_dir packages.
        A job backed up without them comes back on the wrong resources, or not at all (its package dies
        with the cluster): nothing is stopped without them, unless an admin forced going on unbacked."""
        try:
            _fault_point("snapshot")
            return self.api.snapshot()
        except OpsError as e:
            what = f"the jobs' resources and packages could not be read from the {self.cluster.name} GCS"
            if not self.record.force_unbacked:
                first = self.record.step == Step.PLANNED
                raise Refused(
                    f"{what}: {e.reason}",
                    "nothing was stopped; try again (an admin may force a restart without backup: "
                    "--force-unbacked)"
                    if first
                    else f"`python -m ops restart --cluster {self.cluster.name} --resume` tries again",
                ) from None
            self.progress(f"{what}: going on without them (forced by an admin)")
            return {"infos": None, "packages": {}, "too_large": []}

    def _backup_jobs(self, jobs: list[Any]) -> tuple[list[str], list[str]]:
        """Write each job (and its packages) to the store: (ids written, what could not be kept)."""
        scope = self.record.scope
        snap = self._gcs_snapshot()
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
        """Back up active jobs that appeared since the backup (submitted while we were working).
        Called only once the head answered (`_head`)."""
        known = set(self.record.jobs)
        fresh = [j for j in self._active_details() if j.submission_id not in known]
        if fresh:
            ids, notes = self._backup_jobs(fresh)
            self.progress(f"backed up {len(ids)} job(s) submitted meanwhile: {', '.join(ids)}")
            self._save(jobs=self.record.jobs + ids, not_preserved=self.record.not_preserved + notes)

    def _active_details(self) -> list[Any]:
        keep = {j.submission_id for j in active_jobs(self.api)}
        return [d for d in self.api.list_jobs() if d.submission_id in keep]

    def _went_on_without(self, head: Head) -> dict[str, Any]:
        """Record changes when a step goes on without reading the head."""
        if head == Head.GONE:
            self.progress("the head is not running: no job to back up")
            return {}
        self.progress("the head does not answer: going on WITHOUT a backup (forced by an admin)")
        notes = self.record.not_preserved
        return {
            "unbacked": True,
            "not_preserved": notes + ([NOT_BACKED_UP] if NOT_BACKED_UP not in notes else []),
        }

    def backup(self) -> None:
        t = time.monotonic()
        changes: dict[str, Any] = {"jobs": [], "not_preserved": []}
        if self.record.preserve_jobs:
            head = self._head()
            if head == Head.ANSWERS:
                details = self._active_details()
                ids, notes = self._backup_jobs(details) if details else ([], [])
                changes = {"jobs": ids, "not_preserved": notes}
                self.progress(f"backed up {len(ids)} job(s)")
            else:
                changes.update(self._went_on_without(head))
        self._advance(Step.BACKED_UP, t, **changes)

    def backed_up(self, submission_id: str) -> BackedUpJob:
        got = read_model(self.store, f"{self.record.scope}/jobs/{submission_id}.json", BackedUpJob)
        if got is None:
            raise OpsError(f"the backup of {submission_id} is missing from the store")
        return got[0]

    def _back_up_since(self) -> tuple[Head, dict[str, Any]]:
        """Before a step that stops something: back up the jobs submitted since the backup (the head
        read under the unbacked rule), or the record changes of going on without it."""
        if not self.record.preserve_jobs:
            return Head.GONE, {}
        head = self._head()
        if head == Head.ANSWERS:
            self._backup_new()
            return head, {}
        return head, self._went_on_without(head)

    def stop_jobs(self) -> None:
        t = time.monotonic()
        head, changes = self._back_up_since()
        if not self.record.preserve_jobs:  # nothing is kept either way: stop what answers (checkpoints)
            head = Head.ANSWERS if self.api.reachable() else Head.GONE
        if head == Head.ANSWERS:
            self._stop_active()
        self._advance(Step.JOBS_STOPPED, t, **changes)

    def _stop_active(self) -> None:
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

    def stop_cluster(self) -> None:
        """The last backup (jobs submitted since the stop), then the cluster goes."""
        t = time.monotonic()
        _, changes = self._back_up_since()
        if changes:
            self._save(**changes)
        self.progress(self.driver.stop())
        self._advance(Step.CLUSTER_STOPPED, t)

    def start_cluster(self) -> None:
        t = time.monotonic()
        self._switch_token()
        self.progress(self.driver.start())
        timeout = self.settings.head_timeout_s or (120.0 if self.cluster.driver == "local" else 1200.0)
        self._api = self.ctx.ray(self.cluster)  # a new head: maybe a new address
        self.api.wait_accepting(timeout)
        self.progress("head is accepting jobs")
        from ops.workers import readd_workers  # the reserved-capacity ledger: its workers serve the new head

        # After a token rotation the ledger's VMs are made again: their startup scripts hold the old token.
        rotated = self.record.token is not None
        workers = readd_workers(self.ctx, self.cluster, self.progress, new_token=rotated)
        for line in workers:
            self.progress(line)
        try:
            head_node = self._head_node()
        except OpsError:
            head_node = None  # not known: settle then judges the head by what it sees
        self._advance(Step.CLUSTER_STARTED, t, head_node=head_node, workers=workers)

    def _switch_token(self) -> None:
        """A rotation: the old head is stopped, so the cluster's pin moves to the new version (the record
        first, so a resume knows; both idempotent); the driver starts the new head with it."""
        rotation = self.record.token
        if rotation is None:
            return
        from ops import tokens

        if rotation.live != rotation.new_version:
            self._save(token=rotation.model_copy(update={"live": rotation.new_version}))
            journal.append(self.store, self.record.scope, "token_live", secret=rotation.secret,
                           version=rotation.new_version)  # fmt: skip
            _fault_point("token:live")
        tokens.switch(self.ctx, self.cluster, rotation, self.record.op_id)
        self.progress(
            f"{self.cluster.name} now runs with version {rotation.new_version} of {rotation.secret}"
        )

    def _finish_rotation(self) -> None:
        """A rotation's last checks: the new token accepted and the old refused (recorded), then the old
        version disabled unless another cluster pins it."""
        from ops import tokens

        rotation = self.record.token
        assert rotation is not None
        if not rotation.verified:
            tokens.verify(self.ctx, self.cluster, rotation)
            rotation = rotation.model_copy(update={"verified": True})
            self._save(token=rotation)
            journal.append(self.store, self.record.scope, "token_verified", version=rotation.new_version)
            self.progress("the dashboard accepts the new token and refuses the old")
            _fault_point("token:verified")
        if not rotation.old_disabled and not rotation.old_kept_for:
            rotation = tokens.retire(self.ctx, self.cluster, rotation)
            self._save(token=rotation)
            journal.append(self.store, self.record.scope, "token_retired", version=rotation.old_version,
                           disabled=rotation.old_disabled, kept_for=rotation.old_kept_for)  # fmt: skip
            self.progress(tokens.report_lines(self.cluster.name, rotation)[0])

    def _head_node(self) -> str | None:
        """The id of the alive head node; None when Ray's nodes show none alive. OpsError when they
        cannot be read (a timeout, a 5xx): that says nothing of the head."""
        nodes = self.api.nodes()
        alive = [n for n in nodes if n.get("is_head_node") and n.get("state") == "ALIVE"]
        return alive[0].get("node_id") if alive else None

    def _to_resubmit(self) -> list[BackedUpJob]:
        """Backed-up jobs not yet resubmitted, or whose last attempt failed; not those left out."""
        done = self.record.resubmitted
        return [
            self.backed_up(sid)
            for sid in self.record.jobs
            if sid not in self.record.skip_resubmit and (sid not in done or done[sid].status == "failed")
        ]

    def resubmit(self) -> None:
        """Resubmit every backed-up job not yet resubmitted, in parallel. Exactly once even across
        a crash: the new id is deterministic, so Ray refuses a second submission of it. A job that
        still fails after retries keeps the restart unfinished (failed is not done)."""
        t = time.monotonic()
        jobs = self._to_resubmit()
        missing: dict[str, str] = {}
        for uri, key in sorted({(u, k) for job in jobs for u, k in job.packages.items()}):
            blob = self.store.read(key)
            try:
                if blob is None:
                    raise OpsError(f"package {uri} is missing from the store")
                _retry(lambda blob=blob, uri=uri: self.api.upload_package(uri, blob.data))
            except OpsError as e:
                missing[uri] = e.reason
        previous = self.record.resubmitted

        def one(job: BackedUpJob) -> Resubmission:
            last = previous.get(job.submission_id)
            if last is not None:  # its last attempt failed, or seemed to: a submission whose answer was lost
                try:
                    if self.api.status(last.new_id) in ("PENDING", "RUNNING", "SUCCEEDED"):
                        return last.model_copy(update={"status": "submitted", "error": None})
                except OpsError as e:  # cannot tell: no new attempt beside one that may be running
                    why = f"{last.new_id} could not be checked: {e.reason}"
                    return last.model_copy(update={"error": why})
            attempt = last.attempt + 1 if last is not None else 1
            new_id = resubmitted_id(job.submission_id, self.record.op_id, attempt)
            entry = Resubmission(old_id=job.submission_id, new_id=new_id, owner=job.owner, attempt=attempt)
            try:
                lost = [missing[u] for u in job.packages if u in missing]
                if lost:
                    raise OpsError(lost[0])
                _retry(lambda: self._submit_once(job, new_id))
                return entry
            except OpsError as e:
                return entry.model_copy(update={"status": "failed", "error": e.reason})

        done = dict(previous)
        with ThreadPoolExecutor(max_workers=8) as pool:
            for n, entry in enumerate(pool.map(one, jobs)):
                done[entry.old_id] = entry
                self.record = self.record.model_copy(update={"resubmitted": done})  # saved on failure too
                journal.append(self.store, self.record.scope, "resubmit", **entry.model_dump())
                who = entry.owner or "owner unknown"
                self.progress(
                    f"resubmitted {entry.old_id} -> {entry.new_id} ({who})"
                    if entry.status == "submitted"
                    else f"could not resubmit {entry.old_id} ({who}): {entry.error}"
                )
                _fault_point(f"resubmit:{n + 1}")
        failed = [x for x in done.values() if x.status == "failed"]
        if failed:
            self._save(resubmitted=done)
            raise OpsError(
                f"{len(failed)} job(s) could not be resubmitted: "
                + "; ".join(f"{x.old_id} ({x.error})" for x in failed),
                f"`python -m ops restart --cluster {self.cluster.name} --resume` tries them again",
            )
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

    def settle(self) -> None:
        """Done only when the jobs run: the new head stays up for the settle time and every
        resubmitted job is running (pending only when it asked for resources, e.g. TPUs)."""
        t = time.monotonic()
        seen_since = t  # the head has been seen alive, as the same node, since then
        limit = t + 4 * self.settings.settle_s + 30
        while True:
            try:
                head, answered = self._head_node(), True
            except OpsError:  # Ray's nodes could not be read this time: neither alive nor dead
                head, answered = None, False
            if head is not None and self.record.head_node not in (None, head):
                self._head_died()
            if head is None:
                # Dead only on Ray's word (the nodes answered: no head alive) or the driver's (no head).
                if answered or self.driver.head_exists() is False:
                    self._head_died()
                seen_since = time.monotonic()  # cannot see it: it has not been seen staying up
            try:
                bad, waiting = self._job_states() if head is not None else ({}, [])
            except OpsError:  # the dashboard stopped answering after it showed the head: look again
                head, bad, waiting = None, {}, []
                seen_since = time.monotonic()
            if bad:
                self._jobs_failed(bad)
            now = time.monotonic()
            if head is not None and now - seen_since >= self.settings.settle_s and not waiting:
                break
            if now >= limit:
                raise OpsError(
                    f"after {now - t:.0f}s the {self.cluster.name} head was not seen up for "
                    f"{self.settings.settle_s:.0f}s with every job running"
                    + (f" (still pending, asking no resources: {', '.join(waiting)})" if waiting else ""),
                    f"`python -m ops restart --cluster {self.cluster.name} --resume` checks them again",
                )
            time.sleep(1.0)
        self.progress(f"the head stayed up {time.monotonic() - t:.0f}s with every job running")
        if self.record.token is not None:
            self._finish_rotation()
        self.api.delete_finished_probes()
        self._advance(Step.DONE, t, finished_at=datetime.now(UTC), error=None)

    def _job_states(self) -> tuple[dict[str, str], list[str]]:
        """(resubmitted jobs that ended or vanished -> why, jobs still pending with no resources asked).
        OpsError when the dashboard cannot be asked: that says nothing of the jobs."""
        bad: dict[str, str] = {}
        waiting: list[str] = []
        for x in self.record.resubmitted.values():
            if x.status != "submitted":
                continue
            status = self.api.status(x.new_id)
            if status in ("RUNNING", "SUCCEEDED"):
                continue
            if status == "PENDING":
                job = self.backed_up(x.old_id)
                if not (job.entrypoint_resources or job.entrypoint_num_gpus or job.entrypoint_num_cpus):
                    waiting.append(x.new_id)
                continue
            bad[x.old_id] = f"{x.new_id} is {status or 'gone'} after its resubmission"
        return bad, waiting

    def _head_died(self) -> None:
        """The new head went away after the jobs were resubmitted: they went with it. Back to
        starting the cluster, every job to be resubmitted again (a new head knows no id)."""
        self._save(step=Step.CLUSTER_STOPPED, resubmitted={}, head_node=None)
        journal.append(self.store, self.record.scope, "head_died", after="resubmitted")
        raise OpsError(
            f"the new {self.cluster.name} head went down after the jobs were resubmitted",
            f"`python -m ops restart --cluster {self.cluster.name} --resume` starts it again and "
            "resubmits every job",
        )

    def _jobs_failed(self, bad: dict[str, str]) -> None:
        done = {
            old: x.model_copy(update={"status": "failed", "error": bad[old]}) if old in bad else x
            for old, x in self.record.resubmitted.items()
        }
        self._save(step=Step.CLUSTER_STARTED, resubmitted=done)
        journal.append(self.store, self.record.scope, "jobs_failed", jobs=bad)
        raise OpsError(
            f"{len(bad)} resubmitted job(s) did not keep running: " + "; ".join(bad.values()),
            f"`python -m ops restart --cluster {self.cluster.name} --resume` resubmits them again",
        )


def _retry(call: Callable[[], None], tries: int = 3, pause_s: float = 1.0) -> None:
    """Retry a call that failed (transient errors: a 503, a reset connection) with backoff."""
    for n in range(tries):
        try:
            call()
            return
        except OpsError:
            if n == tries - 1:
                raise
        time.sleep(pause_s * 3**n)


def _fault_point(name: str) -> None:
    """Test fault injection: CLUSTERBOT_FAULT=<name> kills this process here, like a crash would;
    CLUSTERBOT_FAULT=fail:<name> fails the step here, like an error would."""
    fault = os.environ.get("CLUSTERBOT_FAULT")
    if fault == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == f"fail:{name}":
        raise OpsError(f"injected failure at {name}")


def start_restart(
    ctx: Context,
    cluster: Cluster,
    caller: str,
    preserve_jobs: bool,
    settings: Settings | None = None,
    progress: Progress = lambda _: None,
    lease: Lease | None = None,
    force_unbacked: bool = False,
    skip_resubmit: dict[str, str] | None = None,
    token: TokenRotation | None = None,
) -> RestartRun:
    """Take the cluster's lock (or use `lease`, held since the bot announced the restart) and create
    the operation record; `.run()` then executes it. `skip_resubmit`: jobs backed up but not
    resubmitted, each with who asked (jobs that must not run twice). `token`: the rotation this
    restart rolls out (ops.tokens.start_rotation)."""
    store = ctx.store
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
        force_unbacked=force_unbacked,
        skip_resubmit=dict(skip_resubmit or {}),
        token=token,
    )
    try:
        version = store.create(_record_key(cluster.name, op_id), dump(record))
        versions = None if token is None else [token.old_version, token.new_version]
        journal.append(store, record.scope, "requested", by=caller, preserve_jobs=preserve_jobs,
                       token_versions=versions)  # fmt: skip
    except BaseException:
        lease.release()
        raise
    return RestartRun(ctx, cluster, lease, record, version, settings, progress)


def resume_restart(
    ctx: Context,
    cluster: Cluster,
    caller: str,
    settings: Settings | None = None,
    progress: Progress = lambda _: None,
    holder: str | None = None,
) -> RestartRun:
    """Continue the unfinished restart of `cluster` whose process died (its lease expired, or it was
    the same `holder`, e.g. the bot restarted)."""
    store = ctx.store
    settings = settings or Settings()
    held = current_lock(store, cluster.name)
    if held is None or held.kind not in RESTARTING_KINDS:
        raise Refused(f"there is no unfinished restart on {cluster.name} to resume")
    if find_record(store, cluster.name, held.op_id) is None:
        raise _no_record(cluster, held, "resume")
    lease = take_over(store, cluster.name, held.op_id, caller, settings.lease_s, holder=holder)
    record, version = load_record(store, cluster.name, held.op_id)
    run = RestartRun(ctx, cluster, lease, record, version, settings, progress)
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


def abandon_restart(ctx: Context, cluster: Cluster, caller: str, lease_s: float) -> AbandonResult:
    """Give up an unfinished restart whose process died: release the lock, keep every backup."""
    store = ctx.store
    held = current_lock(store, cluster.name)
    if held is None or held.kind not in RESTARTING_KINDS:
        raise Refused(f"there is no unfinished restart on {cluster.name} to abandon")
    if find_record(store, cluster.name, held.op_id) is None:  # checked first: a refusal changes nothing
        raise _no_record(cluster, held, "abandon")
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
