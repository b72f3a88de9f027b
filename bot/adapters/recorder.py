"""The tests' chat and clock: a chat that records every message posted and every edit, nothing else;
a clock that moves only when told, so tests drive the protocol's windows without sleeping through them."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from bot.protocol.model import Message


class Recorder:
    def __init__(self) -> None:
        self.posts: dict[str, Message] = {}  # message id -> current content
        self.log: list[tuple[str, str, Message]] = []  # ("post" | "edit", message id, content)
        self._ids = itertools.count(1)

    def mention(self, chat_id: str) -> str:
        return f"@{chat_id}"

    def when(self, at: datetime | None) -> str:
        return "-" if at is None else f"{at:%H:%M:%S} UTC"

    async def post(self, message: Message) -> str:
        mid = str(next(self._ids))
        self.posts[mid] = message
        self.log.append(("post", mid, message))
        return mid

    async def edit(self, message_id: str, message: Message) -> None:
        if message_id not in self.posts:
            raise KeyError(f"edit of unknown message {message_id}")
        self.posts[message_id] = message
        self.log.append(("edit", message_id, message))

    def link(self, message_id: str) -> str | None:
        return f"https://chat.test/infra/{message_id}"

    def text(self, message_id: str) -> str:
        return self.posts[message_id].text

    def new_posts(self) -> list[Message]:
        return [m for kind, _, m in self.log if kind == "post"]


class ManualClock:
    """The engine's `clock`: now is what the test says (starts at the real now, moves by `advance`)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
