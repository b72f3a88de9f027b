"""Alertmanager's semantics in bot/alerts/rules.py, on checks made up here (pure logic): a streak
fires once, the message evolves, repeats every 4 h, resolves; `unknown` resolves nothing; a held lock
suspends judging; a silence holds the posts and ends by itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.alerts.model import AlertSettings, Book, Silence
from bot.alerts.rules import expire_silences, judge
from ops.health import Health, Snapshot, Verdict

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
EVERY = timedelta(minutes=5)
S = AlertSettings()


def health(verdict: Verdict, evidence: str = "head only since 08:20", preempted: int = 0) -> Health:
    snap = Snapshot(cluster="us-central2", at=T0, preempted=[f"vm-{i}" for i in range(preempted)])
    return Health(snapshot=snap, verdict=verdict, evidence=[evidence], action="restart it")


def run(book: Book, verdicts: list[Health], start: datetime = T0, locked: bool = False) -> list[list[str]]:
    """The kinds of change each check gives."""
    out = []
    for i, h in enumerate(verdicts):
        now = start + i * EVERY
        changes = expire_silences(book, now) + judge(book, h, locked, now, S)
        for c in changes:  # what the monitor does on a post
            if c.kind in ("post", "repost"):
                c.alert.message_id, c.alert.sent_at = "m", now
        out.append([c.kind for c in changes])
    return out


def test_a_verdict_fires_after_three_checks_in_a_row_once() -> None:
    book = Book()
    assert run(book, [health(Verdict.STUCK)] * 5) == [[], [], ["post"], [], []]
    [alert] = book.firing.values()
    assert alert.started_at == T0 and alert.fired_at == T0 + 2 * EVERY


def test_a_broken_streak_starts_again() -> None:
    book = Book()
    checks = [health(Verdict.STUCK), health(Verdict.STUCK), health(Verdict.DEGRADED), health(Verdict.STUCK)]
    assert run(book, checks) == [[], [], [], []]
    assert book.firing == {}


def test_changed_evidence_edits_the_one_message_and_a_healthy_check_resolves_it() -> None:
    book = Book()
    kinds = run(book, [health(Verdict.STUCK)] * 3 + [health(Verdict.STUCK, "launches failing: 4")]
                + [health(Verdict.HEALTHY)])  # fmt: skip
    assert kinds == [[], [], ["post"], ["edit"], ["resolve"]]
    assert book.firing == {}


def test_a_firing_alert_is_said_again_every_4_hours() -> None:
    book = Book()
    run(book, [health(Verdict.STUCK)] * 3)
    later = T0 + 2 * EVERY + timedelta(hours=4) - timedelta(minutes=1)
    assert run(book, [health(Verdict.STUCK)], later) == [[]]
    assert run(book, [health(Verdict.STUCK)], later + timedelta(minutes=1)) == [["repost"]]


def test_unknown_resolves_nothing_and_fires_on_its_own_streak() -> None:
    book = Book()
    run(book, [health(Verdict.STUCK)] * 3)
    kinds = run(book, [health(Verdict.UNKNOWN)] * 3, T0 + timedelta(hours=1))
    assert kinds == [[], [], ["post"]]
    assert sorted(book.firing) == ["us-central2:stuck", "us-central2:unknown"]


def test_another_problem_resolves_the_first() -> None:
    book = Book()
    run(book, [health(Verdict.STUCK)] * 3)
    assert run(book, [health(Verdict.HEAD_DOWN)] * 3, T0 + timedelta(hours=1)) == [["resolve"], [], ["post"]]
    assert list(book.firing) == ["us-central2:head-down"]


def test_nothing_is_judged_while_the_lock_is_held_and_the_streak_starts_again() -> None:
    book = Book()
    run(book, [health(Verdict.STUCK)] * 2)
    assert run(book, [health(Verdict.HEAD_DOWN)] * 5, T0 + timedelta(hours=1), locked=True) == [[]] * 5
    assert run(book, [health(Verdict.STUCK)] * 2, T0 + timedelta(hours=2)) == [[], []]  # not 3 in a row
    assert book.firing == {}


def test_a_silence_holds_the_post_and_its_end_posts_what_still_fires() -> None:
    book = Book()
    book.silences["us-central2"] = Silence(until=T0 + timedelta(minutes=30), by="bob")
    kinds = run(book, [health(Verdict.STUCK)] * 8)
    assert kinds == [[], [], [], [], [], [], ["repost"], []]  # fired at 09:10 unseen, posted at 09:30
    assert book.silences == {}


def test_an_alert_that_clears_under_its_silence_is_never_posted() -> None:
    book = Book()
    book.silences["us-central2"] = Silence(until=T0 + timedelta(hours=1), by="bob")
    run(book, [health(Verdict.STUCK)] * 3 + [health(Verdict.HEALTHY)])
    assert book.firing == {}


def test_the_end_of_a_silence_edits_the_message_it_marked() -> None:
    book = Book()
    run(book, [health(Verdict.STUCK)] * 3)
    book.silences["us-central2"] = Silence(until=T0 + timedelta(minutes=20), by="bob")
    kinds = run(book, [health(Verdict.STUCK)] * 3, T0 + timedelta(minutes=15))
    assert kinds == [[], ["edit"], []] and book.silences == {}


def test_stuck_counts_its_streak_from_when_the_cluster_became_short() -> None:
    """Stuck already means "short for 30 min": it fires on its first check, within threshold + interval."""
    book = Book()
    short_since = T0 - timedelta(minutes=31)
    stuck = health(Verdict.STUCK).model_copy(update={"since": short_since})
    assert run(book, [stuck]) == [["post"]]
    [alert] = book.firing.values()
    assert alert.started_at == short_since
