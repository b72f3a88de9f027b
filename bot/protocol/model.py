"""The protocol's data: users, operations, votes and states, as persisted in the store; and `Spec`, the
plug-in an operation is (its parameters, ceremony, lease, look, execution and texts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from bot.protocol.engine import Engine
    from ops.locks import Lease
    from ops.registry import Cluster


class User(BaseModel):
    """A chat user as the engine sees them: a stable id, a display name, role names."""

    id: str
    name: str
    roles: list[str] = Field(default_factory=list)


class State(StrEnum):
    AWAITING = "awaiting"  # announced: waiting for the requester's Confirm and the owners' consent
    GRACE = "grace"  # consent given: counting down, still cancellable
    EXECUTING = "executing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TERMINAL = frozenset({State.DONE, State.FAILED, State.CANCELLED, State.EXPIRED})


class Vote(StrEnum):
    PENDING = "pending"
    OK = "ok"
    DELAY = "delay"
    OBJECT = "object"
    SKIP = "skip"  # OK, but leave my jobs out (the operation's `LeaveOut` answer, e.g. not resubmitted)


class Affected(BaseModel):
    """A chat user whose jobs the operation would stop: asked for consent."""

    chat_id: str
    owners: list[str]  # the Ray job owners that map to this chat user
    jobs: int
    job_ids: list[str] = Field(default_factory=list)  # their jobs seen at the announcement
    vote: Vote = Vote.PENDING
    delay_min: int = 0  # minutes of delay this owner asked for, in total


class Operation(BaseModel):
    op_id: str
    kind: str
    cluster: str | None  # None: an operation on no cluster (build-image)
    requester: User
    params: dict[str, Any] = Field(default_factory=dict)
    state: State = State.AWAITING
    created_at: datetime
    confirmed: bool = False
    affected: dict[str, Affected] = Field(default_factory=dict)  # chat id -> affected owner
    unreachable_jobs: int = 0  # jobs whose owner is unknown or has no chat user: nobody to ask
    unreachable_owners: list[str] = Field(default_factory=list)
    jobs_total: int = 0
    job_ids: list[str] = Field(default_factory=list)  # the jobs seen at the announcement
    notes: list[str] = Field(default_factory=list)  # what the look before acting could not see
    confirm_deadline: datetime | None = None
    consent_deadline: datetime | None = None
    not_before: datetime | None = None  # owners' delays to checkpoint
    delay_total_s: float = 0.0
    grace_deadline: datetime | None = None
    overridden_by: str | None = None
    cancelled_by: str | None = None
    message_id: str | None = None  # the announcement, edited as the operation goes
    progress: list[str] = Field(default_factory=list)
    result: str | None = None
    error: str | None = None
    unbacked: bool = False  # the head does not answer and an admin forced it: jobs are NOT backed up
    # job id -> chat name of the owner who answered "leave mine out" (the operation's `LeaveOut`)
    skip_resubmit: dict[str, str] = Field(default_factory=dict)
    downtime_s: float = 0.0  # time the bot was down while this was open (windows extended by it)

    @property
    def open(self) -> bool:
        return self.state not in TERMINAL


@dataclass(frozen=True)
class Button:
    """A button on the announcement; adapters build `custom_id`s from `action`, `arg` and the op id."""

    action: str
    label: str
    style: str = "secondary"  # primary | success | danger | secondary
    arg: str = ""


@dataclass
class Reply:
    """What the engine answers the person who asked or clicked."""

    text: str
    ephemeral: bool = True
    ok: bool = True


@dataclass
class Message:
    """A channel message the engine posts or edits: text, buttons, and whom to notify."""

    text: str
    buttons: list[Button] = field(default_factory=list)
    mentions: list[str] = field(default_factory=list)  # chat ids to notify (only new messages notify)
    op_id: str | None = None  # the operation it shows: what its buttons act on
    files: list[tuple[str, bytes]] = field(default_factory=list)  # attachments: (file name, content)


# -- the operation plug-in -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdminOnly:
    """Marks a parameter only admins may set (to other than its default): `Annotated[bool, AdminOnly(why)]`.
    The engine refuses anyone else with `why`."""

    why: str


class Params(BaseModel):
    """The parameters of an operation that takes no cluster; every operation's model extends it.
    Unknown names are bad input, so a typo never silently falls back to a default."""

    model_config = ConfigDict(extra="forbid")


class ClusterParams(Params):
    """The parameters of an operation on a cluster: `override` is the protocol's own (a protected
    cluster refuses everything else)."""

    override: Annotated[bool, AdminOnly("override")] = Field(
        False, description="Admins only: allow a protected cluster (big-run)"
    )


def admin_only(params: Params) -> list[str]:
    """Why each admin-only parameter `params` sets (away from its default) needs an admin."""
    out = []
    for name, info in type(params).model_fields.items():
        marks = [m for m in info.metadata if isinstance(m, AdminOnly)]
        if marks and getattr(params, name) != info.default:
            out.append(marks[0].why)
    return out


@dataclass
class Look:
    """What an operation would affect, seen before acting: the jobs, and notes for the announcement
    (e.g. that the head does not answer, so the jobs are unknown)."""

    jobs: list[Any]
    notes: list[str]
    unbacked: bool = False  # the head does not answer and an admin forced it: nothing will be backed up


@dataclass
class Outcome:
    text: str
    owners: list[str]  # Ray job owners to notify
    # Buttons on the report that start another operation: `Button(kind, label, arg=cluster)`, e.g. a
    # build's "Restart us-east5" (the engine runs `request(clicker, kind, cluster)`, its whole protocol).
    buttons: list[Button] = field(default_factory=list)


@dataclass(frozen=True)
class LeaveOut:
    """An extra answer affected owners may give: OK, but leave my jobs out (restart: "Don't resubmit
    mine"). It counts as OK; the op's `skip_resubmit` lists the jobs, for `execute` to honour."""

    label: str  # the button
    answer: str  # the owner's answer as the announcement shows it
    reply: str  # to the owner; {jobs} is "1 job" / "2 jobs"
    again: str  # to the owner who clicks it twice
    offered: Callable[[Operation], bool] = lambda op: True  # whether this operation offers it


def _title(op: Operation) -> str:
    return op.kind if op.cluster is None else f"{op.kind} {op.cluster}"


def _no_lines(op: Operation) -> list[str]:
    return []


def _failed(op: Operation, held: bool) -> str:
    if op.cluster is None:
        return "it held no lock"
    if held:
        return f"{op.cluster} stays locked by it: an admin can /unlock it once it is safe"
    return f"{op.cluster} is not locked by it any more"


def _owners(mentions: str) -> str:
    return f"your jobs were affected: {mentions}"


@dataclass(frozen=True)
class Texts:
    """How an operation reads in the channel. The defaults are those of an operation that says nothing
    special; each is a pure function of the operation."""

    title: Callable[[Operation], str] = _title  # "restart local": what is asked for
    lines: Callable[[Operation], list[str]] = _no_lines  # what the announcement adds (what happens to jobs)
    failed: Callable[[Operation, bool], str] = _failed  # what is left after a failure; bool: still locked
    owners: Callable[[str], str] = _owners  # the report's line to the owners told (their mentions)
    leave_out: LeaveOut | None = None


PLAIN = Texts()

Progress = Callable[[str], None]


@dataclass
class Outside:
    """An operation of this kind run outside the bot (the CLI), as its own record tells it."""

    step: str  # where it is ("starting" before it wrote a record)
    error: str | None = None
    ended: str | None = None  # how it ended ("done", "abandoned"), None while it runs


@dataclass
class Spec:
    """One kind of operation, the whole plug-in: adding one changes no line of the engine, the rules or
    an adapter beyond declaring its command (see `bot/operations/__init__.py`).

    `look` and `execute` are sync (they call ops) and run in a thread. `look` says what the operation
    would affect (its cluster is None when `needs_cluster` is off); `execute` runs it holding `lease`
    (None without a cluster) and reports progress lines. The engine releases the lease after `execute`
    unless `owns_lock` (restart keeps its lock on a failure, for a resume)."""

    kind: str  # the chat command's name
    ceremony: Literal["full", "announce"]  # full: consent and grace; announce: announced and run at once
    look: Callable[[Engine, Cluster | None, User, Params], Look]
    execute: Callable[[Engine, Operation, Lease | None, Progress], Outcome]
    params: type[Params] = ClusterParams
    needs_cluster: bool = True
    lease_s: float = 60.0
    summary: str = ""  # one line: what the command does (its Discord description)
    cluster_help: str = "The cluster"
    texts: Texts = PLAIN
    owns_lock: bool = False
    outside: Callable[[Any, str, str], Outside | None] | None = None  # (store, cluster, op id)
    # Where a request that names no cluster goes (add-worker: by its TPU type); OpsError names the
    # candidates. Sync (it may read the cloud's types): the engine runs it in a thread.
    infer_cluster: Callable[[Engine, dict[str, Any]], str] | None = None

    def parse(self, op: Operation) -> Params:
        """The operation's parameters as this kind's model (they were validated at the request)."""
        return self.params.model_validate(op.params)
