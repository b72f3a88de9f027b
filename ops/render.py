"""Plain-text rendering of ops results, shared by the CLI and the chat adapters."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ops.jobs import Job
from ops.status import StatusReport


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def render_jobs(jobs: list[Job]) -> str:
    if not jobs:
        return "no running or pending jobs"
    now = time.time()
    rows = [("OWNER", "STATUS", "AGE", "SUBMISSION ID", "ENTRYPOINT")]
    for j in jobs:
        owner = j.owner_label + ("" if j.owner_source == "metadata" else f" ({j.owner_source})")
        entry = j.entrypoint if len(j.entrypoint) <= 60 else j.entrypoint[:57] + "..."
        rows.append((owner, j.status, _age(j.age_s(now)), j.submission_id, entry))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
                     for r in rows)  # fmt: skip


def owners_line(jobs: list[Job]) -> str:
    counts = Counter(j.owner_label for j in jobs)
    return ", ".join(f"{o}: {n}" for o, n in counts.most_common()) or "none"


def render_status(s: StatusReport) -> str:
    if not s.head_up:
        head = f"head: not reached ({s.note or 'the dashboard does not answer'})"  # unreachable is not dead
    else:
        head = "head: up"
    alive = sum(s.workers.values())
    by_type = ", ".join(f"{t}: {n}" for t, n in sorted(s.workers.items())) or "none"
    lines = [f"{s.cluster}  {head}"]
    if s.head_up:
        lines += [
            f"workers: {alive} alive ({by_type}), min {s.min_workers}, max {s.max_workers}"
            + (f", {s.dead_workers} dead" if s.dead_workers else ""),
            f"jobs: {sum(1 for j in s.jobs if j.status == 'RUNNING')} running, "
            f"{sum(1 for j in s.jobs if j.status == 'PENDING')} pending; by owner: {owners_line(s.jobs)}",
        ]
    else:  # nothing read is not nothing there: its jobs may be running
        lines.append(f"workers and jobs: not known (min {s.min_workers}, max {s.max_workers} workers)")
    lines.append(f"operation in progress: {s.operation or 'none'}")
    return "\n".join(lines)


def render_plan(plan: Any) -> str:
    lines = [
        f"restart {plan.cluster}, asked by {plan.caller}; jobs "
        + ("backed up and resubmitted" if plan.preserve_jobs else "stopped and NOT resubmitted"),
        f"{len(plan.jobs)} running or pending job(s) will be stopped; by owner: {owners_line(plan.jobs)}",
    ]
    if plan.jobs:
        lines.append(render_jobs(plan.jobs))
    if plan.preserve_jobs and plan.jobs:
        lines.append(f"each will be resubmitted once after the restart, owner kept ({len(plan.jobs)} job(s))")
    lines += [f"note: {n}" for n in plan.notes]
    if plan.unbacked:
        lines.append("WARNING: jobs will NOT be backed up (forced)")
    return "\n".join(lines)


def render_restart(r: Any) -> str:
    lines = [f"restart {r.op_id} of {r.cluster}: {r.step.value} in {r.total_s:.1f}s"]
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in r.durations.items())
    if phases:
        lines.append(f"phases: {phases}")
    ok = [x for x in r.resubmitted if x.status == "submitted"]
    if r.preserve_jobs:
        lines.append(f"resubmitted {len(ok)}/{len(r.resubmitted)} job(s):")
    lines += [f"  {x.owner or 'unknown'}: {x.old_id} -> {x.new_id}" for x in ok]
    lines += [f"  FAILED {x.owner or 'unknown'}: {x.old_id}: {x.error}" for x in r.resubmitted
              if x.status != "submitted"]  # fmt: skip
    lines += [f"left out (not resubmitted) on {who}'s word: {sid}" for sid, who in r.left_out.items()]
    lines += [f"reserved worker {w}" for w in r.workers]
    if r.unbacked:
        lines.append("jobs were NOT backed up: the head did not answer and an admin forced the restart")
    lines += [f"not preserved: {n}" for n in r.not_preserved]
    return "\n".join(lines)


def render_health(h: Any) -> str:
    """One cluster's verdict, its evidence and the action (ops.health.Health)."""
    s = h.snapshot
    counts = f"{s.alive} alive, min {s.min_workers}, max {s.max_workers}"
    when = f"checked {s.at:%Y-%m-%d %H:%M} UTC in {s.seconds:.1f}s"
    lines = [f"{s.cluster}: {h.verdict.value.upper()}  ({counts}; {when})"]
    lines += [f"  - {line}" for line in h.evidence]
    if h.action:
        lines.append(f"  action: {h.action}")
    return "\n".join(lines)


def render_summary(healths: list[Any]) -> str:
    """A compact table of every cluster (the bot's daily summary): verdict, workers alive/min/max,
    preempted VMs, pending demand, running jobs."""
    rows = [("CLUSTER", "VERDICT", "WORKERS", "PREEMPTED", "DEMAND", "JOBS")]
    for h in healths:
        s = h.snapshot
        unread = "?" if s.errors.get("ray") or s.reach != "ok" else None
        rows.append(
            (
                s.cluster,
                h.verdict.value,
                f"{unread or s.alive}/{s.min_workers}/{s.max_workers}",
                "?" if "cloud" in s.errors else str(len(s.preempted)),
                unread or str(len(s.demand)),
                unread or str(s.running_jobs),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
