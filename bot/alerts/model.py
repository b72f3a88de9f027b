"""What the alerts keep in the store (`bot/alerts.json`): streaks, firing alerts, silences, what was
told whom. A bot restart reads it back, so it neither loses a silence nor posts a firing alert again."""

from __future__ import annotations

import re
from datetime import date, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

BOOK_KEY = "bot/alerts.json"


class AlertSettings(BaseModel):
    """The `alerts:` section of the bot config."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    clusters: list[str] = Field(default_factory=list)  # the clusters checked: every registered one if empty
    check_every_min: float = Field(default=5.0, gt=0)
    fire_after: int = Field(default=3, ge=1)  # checks in a row with the same verdict before it fires
    repeat_h: float = Field(default=4.0, gt=0)  # a firing alert (or a due worker) is said again this often
    silence_choices_h: list[int] = Field(default_factory=lambda: [1, 4, 24])
    summary_at: str = "09:00"  # UTC, HH:MM: the daily summary
    chart_h: float = Field(default=24.0, gt=0)  # the summary's chart covers this much history

    @field_validator("summary_at")
    @classmethod
    def _hh_mm(cls, value: str) -> str:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", value)
        if not m or int(m[1]) > 23 or int(m[2]) > 59:
            raise ValueError(f"summary_at must be HH:MM in UTC (was {value!r})")
        return value

    @property
    def summary_hm(self) -> tuple[int, int]:
        h, m = self.summary_at.split(":")
        return int(h), int(m)


class Streak(BaseModel):
    """The same verdict on consecutive checks of one cluster."""

    verdict: str
    count: int = 1
    since: datetime


class Alert(BaseModel):
    """One cluster's problem while it fires: its message, edited as it evolves."""

    cluster: str
    problem: str  # the verdict, e.g. "stuck"
    started_at: datetime  # the first check of the streak that fired it
    fired_at: datetime
    message_id: str | None = None  # None: not posted (silenced since it fired)
    sent_at: datetime | None = None  # last posted (fired or repeated)
    evidence: list[str] = Field(default_factory=list)
    action: str = ""
    preempted: int = 0  # PREEMPTED / TERMINATED VMs in the last snapshot: the Clean button shows

    @property
    def key(self) -> str:
        return alert_key(self.cluster, self.problem)


class Silence(BaseModel):
    until: datetime
    by: str


class Book(BaseModel):
    streaks: dict[str, Streak] = Field(default_factory=dict)  # cluster ->
    firing: dict[str, Alert] = Field(default_factory=dict)  # "cluster:problem" ->
    silences: dict[str, Silence] = Field(default_factory=dict)  # cluster ->
    told: dict[str, datetime] = Field(default_factory=dict)  # "cluster:worker:kind" -> last told
    summary_on: date | None = None  # the last day the daily summary was posted
    last_check: datetime | None = None


def alert_key(cluster: str, problem: str) -> str:
    return f"{cluster}:{problem}"


TARGET = "alert"  # buttons of an alert act on "alert:<cluster>:<problem>"


def target_of(alert: Alert) -> str:
    return f"{TARGET}:{alert.key}"
