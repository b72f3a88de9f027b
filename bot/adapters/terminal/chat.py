"""TerminalChat: the engine's Chat when #infra is this terminal. Edits print only what changed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from bot.adapters.terminal.console import Console, button_word, plain
from bot.protocol.model import Message
from ops.registry import clusterbot_home

CHANNEL = "#infra"


def _keep(message_id: str, name: str, data: bytes) -> Path:
    """An attachment, as a file under CLUSTERBOT_HOME/attachments (the terminal cannot show a picture)."""
    path = clusterbot_home() / "attachments" / f"{message_id}-{Path(name).name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class TerminalChat:
    """Posts print as `[#infra N]`, edits as `[#infra edit N]` with only the lines that changed."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.next_id = 1
        self._shown: dict[str, tuple[list[str], list[str]]] = {}  # message id -> (lines, button words)
        self.changed = asyncio.Event()  # set on every post and edit: what the end of a script waits on

    def mention(self, chat_id: str) -> str:
        return f"@{chat_id}"

    def when(self, at: datetime | None) -> str:
        return "-" if at is None else f"{at.astimezone(UTC):%H:%M:%S} UTC"

    def link(self, message_id: str) -> str | None:
        return f"{CHANNEL} message {message_id}"

    def start_ids_after(self, message_ids: list[str | None]) -> None:
        """Number new messages after those of an earlier life (whose edits may still come)."""
        numbers = [int(m) for m in message_ids if m and m.isdigit()]
        self.next_id = max([self.next_id - 1, *numbers]) + 1

    async def post(self, message: Message) -> str:
        mid = str(self.next_id)
        self.next_id += 1
        lines = plain(message.text).splitlines()
        words = [button_word(b) for b in message.buttons]
        self._shown[mid] = (lines, words)
        text = "\n".join(lines)
        if words:
            text += "\n[buttons: " + ", ".join(words) + "]"
        for name, data in message.files:
            text += f"\n[attached: {await asyncio.to_thread(_keep, mid, name, data)}]"
        self.console.block(f"[{CHANNEL} {mid}]", text)
        self.changed.set()
        return mid

    async def edit(self, message_id: str, message: Message) -> None:
        lines = plain(message.text).splitlines()
        words = [button_word(b) for b in message.buttons]
        old_lines, old_words = self._shown.get(message_id, ([], []))  # unknown: from an earlier life
        self._shown[message_id] = (lines, words)
        seen = set(old_lines)
        changed = [line for line in lines if line not in seen]
        if words != old_words:
            changed.append("[buttons: " + ", ".join(words) + "]" if words else "[no buttons any more]")
        if changed:
            self.console.block(f"[{CHANNEL} edit {message_id}]", "\n".join(changed))
        self.changed.set()
