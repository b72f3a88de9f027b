"""The monitor: checks every cluster on a schedule (APScheduler on the bot's loop), posts and edits the
alerts the rules decide, tells whoever added a worker when it is past its time or idle, posts the
daily summary with its chart, and says on start what it missed while the bot was down.

Everything that reads a cluster or the store runs in a thread; the alerts' state is one object in the
store (`bot/alerts.json`), saved after every change, so a restarted bot picks up its silences and
firing alerts instead of posting them again. Time is the engine's clock: tests drive it and call
`check()` and `summary()` directly; the scheduler only calls them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.alerts import rules
from bot.alerts.chart import workers_chart
from bot.alerts.model import BOOK_KEY, TARGET, Alert, AlertSettings, Book, Silence, target_of
from bot.protocol.engine import Engine
from bot.protocol.model import Button, Message, Reply, User
from ops.health import Health, check_all, history
from ops.locks import current_lock
from ops.store import dump, read_model
from ops.workers import Due, due_workers

log = logging.getLogger("clusterbot.alerts")

ICONS = {"stuck": "🔴", "head-down": "🔴", "token-refused": "🟠", "degraded": "🟠", "churning": "🟠"}


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "less than a minute"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours < 48 else f"{hours // 24} days {hours % 24} h"


class Monitor:
    def __init__(self, engine: Engine, settings: AlertSettings | None = None) -> None:
        self.engine = engine
        self.settings = settings or engine.config.alerts
        self.chat = engine.chat
        self.book = Book()
        self._mutex = asyncio.Lock()  # one check, click or summary changes the book at a time
        self._scheduler: AsyncIOScheduler | None = None
        self.last: list[Health] = []  # the last check's verdicts (the summary uses them)
        engine.targets[TARGET] = self.act

    # -- life cycle -----------------------------------------------------------------------------------
    async def start(self, schedule: bool = True) -> None:
        """Read the book back, say what the bot missed if it was down, and schedule the checks (the first
        one interval from now) and the daily summary."""
        got = await asyncio.to_thread(read_model, self.engine.store, BOOK_KEY, Book)
        if got is not None:
            self.book = got[0]
        if self.engine.down_since is not None:
            await self._say_missed(self.engine.down_since, self.engine.downtime_s)
        if not (schedule and self.settings.enabled):
            return
        s = self.settings
        self._scheduler = AsyncIOScheduler(timezone="UTC")
        every = IntervalTrigger(minutes=s.check_every_min, timezone="UTC")
        self._scheduler.add_job(self.check, every, id="check", coalesce=True, max_instances=1)
        hour, minute = s.summary_hm
        daily = CronTrigger(hour=hour, minute=minute, timezone="UTC")
        self._scheduler.add_job(self.summary, daily, id="summary", coalesce=True, max_instances=1,
                                misfire_grace_time=3600)  # fmt: skip
        self._scheduler.start()

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None

    # -- the check ------------------------------------------------------------------------------------
    async def check(self) -> list[Health]:
        """Check every cluster once: alerts fire, evolve, repeat and resolve; due workers are told."""
        now = self.engine.clock()
        names = None  # every registered cluster, unless the settings name some (unknown names are skipped)
        if self.settings.clusters:
            names = [n for n in self.settings.clusters if n in self.engine.registry.clusters]
            if not names:
                return []
        healths = await asyncio.to_thread(check_all, self.engine.ctx, names, now)
        locks = await asyncio.gather(
            *(asyncio.to_thread(current_lock, self.engine.store, h.snapshot.cluster) for h in healths)
        )
        async with self._mutex:
            changes = rules.expire_silences(self.book, now)
            for health, lock in zip(healths, locks, strict=True):
                changes += rules.judge(self.book, health, lock is not None, now, self.settings)
            self.book.last_check = now
            for change in changes:
                await self._apply(change, now)
            await self._save()
        self.last = healths
        await self._tell_due(now, [h.snapshot.cluster for h in healths])
        return healths

    async def _apply(self, change: rules.Change, now: datetime) -> None:
        alert = change.alert
        try:
            if change.kind == "post":
                alert.message_id = await self.chat.post(self._message(alert))
                alert.sent_at = now
            elif change.kind == "repost":
                if alert.message_id is not None:
                    said = Message(self._text(alert) + "\n(said again below)")
                    await self.chat.edit(alert.message_id, said)
                alert.message_id = await self.chat.post(self._message(alert))
                alert.sent_at = now
            elif change.kind == "edit" and alert.message_id is not None:
                await self.chat.edit(alert.message_id, self._message(alert))
            elif change.kind == "resolve" and alert.message_id is not None:
                lasted = _ago((now - alert.started_at).total_seconds())
                line = f"✅ resolved: {alert.cluster} was {alert.problem} for {lasted}"
                await self.chat.edit(alert.message_id, Message(f"{line}\n~~{self._text(alert)}~~"))
                where = self.chat.link(alert.message_id)
                await self.chat.post(Message(f"{line}" + (f" ({where})" if where else "")))
        except Exception:  # the chat is down: the book keeps the state, the next check tries again
            log.exception("could not %s the %s alert of %s", change.kind, alert.problem, alert.cluster)

    def _text(self, alert: Alert) -> str:
        lines = [
            f"{ICONS.get(alert.problem, '⚪')} {alert.cluster} is {alert.problem} "
            f"(since {self.chat.when(alert.started_at)})"
        ]
        lines += [f"- {e}" for e in alert.evidence]
        if alert.action:
            lines.append(f"action: {alert.action}")
        silence = self.book.silences.get(alert.cluster)
        if silence is not None:
            lines.append(f"silenced until {self.chat.when(silence.until)} by {silence.by}")
        return "\n".join(lines)

    def _message(self, alert: Alert) -> Message:
        buttons = [Button("restart", "Restart", "danger")]
        if alert.preempted:
            buttons.append(Button("clean", f"Clean {alert.preempted} preempted TPUs", "primary"))
        buttons += [Button("silence", f"Silence {h} h", arg=f"{h}h") for h in self.settings.silence_choices_h]
        return Message(self._text(alert), buttons=buttons, op_id=target_of(alert))

    # -- buttons ---------------------------------------------------------------------------------------
    async def act(self, user: User, target: str, action: str, arg: str = "") -> Reply:
        """A click on an alert: Restart and Clean start those operations (their own rights and
        ceremony); Silence holds the cluster's alerts for the hours chosen."""
        _, _, key = target.partition(":")
        cluster, _, problem = key.partition(":")
        if cluster not in self.engine.registry.clusters:
            return Reply(f"no alert {target}", ok=False)
        if action == "restart":  # the full protocol: its owners are asked as always
            protected = self.engine.registry.clusters[cluster].protected
            if protected and not self.engine.is_admin(user):
                return Reply(f"{cluster} is protected: only an admin's click (an override) restarts it",
                             ok=False)  # fmt: skip
            params = {"override": True} if protected else {}
            return await self.engine.request(user, "restart", cluster, params)
        if action == "clean":
            return await self.engine.request(user, "clean-preempted", cluster, {})
        if action != "silence":
            return Reply(f"an alert has no {action!r} button", ok=False)
        choices = {f"{h}h": h for h in self.settings.silence_choices_h}
        if arg not in choices:
            return Reply(f"silence for {' or '.join(choices)}", ok=False)
        refused = self.engine.allowed(user, "silence", cluster)
        if refused:
            return Reply(refused, ok=False)
        until = self.engine.clock() + timedelta(hours=choices[arg])
        async with self._mutex:
            self.book.silences[cluster] = Silence(until=until, by=user.name)
            for alert in [a for a in self.book.firing.values() if a.cluster == cluster and a.message_id]:
                await self._apply(rules.Change("edit", alert), self.engine.clock())
            await self._save()
        return Reply(f"{cluster}'s alerts are silenced until {self.chat.when(until)}", ephemeral=False)

    # -- workers past their time or idle (issue: add-worker) -----------------------------------------------
    async def _tell_due(self, now: datetime, clusters: list[str]) -> None:
        """One message per due worker, to whoever added it, again every repeat_h while it stays due."""
        for cluster in clusters:
            try:
                due = await asyncio.to_thread(due_workers, self.engine.ctx, cluster, now)
            except Exception:
                log.exception("could not read the workers of %s", cluster)
                continue
            for d in due:
                key = f"{d.cluster}:{d.qr_id}:{d.kind}"
                told = self.book.told.get(key)
                if told is not None and now - told < timedelta(hours=self.settings.repeat_h):
                    continue
                try:
                    await self.chat.post(self._due_message(d))
                except Exception:
                    log.exception("could not tell about the worker %s", d.qr_id)
                    continue
                async with self._mutex:
                    self.book.told[key] = now
                    await self._save()

    def _due_message(self, d: Due) -> Message:
        who = d.added_by_chat or self.engine.owner_to_chat(d.added_by)
        to = self.chat.mention(who) if who else d.added_by
        return Message(
            f"{to}: your {d.accelerator_type} worker `{d.qr_id}` on {d.cluster} is {d.why}. Nothing is "
            f"deleted by itself: if it is no longer needed, delete it (`python -m ops workers --cluster "
            f"{d.cluster}` shows it).",
            mentions=[who] if who else [],
        )

    # -- the daily summary -----------------------------------------------------------------------------
    async def summary(self) -> None:
        """Every cluster in one message: the table, and the chart of alive workers over `chart_h`."""
        from ops.render import render_summary

        now = self.engine.clock()
        healths = self.last or await self.check()
        start = now - timedelta(hours=self.settings.chart_h)
        registry = self.engine.registry

        def chart() -> bytes:
            series = {
                h.snapshot.cluster: (
                    history(self.engine.ctx, h.snapshot.cluster, start),
                    registry.clusters[h.snapshot.cluster].min_workers,
                )
                for h in healths
            }
            return workers_chart(series, start, now)

        png = await asyncio.to_thread(chart)
        text = f"daily summary, {now:%Y-%m-%d %H:%M} UTC\n```\n{render_summary(healths)}\n```"
        await self.chat.post(Message(text, files=[(f"workers-{now:%Y%m%d}.png", png)]))
        async with self._mutex:
            self.book.summary_on = now.date()
            await self._save()

    # -- /health ---------------------------------------------------------------------------------------
    async def health(self, cluster: str | None = None) -> Reply:
        """The same snapshot the alerts judge, now, for one cluster or all."""
        from ops.render import render_health

        names = [cluster] if cluster else None
        if cluster is not None and cluster not in self.engine.registry.clusters:
            valid = ", ".join(self.engine.registry.clusters)
            return Reply(f"unknown cluster {cluster!r}; valid: {valid}", ok=False)
        healths = await asyncio.to_thread(check_all, self.engine.ctx, names, self.engine.clock())
        return Reply("\n\n".join(render_health(h) for h in healths), ephemeral=False)

    # -- after a downtime ---------------------------------------------------------------------------------
    async def _say_missed(self, since: datetime, downtime_s: float) -> None:
        now = self.engine.clock()
        checks = int(downtime_s // (self.settings.check_every_min * 60)) if self.settings.enabled else 0
        missed = [f"{checks} health check{'s' if checks > 1 else ''}"] if checks else []
        hour, minute = self.settings.summary_hm
        due = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if due > now:
            due -= timedelta(days=1)
        summary_missed = since < due <= now and self.book.summary_on != due.date()
        if summary_missed:
            missed.append(f"the {self.settings.summary_at} UTC summary (posted now)")
        firing = [f"{a.cluster} {a.problem}" for a in self.book.firing.values()]
        text = (
            f"clusterbot was down for {_ago(downtime_s)} (since {since:%Y-%m-%d %H:%M} UTC)"
            + (f": it missed {', '.join(missed)}." if missed else ".")
            + " Operations open then are picked up again; clicks meanwhile went unanswered."
            + (f" Alerts firing before: {', '.join(firing)}." if firing else "")
        )
        try:
            await self.chat.post(Message(text))
            if summary_missed and self.settings.enabled:
                await self.summary()
        except Exception:
            log.exception("could not say what the bot missed")

    # -- the store -------------------------------------------------------------------------------------
    async def _save(self) -> None:
        """Write the book (the bot is its only writer); a failed write is logged, and the next change
        writes the whole book again."""
        try:
            await asyncio.to_thread(self.engine.store.put, BOOK_KEY, dump(self.book))
        except Exception:
            log.exception("could not write %s", BOOK_KEY)
