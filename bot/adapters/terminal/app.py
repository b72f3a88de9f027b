"""Running the terminal chat: the local cluster booted, the engine built, lines read and handled
until the input ends or /quit, Ctrl-C, and the exit code."""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import signal
import sys
from typing import Any

from bot.adapters.terminal import script
from bot.adapters.terminal.chat import TerminalChat
from bot.adapters.terminal.commands import NAME, Terminal
from bot.adapters.terminal.console import Console, restore_tty, start_reader, tty_state
from bot.adapters.terminal.help import duration
from bot.alerts.monitor import Monitor
from bot.config import Settings
from ops.errors import OpsError

log = logging.getLogger("clusterbot")
_SAVED_TTY: Any = None  # the terminal's settings at start, put back however we leave


def _login_name() -> str:
    try:
        name = getpass.getuser()
    except Exception:
        name = ""
    return name if NAME.match(name or "") else "you"


def _terminal_rights(settings: Settings) -> tuple[Settings, str]:
    """With no bot config file, the user named admin is an admin, and the alerts watch the local
    cluster only (the GCP ones cannot be read from a machine set up for nothing); and how /help says
    who is an admin."""
    if settings.config_path is not None:
        return settings, f"admins and rights: from {settings.config_path}"
    config = settings.config.model_copy(deep=True)
    config.rights.admins.append("admin")
    config.alerts.clusters = config.alerts.clusters or ["local"]
    note = "admins: with no bot config file, the user named admin is an admin (/as admin)"
    return settings.model_copy(update={"config": config}), note


async def run(settings: Settings, interactive: bool, console: Console | None = None) -> int:
    from bot.app import build_engine
    from ops.context import Context
    from ops.local import boot

    console = console or Console(interactive=interactive)

    def note(text: str) -> None:
        console.block("[clusterbot]", text)

    ctx = Context()
    ctx.store  # noqa: B018 - opened (and checked) first: a bad store or registry is a setting to fix (exit 2)
    settings, admin_note = _terminal_rights(settings)
    local = ctx.registry.clusters.get("local")
    if local is None:
        note("the registry has no cluster named local: /submit is off")
    else:
        try:
            note(await asyncio.to_thread(boot, ctx, local, note))
        except OpsError as e:
            note(f"could not start the local cluster: {e}")
            return 1

    chat = TerminalChat(console)
    engine = build_engine(chat, settings, ctx=ctx, owner_to_chat=lambda o: o)
    monitor = Monitor(engine)
    await engine.start()
    chat.start_ids_after([op.message_id for op in engine.ops.values()])
    await monitor.start()  # alerts print here as they fire
    term = Terminal(engine, console, settings, _login_name(), admin_note, monitor)
    w = engine.windows
    note(
        f"terminal chat: you are {term.user.name}; /help for commands; windows: confirm "
        f"{duration(w.confirm_s)}, consent {duration(w.consent_s)}, grace {duration(w.grace_s)}"
    )
    pending = [o for o in engine.ops.values() if o.open]
    if pending:
        note("picked up: " + ", ".join(f"{o.op_id} ({o.state.value})" for o in pending))

    loop = asyncio.get_running_loop()
    queue, ready = start_reader(loop, console, lambda: term.prompt)
    quitting = False

    def on_sigint() -> None:
        if not quitting and term.interrupt():
            return
        if quitting:
            console.write("[clusterbot] leaving now; open operations resume at the next start")
            restore_tty(_SAVED_TTY)
            os._exit(130)
        console.write("[clusterbot] interrupted: leaving (Ctrl-C again to leave at once)")
        queue.put_nowait(None)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError):
        pass

    try:
        while True:
            ready.set()
            line = await queue.get()
            if line is None:
                break
            if not interactive and line.strip() and not line.lstrip().startswith("#"):
                console.write(term.prompt + line.rstrip("\n"))
            try:
                if not await term.handle(line):
                    break
            except Exception as e:  # a bug: say it, keep the chat alive
                log.exception("command failed: %s", line.strip())
                term.reply(f"internal error: {type(e).__name__}: {e}", ok=False)
        quitting = True
        console.leave_prompt()
        code = await script.leave(term, chat, interactive)
    finally:
        quitting = True
        await monitor.close()
        await engine.close()
    if code:
        console.stream.flush()
        restore_tty(_SAVED_TTY)
        os._exit(code)  # an operation's thread is still running: do not wait for it
    return code


def main(settings: Settings) -> None:
    """`python -m bot` without a Discord token: the terminal chat (interactive, or a script on stdin)."""
    logging.basicConfig(level=logging.WARNING, format="[log] %(levelname)s %(name)s: %(message)s")
    interactive = sys.stdin.isatty()
    global _SAVED_TTY
    _SAVED_TTY = tty_state()
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
    try:
        code = asyncio.run(run(settings, interactive))
    except OpsError as e:  # a bad registry or store setting
        print(f"clusterbot: {e}", file=sys.stderr)
        code = 2
    finally:
        restore_tty(_SAVED_TTY)
    sys.exit(code)
