"""A cluster's health: one snapshot joining Ray's view and the cloud's, and a verdict with its evidence.

(Contract for the bot's alerts; the readers and the verdict rules are being written.)
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from ops.context import Context


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

    @property
    def alive(self) -> int:
        return sum(self.workers.values())


class Health(BaseModel):
    snapshot: Snapshot
    verdict: Verdict
    evidence: list[str] = Field(default_factory=list)  # what led to the verdict, one fact a line
    action: str = ""  # what to do about it, one line ("" when healthy)


class Point(BaseModel):
    """One check in a cluster's history (the store keeps about a day of them): the chart's data."""

    at: datetime
    alive: int
    verdict: Verdict


def check(ctx: Context, cluster_name: str, now: datetime | None = None) -> Health:
    """Read both sources (bounded by the cluster's read_timeout_s), record a history point, judge."""
    raise NotImplementedError


def check_all(ctx: Context, names: list[str] | None = None, now: datetime | None = None) -> list[Health]:
    """Every cluster (or `names`) concurrently, in registry order; one slow cluster delays no other."""
    raise NotImplementedError


def history(ctx: Context, cluster_name: str, since: datetime) -> list[Point]:
    """The recorded checks of a cluster since `since`, oldest first."""
    raise NotImplementedError
