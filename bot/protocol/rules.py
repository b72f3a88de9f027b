"""The protocol's rules as pure functions of an operation and the time: who may click what, what a
click changes, when consent is reached, and how an operation reads in the channel.

What is particular to one kind of operation (its title, its lines, an extra answer for owners) comes in
its `Texts`; the defaults (`PLAIN`) are those of an operation that declares none."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from bot.config import Windows
from bot.protocol.model import PLAIN, Affected, Button, Operation, State, Texts, User, Vote

ACTIONS = ("confirm", "ok", "delay", "object", "skip", "cancel", "override")


def consent(op: Operation, now: datetime) -> tuple[bool, str]:
    """Whether the affected owners' consent is reached, and why (or why not)."""
    if op.overridden_by:
        return True, f"admin override by {op.overridden_by}"
    objecting = [a for a in op.affected.values() if a.vote == Vote.OBJECT]
    if objecting:
        return False, "objection by " + ", ".join(", ".join(a.owners) for a in objecting)
    if op.not_before and now < op.not_before:
        return False, "delayed for a checkpoint"
    if not op.affected and not op.unreachable_jobs:
        return True, "no other users' jobs"
    answered = all(a.vote in (Vote.OK, Vote.DELAY, Vote.SKIP) for a in op.affected.values())
    if answered and not op.unreachable_jobs:
        return True, "every affected owner agreed"
    if op.consent_deadline and now >= op.consent_deadline:
        return True, "the consent window passed with no objection"
    return False, "waiting for the affected owners"


def ready_for_grace(op: Operation, now: datetime) -> bool:
    return op.state == State.AWAITING and op.confirmed and consent(op, now)[0]


def refusal(op: Operation, user: User, action: str, is_admin: bool, texts: Texts = PLAIN) -> str | None:
    """Why `user` may not do `action` on `op` now, or None when they may."""
    if action not in ACTIONS:
        return f"unknown action {action!r}; valid: {', '.join(ACTIONS)}"
    if not op.open or op.state == State.EXECUTING:
        return f"operation {op.op_id} is {op.state.value}: nothing to {action} any more"
    if action == "cancel":
        if user.id != op.requester.id and not is_admin:
            return f"only {op.requester.name} (who asked) or an admin can cancel"
        return None
    if op.state != State.AWAITING:
        return f"operation {op.op_id} is counting down: only cancel is possible now"
    if action == "confirm" and user.id != op.requester.id:
        return f"only {op.requester.name} (who asked) can confirm"
    if action in ("ok", "delay", "object", "skip") and user.id not in op.affected:
        return "only people whose jobs this stops can answer for them"
    if action == "skip" and not _leave_out(op, texts):
        return f"{texts.title(op)} has no such answer: OK, Delay or Object"
    if action == "override" and not is_admin:
        return "only an admin can override"
    return None


def apply(
    op: Operation, user: User, action: str, arg: str, now: datetime, windows: Windows, texts: Texts = PLAIN
) -> tuple[Operation, str]:
    """The operation after `user` did `action` (already allowed), and the reply to them.

    Idempotent: doing the same thing twice changes nothing the second time and says so."""
    op = op.model_copy(deep=True)
    if action == "confirm":
        if op.confirmed:
            return op, "already confirmed"
        op.confirmed = True
        return op, "confirmed"
    if action == "cancel":
        op.state = State.CANCELLED
        op.cancelled_by = user.name
        return op, f"cancelled {op.op_id}"
    if action == "override":
        if op.overridden_by:
            return op, f"already overridden by {op.overridden_by}"
        op.overridden_by = user.name
        return op, "consent overridden"
    affected = op.affected[user.id]
    if action == "skip":  # allowed only where offered (refusal)
        leave_out = texts.leave_out
        assert leave_out is not None
        if affected.vote == Vote.SKIP:
            return op, leave_out.again
        affected.vote = Vote.SKIP
        op.skip_resubmit.update({sid: user.name for sid in affected.job_ids})
        return op, leave_out.reply.format(jobs=_jobs(len(affected.job_ids)))
    for sid in affected.job_ids:  # any other answer takes a "leave mine out" back
        op.skip_resubmit.pop(sid, None)
    if action == "ok":
        if affected.vote == Vote.OK:
            return op, "already counted: OK"
        was = affected.vote
        affected.vote = Vote.OK
        return op, "objection withdrawn: OK counted" if was == Vote.OBJECT else "OK counted"
    if action == "object":
        if affected.vote == Vote.OBJECT:
            return op, "already counted: objection"
        affected.vote = Vote.OBJECT
        return op, "objection counted: nothing happens until you withdraw it (OK) or an admin overrides"
    # delay
    try:
        minutes = int(arg)
    except ValueError:
        return op, f"delay needs minutes, one of {windows.delay_choices_min}"
    if minutes not in windows.delay_choices_min:
        return op, f"delay needs minutes, one of {windows.delay_choices_min}"
    left = windows.max_delay_s - op.delay_total_s
    if minutes * 60 > left:
        return (
            op,
            f"at most {windows.max_delay_s / 60:.0f} min of delay in total; {max(left, 0) / 60:.0f} min left",
        )
    op.delay_total_s += minutes * 60
    start = max(op.not_before or now, now)
    op.not_before = start + timedelta(minutes=minutes)
    affected.vote = Vote.DELAY
    affected.delay_min += minutes
    return op, f"delayed by {minutes} min for your checkpoint"


def extend(op: Operation, seconds: float) -> Operation:
    """Windows extended by time the bot could not hear anyone: silence while down is not consent."""
    op = op.model_copy(deep=True)
    delta = timedelta(seconds=seconds)
    for name in ("confirm_deadline", "consent_deadline", "grace_deadline"):
        value = getattr(op, name)
        if value is not None:
            setattr(op, name, value + delta)
    op.downtime_s += seconds
    return op


def _leave_out(op: Operation, texts: Texts) -> bool:
    return texts.leave_out is not None and texts.leave_out.offered(op)


def buttons(op: Operation, windows: Windows, texts: Texts = PLAIN) -> list[Button]:
    if op.state == State.AWAITING:
        out = [Button("confirm", "Confirm", "primary")]
        if op.affected:
            out += [Button("ok", "OK", "success")]
            out += [Button("delay", f"Delay {m} min", "secondary", str(m)) for m in windows.delay_choices_min]
            out += [Button("object", "Object", "danger")]
            if texts.leave_out is not None and texts.leave_out.offered(op):
                out += [Button("skip", texts.leave_out.label, "secondary")]
        out += [Button("cancel", "Cancel", "secondary"), Button("override", "Override (admin)", "danger")]
        return out
    if op.state == State.GRACE:
        return [Button("cancel", "Cancel", "danger")]
    return []


def render(
    op: Operation,
    now: datetime,
    mention: Callable[[str], str],
    when: Callable[[datetime | None], str],
    texts: Texts = PLAIN,
) -> str:
    """The announcement / status message of an operation, as it reads now."""
    lines = [f"**{op.requester.name}** asks to **{texts.title(op)}** (`{op.op_id}`)"]
    jobs = f"{op.jobs_total} running or pending job(s) on {op.cluster}"
    if op.jobs_total:
        owners = [f"{mention(a.chat_id)}: {_jobs(a.jobs)}, {answer(a, texts)}" for a in op.affected.values()]
        if op.unreachable_jobs:
            who = ", ".join(op.unreachable_owners)
            owners.append(f"{op.unreachable_jobs} of owners nobody can ask ({who})")
        own = op.jobs_total - sum(a.jobs for a in op.affected.values()) - op.unreachable_jobs
        if own:
            owners.append(f"{own} of {op.requester.name}'s own")
        jobs += ": " + "; ".join(owners)
    if op.cluster is not None or op.jobs_total:  # an operation on no cluster has no jobs to speak of
        lines.append(jobs)
    lines += [f"note: {n}" for n in op.notes]
    lines += texts.lines(op)
    if op.state == State.AWAITING:
        lines.append(
            f"{op.requester.name} confirmed" if op.confirmed
            else f"waiting for {op.requester.name} to Confirm (expires {when(op.confirm_deadline)})"
        )  # fmt: skip
        reached, why = consent(op, now)
        if op.affected or op.unreachable_jobs:
            lines.append(
                f"consent: {why}" + ("" if reached else f"; lazy consent {when(op.consent_deadline)}")
            )
        if op.not_before and now < op.not_before:
            lines.append(
                f"delayed until {when(op.not_before)} ({op.delay_total_s / 60:.0f} min asked in total)"
            )
        if op.overridden_by:
            lines.append(f"consent overridden by admin {op.overridden_by}")
    elif op.state == State.GRACE:
        lines.append(
            f"consent reached ({consent(op, now)[1]}); starting {when(op.grace_deadline)} unless cancelled"
        )
    elif op.state == State.EXECUTING:
        lines.append("executing…")
    elif op.state == State.CANCELLED:
        lines.append(f"cancelled by {op.cancelled_by}; nothing was done")
    elif op.state == State.EXPIRED:
        lines.append(f"expired: {op.requester.name} did not confirm in time; nothing was done")
    if op.downtime_s:
        lines.append(f"(the bot was down {op.downtime_s:.0f}s: the windows were extended by that)")
    lines += [f"› {p}" for p in op.progress[-8:]]
    if op.result:
        lines.append(op.result)
    if op.error:
        lines.append(f"**failed**: {op.error}")
    return "\n".join(lines)


def _jobs(n: int) -> str:
    return f"{n} job" + ("" if n == 1 else "s")


def answer(a: Affected, texts: Texts = PLAIN) -> str:
    """What an affected owner answered, as a vote (not to be read as a job's state)."""
    if a.vote == Vote.DELAY:
        return f"delayed {a.delay_min} min"
    if a.vote == Vote.SKIP:
        return texts.leave_out.answer if texts.leave_out else "OK, leave mine out"
    return {Vote.PENDING: "not answered yet", Vote.OK: "OK", Vote.OBJECT: "objects"}[a.vote]
