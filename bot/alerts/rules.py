"""Alertmanager's semantics as one pure function: a check's verdict in, what to post and edit out.

- A problem fires after `fire_after` checks in a row with that verdict; one message per cluster and
  problem. A verdict that waits for its condition to last (stuck) counts the checks since the condition
  began, so a stuck cluster is told within the threshold plus one interval.
- While it fires: its message is edited when the evidence changes; posted again every `repeat_h`.
- It resolves when a check gives another verdict (a resolved message, the buttons go). `unknown`
  (a source could not be read) resolves nothing: not knowing is not being well.
- A silence (per cluster) holds its alerts' posts and repeats; an alert that fired under it is posted
  when the silence ends, if it still fires. Silences end by themselves at their time.
- Nothing is judged while an operation holds the cluster's lock (a restart makes a cluster look dead);
  the streak starts again after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.alerts.model import Alert, AlertSettings, Book, Streak, alert_key
from ops.health import Health, Verdict

Kind = Literal["post", "edit", "repost", "resolve"]


@dataclass(frozen=True)
class Change:
    """`post`: a new alert message; `edit`: its message changed (evidence, silence); `repost`: said
    again (repeat, or a silence ended); `resolve`: it cleared (edited, and a resolved message posted)."""

    kind: Kind
    alert: Alert


def silenced(book: Book, cluster: str, now: datetime) -> bool:
    s = book.silences.get(cluster)
    return s is not None and s.until > now


def expire_silences(book: Book, now: datetime) -> list[Change]:
    """Silences past their time go: their alerts' messages lose the silence line (one that fired
    unseen is posted by the next check that still finds it, in `judge`)."""
    out: list[Change] = []
    for cluster in [c for c, s in book.silences.items() if s.until <= now]:
        del book.silences[cluster]
        out += [Change("edit", a) for a in book.firing.values() if a.cluster == cluster and a.message_id]
    return out


def judge(book: Book, health: Health, locked: bool, now: datetime, settings: AlertSettings) -> list[Change]:
    """Apply one cluster's check to `book` (changed in place); the messages to post or edit."""
    cluster = health.snapshot.cluster
    if locked:
        book.streaks.pop(cluster, None)
        return []
    verdict = health.verdict.value
    streak = book.streaks.get(cluster)
    if streak is not None and streak.verdict == verdict:
        streak.count += 1
    else:
        streak = book.streaks[cluster] = Streak(verdict=verdict, since=now)
    if health.since is not None and health.since < streak.since:
        # The verdict waited for its condition to last (stuck: short of workers for the threshold): it
        # has held for as many checks as fit since the condition began, so it fires within the
        # threshold plus one interval, not two intervals later.
        interval = timedelta(minutes=settings.check_every_min)
        streak.since = health.since
        streak.count = max(streak.count, int((now - health.since) / interval) + 1)
    out: list[Change] = []
    if health.verdict != Verdict.UNKNOWN:
        for alert in [a for a in book.firing.values() if a.cluster == cluster and a.problem != verdict]:
            del book.firing[alert.key]
            out.append(Change("resolve", alert))
    if health.verdict == Verdict.HEALTHY:
        return out
    quiet = silenced(book, cluster, now)
    key = alert_key(cluster, verdict)
    alert = book.firing.get(key)
    facts = {
        "evidence": list(health.evidence),
        "action": health.action,
        "preempted": len(health.snapshot.preempted),
    }
    if alert is None:
        if streak.count < settings.fire_after:
            return out
        alert = Alert(cluster=cluster, problem=verdict, started_at=streak.since, fired_at=now, **facts)
        book.firing[key] = alert
        if not quiet:
            out.append(Change("post", alert))
        return out
    changed = any(getattr(alert, k) != v for k, v in facts.items())
    for k, v in facts.items():
        setattr(alert, k, v)
    due = alert.sent_at is None or now - alert.sent_at >= timedelta(hours=settings.repeat_h)
    if not quiet and due:
        out.append(Change("repost", alert))
    elif changed and alert.message_id is not None:
        out.append(Change("edit", alert))
    return out
