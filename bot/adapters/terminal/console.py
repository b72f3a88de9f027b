"""The terminal's input and output: printing under a live prompt, reading lines in a thread, and
putting the tty back however we leave. Nothing here knows the engine."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

from bot.protocol.model import Button


def plain(text: str) -> str:
    """Chat markdown the terminal does not render: bold and code marks."""
    return text.replace("**", "").replace("`", "")


def button_word(b: Button) -> str:
    """A button as the word that presses it: `confirm`, `delay 10`."""
    return f"{b.action} {b.arg}" if b.arg else b.action


class Console:
    """Where everything is printed. Interactive: a message arriving while the prompt waits for input
    clears the prompt line, prints, and puts the prompt and what was typed so far back."""

    def __init__(self, stream: Any = None, interactive: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.interactive = interactive
        self.redraw = interactive  # put the prompt back after a message (off once we are leaving)
        self.prompt: str | None = None  # set while the reader waits at the prompt
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            prompt = self.prompt if self.redraw else None
            if prompt is not None:
                self.stream.write("\r\x1b[K")
            self.stream.write(text.rstrip("\n") + "\n")
            if prompt is not None:
                self.stream.write(prompt + _line_buffer())
            self.stream.flush()

    def leave_prompt(self) -> None:
        """We are leaving while the reader still waits at the prompt: clear it, draw it no more."""
        with self._lock:
            if self.redraw and self.prompt is not None:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            self.redraw = False

    def block(self, prefix: str, text: str) -> None:
        """`prefix` then the text; its further lines indented under the first."""
        lines = text.splitlines() or [""]
        pad = " " * (len(prefix) + 1)
        self.write("\n".join([f"{prefix} {lines[0]}", *((pad + line).rstrip() for line in lines[1:])]))


def _line_buffer() -> str:
    try:
        import readline

        return readline.get_line_buffer()
    except Exception:
        return ""


def start_reader(
    loop: asyncio.AbstractEventLoop, console: Console, prompt: Callable[[], str]
) -> tuple[asyncio.Queue[str | None], threading.Event]:
    """A thread that reads one line each time the returned event is set (so the prompt names the
    user acting by then) and queues it; None at the end of input."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    ready = threading.Event()
    threading.Thread(
        target=_read, args=(loop, queue, ready, console, prompt), name="stdin", daemon=True
    ).start()
    return queue, ready


def _read(
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[str | None],
    ready: threading.Event,
    console: Console,
    prompt: Callable[[], str],
) -> None:
    while True:
        ready.wait()
        ready.clear()
        line: str | None
        try:
            if console.interactive:
                p = prompt()
                console.prompt = p
                try:
                    line = input(p)
                finally:
                    console.prompt = None
            else:
                line = sys.stdin.readline()
                if line == "":
                    line = None
        except (EOFError, OSError, ValueError):
            line = None
        loop.call_soon_threadsafe(queue.put_nowait, line)
        if line is None:
            return


def tty_state() -> Any:
    """The terminal's settings now (None when stdin is no terminal), for `restore_tty`."""
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    except Exception:
        return None


def restore_tty(saved: Any) -> None:
    if saved is None:
        return
    try:
        import termios

        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
    except Exception:
        pass
