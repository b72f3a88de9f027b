"""A cluster's health: one snapshot joining Ray's view and the cloud's, and a verdict with its evidence.

`check` reads every source in threads, each bounded by the cluster's `health.read_timeout_s` (a source
that does not answer in time is named in `errors`, never waited for), records a history `Point` in the
store (`health/<cluster>.json`, about a day of them: what "for longer than a threshold" is judged on, and
the bot's chart), and `judge`s: a pure function of the snapshot, the history and the thresholds, so the
rules are tested without a cluster and with an injected clock.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from ops.context import Context
from ops.errors import OpsError
from ops.ray_api import RayApi, Reach
from ops.registry import Cluster, HealthThresholds
from ops.status import (
    Death,
    read_autoscaler,
    read_cloud,
    read_job_counts,
    read_workers,
)
from ops.store import Conflict

KEEP = timedelta(hours=24, minutes=30)  # history kept per cluster (the bot charts the last 24 h)
WRITE_TRIES = 5  # conditional writes of the history when the bot and the CLI check at once


class Verdict(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"  # fewer workers than min
    STUCK = "stuck"
    CHURNING = "churning"
    HEAD_DOWN = "head-down"  # only when the driver says there is no head
    TOKEN_REFUSED = "token-refused"
    UNKNOWN = "unknown"  # a source could not be read in time


class Snapshot(BaseModel):
    """What Ray and the cloud said of one cluster at `at`. A source that could not be read is named in
    `errors` (source -> why), and what it would have filled stays empty."""

    cluster: str
    at: datetime
    head_up: bool | None = None  # None: could not tell
    workers: dict[str, int] = Field(default_factory=dict)  # alive workers by slice type (a slice is one)
    dead_workers: int = 0
    min_workers: int = 0
    max_workers: int = 0
    pending_launches: dict[str, int] = Field(default_factory=dict)  # node type -> launches under way
    failed_launches: list[str] = Field(default_factory=list)  # recent failures, as Ray words them
    demand: list[str] = Field(default_factory=list)  # unmet resource demand, e.g. "{'TPU-v4-8-head': 1} * 2"
    running_jobs: int = 0
    vms: dict[str, int] = Field(default_factory=dict)  # the cluster's TPU VMs by state (READY, PREEMPTED...)
    preempted: list[str] = Field(default_factory=list)  # names of PREEMPTED / TERMINATED VMs
    queued: dict[str, int] = Field(default_factory=dict)  # the cluster's queued resources by state
    errors: dict[str, str] = Field(default_factory=dict)
    # Added by the readers (issue 9): what the rules need beyond the contract's fields.
    reach: str | None = None  # ops.ray_api.Reach of the dashboard: ok, refused, unreachable
    pending_jobs: int = 0
    deaths: list[Death] = Field(default_factory=list)  # dead workers with Ray's join / death times
    still_counted: list[str] = Field(default_factory=list)  # preempted VMs whose Ray worker is still ALIVE
    head_started: datetime | None = None  # when the current head joined (Ray's node time)
    seconds: float = 0.0  # how long reading took
    _alive_ids: set[str] = PrivateAttr(default_factory=set)  # Ray's alive workers: node ids, slice names

    @property
    def alive(self) -> int:
        return sum(self.workers.values())

    @property
    def wanting(self) -> bool:
        """Demand waits or launches are under way or failing: the autoscaler wants workers it lacks."""
        return bool(self.demand or self.failed_launches or self.pending_launches)

    @property
    def short(self) -> bool:
        """Head only, or below min, while workers are wanted: what lasting too long makes `stuck`."""
        return self.reach == Reach.OK and self.wanting and (self.alive == 0 or self.alive < self.min_workers)


class Health(BaseModel):
    snapshot: Snapshot
    verdict: Verdict
    evidence: list[str] = Field(default_factory=list)  # what led to the verdict, one fact a line
    action: str = ""  # what to do about it, one line ("" when healthy)
    # When the condition behind the verdict began, for a verdict that waits for it to last (stuck: short
    # of workers since): alerts count their streak from there, not from the first check that said it.
    since: datetime | None = None


class Point(BaseModel):
    """One check in a cluster's history (the store keeps about a day of them): the chart's data."""

    at: datetime
    alive: int
    verdict: Verdict
    short: bool = False  # Snapshot.short at that check: the run of these dates a stuck cluster


# -- reading --------------------------------------------------------------------------------------------
def read(ctx: Context, cluster: Cluster, now: datetime | None = None) -> Snapshot:
    """Both sources at once, in threads; whatever is not back within `read_timeout_s` is an error."""
    now = now or datetime.now(UTC)
    limit = cluster.health.read_timeout_s
    started = time.monotonic()
    deadline = started + limit
    snap = Snapshot(
        cluster=cluster.name, at=now, min_workers=cluster.min_workers, max_workers=cluster.max_workers
    )
    pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix=f"health-{cluster.name}")
    try:
        cloud = pool.submit(lambda: read_cloud(ctx.tpu(cluster), cluster))
        api_f = pool.submit(_ray_with_token, ctx, cluster)
        api = _wait(api_f, deadline, snap, "ray")
        if api is not None:
            reach, code = _wait(pool.submit(api.probe, limit), deadline, snap, "ray") or (
                Reach.UNREACHABLE,
                None,
            )
            snap.reach = reach.value
            if reach == Reach.OK:
                snap.head_up = True
                left = max(0.1, deadline - time.monotonic())
                parts = {
                    "ray nodes": pool.submit(read_workers, api, left),
                    "autoscaler": pool.submit(read_autoscaler, api, left),
                    "jobs": pool.submit(read_job_counts, api, left),
                }
                _fill_ray(snap, {k: _wait(f, deadline, snap, k) for k, f in parts.items()})
            elif reach == Reach.REFUSED:
                snap.head_up = True  # a head answered, refusing our token
                snap.errors["ray"] = api.token_refused(code or 401).reason
            else:
                snap.errors.setdefault("ray", f"the dashboard at {api.url} did not answer within {limit:g}s")
        if snap.head_up is None:
            # Unreachable is not dead (ops/restart.py read_head): only the driver can say there is no head.
            exists = _wait(
                pool.submit(lambda: ctx.driver(cluster).head_exists()), deadline + limit, snap, "driver"
            )
            snap.head_up = False if exists is False else (True if exists else None)
        _fill_cloud(snap, _wait(cloud, deadline, snap, "cloud"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a source still hanging ends by its own timeout
    snap.seconds = round(time.monotonic() - started, 3)
    return snap


def _ray_with_token(ctx: Context, cluster: Cluster) -> RayApi:
    """The cluster's Ray API with its token read now: a token that cannot be read (Secret Manager out
    of reach) is said as such, not as a dashboard that did not answer."""
    api = ctx.ray(cluster)
    api.headers  # noqa: B018 - reads the token (OpsError naming the secret, never the value)
    return api


def _wait(future: Future, deadline: float, snap: Snapshot, source: str) -> Any:
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        snap.errors.setdefault(source, "no answer in time")
    except OpsError as e:
        snap.errors.setdefault(source, e.reason)
    except Exception as e:  # a client's own error (gRPC, HTTP): a fact about the source, never a crash
        snap.errors.setdefault(
            source, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        )
    return None


def _fill_ray(snap: Snapshot, got: dict[str, Any]) -> None:
    workers, autoscaler, jobs = got["ray nodes"], got["autoscaler"], got["jobs"]
    if workers is not None:
        snap.workers = workers.alive
        snap.deaths = workers.deaths
        snap.dead_workers = len(workers.deaths)
        snap.head_started = workers.head_started
        snap._alive_ids = set(workers.alive_ids)
    if autoscaler is not None:
        snap.pending_launches = autoscaler.pending_launches
        snap.failed_launches = autoscaler.failed_launches
        snap.demand = autoscaler.demand
    if jobs is not None:
        snap.running_jobs = jobs.get("RUNNING", 0)
        snap.pending_jobs = jobs.get("PENDING", 0)


def _fill_cloud(snap: Snapshot, cloud: Any) -> None:
    if cloud is None:
        return
    snap.vms, snap.queued = cloud.vms, cloud.queued
    snap.preempted = sorted(cloud.gone)
    alive = snap._alive_ids
    snap.still_counted = sorted(vm for vm in cloud.gone if vm in alive or cloud.gone_ray_ids.get(vm) in alive)


# -- judging (pure) -------------------------------------------------------------------------------------
def _hm(t: datetime) -> str:
    return f"{t:%H:%M} UTC"


def _minutes(d: timedelta) -> str:
    return f"{d.total_seconds() / 60:.0f} min"


def short_since(snap: Snapshot, history: list[Point], limits: HealthThresholds) -> datetime:
    """Since when the cluster has been short of workers while wanting them: the start of the history's
    trailing run of short checks, never before the current head joined (Ray's node time: points of an
    earlier head say nothing of this one). A gap between checks longer than the threshold (the bot was
    down; a person checks now and then) breaks the run unless Ray's node times bridge it: head only, and
    no worker died inside the gap, so none came and went unseen."""
    since = snap.at
    gap = timedelta(minutes=limits.stuck_after_min)
    for point in sorted((p for p in history if p.at < snap.at), key=lambda p: p.at, reverse=True):
        if point.verdict == Verdict.UNKNOWN:
            continue  # a check that could not read the cluster says nothing either way
        if not point.short:
            break
        if since - point.at > gap:
            unseen = [d for d in snap.deaths if d.ended is not None and point.at < d.ended <= since]
            if snap.alive > 0 or unseen:
                break
        since = point.at
    if snap.head_started is not None and snap.head_started > since:
        since = min(snap.head_started, snap.at)
    return since


def churn(snap: Snapshot, limits: HealthThresholds) -> list[Death]:
    """Workers that died within `churn_within_min` of joining, during the last `churn_lookback_min`; not
    those Ray ended on purpose (an idle node drained by the autoscaler is scaling down, not churn)."""
    start = snap.at - timedelta(minutes=limits.churn_lookback_min)
    within = timedelta(minutes=limits.churn_within_min)
    return [
        d
        for d in snap.deaths
        if d.started and d.ended and d.ended >= start and d.ended - d.started <= within and not d.on_purpose
    ]


def judge(snap: Snapshot, history: list[Point], limits: HealthThresholds) -> Health:
    """The verdict, the facts that led to it, and one action. Rules in order: head-down, token-refused,
    churning, stuck on dead VMs, unknown (the dashboard, Ray's nodes or the autoscaler unread), stuck for
    too long, degraded, healthy (unknown when the cloud was not read and nothing else is certain)."""
    c = snap.cluster
    counts = f"{snap.alive} worker(s) alive (min {snap.min_workers}, max {snap.max_workers})"
    errors = [f"{source} not read: {why}" for source, why in sorted(snap.errors.items())]

    def verdict(v: Verdict, evidence: list[str], action: str = "", since: datetime | None = None) -> Health:
        return Health(snapshot=snap, verdict=v, evidence=evidence, action=action, since=since)

    if snap.head_up is False:
        return verdict(
            Verdict.HEAD_DOWN,
            [f"the driver says no head is running for {c}", *errors],
            f"start it again: /restart {c} (python -m ops restart --cluster {c})",
        )
    if snap.reach == Reach.REFUSED:
        return verdict(
            Verdict.TOKEN_REFUSED,
            [snap.errors.get("ray", "the dashboard refused our token")],
            f"refresh this machine's copy of {c}'s Ray token (the registry says where it is read)",
        )
    churned = churn(snap, limits)
    if len(churned) >= limits.churn_deaths:
        lines = [
            f"{len(churned)} worker(s) died within {limits.churn_within_min:g} min of joining in the last "
            f"{limits.churn_lookback_min:g} min (threshold {limits.churn_deaths})"
        ]
        lines += [
            f"{d.worker_type} {d.node_id[:12]} lived {_minutes(d.ended - d.started)}, died {_hm(d.ended)}"
            + (f" ({d.reason[:80]})" if d.reason else "")
            for d in churned[-5:]
            if d.started and d.ended
        ]
        return verdict(
            Verdict.CHURNING,
            [*lines, counts, *errors],
            "preemptions undo scaling up: wait, or add reserved capacity (add-worker TYPE reserved)",
        )
    gone = ", ".join(f"{vm}" for vm in snap.preempted)
    if snap.still_counted or (snap.preempted and snap.failed_launches):
        lines = []
        if snap.still_counted:
            lines.append(
                f"the cloud says {', '.join(snap.still_counted)} PREEMPTED/TERMINATED; Ray still counts "
                "it alive"
            )
        if snap.preempted and snap.failed_launches:
            lines.append(f"dead TPU VMs {gone} hold quota while launches fail: {snap.failed_launches[-1]}")
        return verdict(
            Verdict.STUCK,
            [*lines, counts, *errors],
            f"clean the dead VMs (Clean preempted TPUs; python -m ops clean-preempted --cluster {c}), "
            f"then restart {c} if the autoscaler does not recover",
        )
    if snap.reach != Reach.OK:
        return verdict(
            Verdict.UNKNOWN,
            [
                *errors,
                "the driver says a head is running"
                if snap.head_up
                else "the driver cannot tell whether a head is running",
            ],
            f"check the head or this machine's way to it: python -m ops status --cluster {c}",
        )
    unread = [source for source in ("ray nodes", "autoscaler") if source in snap.errors]
    if unread:  # no worker count, or no word of what is wanted: stuck, degraded and healthy all unknown
        return verdict(
            Verdict.UNKNOWN,
            [*errors, counts if "ray nodes" not in unread else "workers not counted"],
            f"check again; if it lasts, look at the head: python -m ops status --cluster {c}",
        )
    wanting = _wanting(snap)
    if snap.short:
        since = short_since(snap, history, limits)
        lasted = snap.at - since
        shape = "head only" if snap.alive == 0 else f"below min ({snap.alive} of {snap.min_workers})"
        line = f"{shape} since {_hm(since)} ({_minutes(lasted)}; stuck after {limits.stuck_after_min:g} min)"
        if lasted >= timedelta(minutes=limits.stuck_after_min):
            return verdict(
                Verdict.STUCK,
                [line, *wanting, counts, *errors],
                f"restart {c} (/restart {c}): its autoscaler has not recovered by itself"
                + (
                    "; launches fail on capacity, so also try later or another zone"
                    if snap.failed_launches
                    else ""
                ),
                since=since,
            )
        if snap.alive < snap.min_workers:
            return verdict(
                Verdict.DEGRADED,
                [line, *wanting, counts, *errors],
                "wait for the autoscaler's launches; it is called stuck if this lasts",
            )
        notes = [line, *wanting]
    else:
        notes = wanting
    if snap.alive < snap.min_workers:
        return verdict(
            Verdict.DEGRADED,
            [counts, *notes, *errors],
            "wait for the autoscaler's launches; it is called stuck if this lasts",
        )
    if gone:
        notes.append(f"dead TPU VMs hold quota: {gone} (python -m ops clean-preempted --cluster {c})")
    if "cloud" in snap.errors:
        return verdict(
            Verdict.UNKNOWN,
            [*errors, counts, *notes],
            "the cloud's view is missing: dead TPU VMs cannot be ruled out; check again",
        )
    return verdict(Verdict.HEALTHY, [counts, *notes, *errors])


def _wanting(snap: Snapshot) -> list[str]:
    lines = []
    if snap.demand:
        lines.append(f"pending demand: {'; '.join(snap.demand[:3])}")
    if snap.pending_launches:
        lines.append(
            "launches under way: " + ", ".join(f"{t} x{n}" for t, n in snap.pending_launches.items())
        )
    if snap.failed_launches:
        lines.append(f"launches failing ({len(snap.failed_launches)}): {snap.failed_launches[-1]}")
    return lines


# -- history --------------------------------------------------------------------------------------------
def history_key(cluster_name: str) -> str:
    return f"health/{cluster_name}.json"


def _points(data: bytes) -> list[Point]:
    try:
        return [Point.model_validate(p) for p in json.loads(data)]
    except (ValueError, TypeError):
        return []  # a damaged history starts again; it is a chart, not a ledger


def history(ctx: Context, cluster_name: str, since: datetime) -> list[Point]:
    """The recorded checks of a cluster since `since`, oldest first."""
    got = ctx.store.read(history_key(cluster_name))
    points = _points(got.data) if got is not None else []
    return sorted((p for p in points if p.at >= since), key=lambda p: p.at)


def record(ctx: Context, cluster_name: str, point: Point) -> None:
    """Add a point, dropping those older than `KEEP` before it; compare-and-set, so the bot's checks and
    the CLI's never lose each other's."""
    key = history_key(cluster_name)
    for _ in range(WRITE_TRIES):
        got = ctx.store.read(key)
        points = [
            p for p in (_points(got.data) if got else []) if point.at - KEEP <= p.at and p.at != point.at
        ]
        points = sorted([*points, point], key=lambda p: p.at)
        data = json.dumps([p.model_dump(mode="json") for p in points]).encode()
        try:
            if got is None:
                ctx.store.create(key, data)
            else:
                ctx.store.replace(key, data, got.version)
            return
        except Conflict:
            continue
    raise OpsError(f"the health history of {cluster_name} kept changing under us", "check again")


# -- the checks -----------------------------------------------------------------------------------------
def check(ctx: Context, cluster_name: str, now: datetime | None = None) -> Health:
    """Read both sources (bounded by the cluster's read_timeout_s), record a history point, judge."""
    cluster = ctx.cluster(cluster_name)
    now = now or datetime.now(UTC)
    snap = read(ctx, cluster, now)
    limits = cluster.health
    try:
        past = history(ctx, cluster.name, now - KEEP)
    except Exception as e:  # the store is a source too: without it only the instant is judged
        past, snap.errors["history"] = [], f"{type(e).__name__}: {e}"[:200]
    health = judge(snap, past, limits)
    try:
        record(ctx, cluster.name, Point(at=now, alive=snap.alive, verdict=health.verdict, short=snap.short))
    except Exception as e:
        health.evidence.append(f"history not recorded: {str(e)[:200]}")
    return health


def check_all(ctx: Context, names: list[str] | None = None, now: datetime | None = None) -> list[Health]:
    """Every cluster (or `names`) concurrently, in registry order; one slow cluster delays no other."""
    names = list(ctx.registry.clusters) if names is None else names
    clusters = [ctx.cluster(n) for n in names]  # BadInput on an unknown name, before any read
    now = now or datetime.now(UTC)
    pool = ThreadPoolExecutor(max_workers=max(1, len(clusters)), thread_name_prefix="health")
    try:
        futures = [pool.submit(check, ctx, c.name, now) for c in clusters]
        out = []
        for cluster, future in zip(clusters, futures, strict=True):
            try:
                out.append(future.result())
            except Exception as e:  # never a crash: the cluster is unknown, saying why
                snap = Snapshot(
                    cluster=cluster.name,
                    at=now,
                    min_workers=cluster.min_workers,
                    max_workers=cluster.max_workers,
                    errors={"check": f"{type(e).__name__}: {e}"[:300]},
                )
                out.append(
                    Health(
                        snapshot=snap,
                        verdict=Verdict.UNKNOWN,
                        evidence=[f"check failed: {e}"[:300]],
                        action=f"python -m ops health --cluster {cluster.name} --debug",
                    )
                )
        return out
    finally:
        pool.shutdown(wait=False)
