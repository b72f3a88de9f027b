"""The protocol's data: users, operations, votes and states, as persisted in the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


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
    SKIP = "skip"  # OK, but do not resubmit my jobs (they must not run twice)


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
    cluster: str
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
    skip_resubmit: dict[str, str] = Field(
        default_factory=dict
    )  # job id -> chat name who asked to leave it out
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
