"""The terminal chat: the same engine as Discord, in a terminal, against the local Ray cluster.

The local default (`python -m bot` with no DISCORD_TOKEN): the local cluster is brought up if it is
down, users are plain names (`/as NAME` switches who is typing), a Ray job owner "bob" is chat user
"bob" (a user's id is their name, so a bot config for the terminal names its admins), and the
buttons of an announcement become words (`confirm`, `ok`, `delay 10`, `object`, `skip`, `cancel`,
`override`) that act on the newest operation the user can act on, or on an operation id given after
the word. A `#` starts a comment, on its own line or after a command. Every bot message is printed
with a prefix: `[#infra 3]` for a channel post (message 3), `[#infra edit 3]` for an edit of it (only
the lines that changed), `[to alice]` for a reply to alice, `[clusterbot]` for the terminal's own notes.

Interactive when standard input is a terminal (a prompt naming the acting user, the engine's timers
running meanwhile); otherwise a script, read line by line, each line handled before the next and
echoed after the prompt. At the end of a script the clock keeps running and operations counting down
or executing are waited for (bounded), up to their report; operations still waiting for consent stay
persisted in the store, and the next start picks them up.
"""

from __future__ import annotations

import asyncio
import difflib
import getpass
import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bot.config import Settings
from bot.protocol import rules
from bot.protocol.engine import Engine
from bot.protocol.model import Button, Message, Reply, State, User
from ops.errors import OpsError

CHANNEL = "#infra"
WORDS = ("confirm", "ok", "delay", "object", "skip", "cancel", "override")
COMMANDS = (
    "/restart", "/status", "/jobs", "/unlock", "/cancel", "/link", "/unlink", "/as", "/submit", "/ops",
    "/show", "/wait", "/wait-state", "/help", "/quit",
)  # fmt: skip
RESTART_FLAGS = ("--no-preserve", "--override", "--force-unbacked")
TRAILING_COMMENT = re.compile(r"\s+#.*$")
MAX_WAIT_S = 3600.0  # /wait and /wait-state are bounded
WAIT_STATE_DEFAULT_S = 900.0
END_WAIT_S = 900.0  # end of a script: how long operations counting down or executing are waited for
NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")

log = logging.getLogger("clusterbot")


def _plain(text: str) -> str:
    """Chat markdown the terminal does not render: bold and code marks."""
    return text.replace("**", "").replace("`", "")


def _button_word(b: Button) -> str:
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


class TerminalChat:
    """The engine's Chat: #infra is this terminal. Edits print only the lines that changed."""

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
        lines = _plain(message.text).splitlines()
        words = [_button_word(b) for b in message.buttons]
        self._shown[mid] = (lines, words)
        text = "\n".join(lines)
        if words:
            text += "\n[buttons: " + ", ".join(words) + "]"
        self.console.block(f"[{CHANNEL} {mid}]", text)
        self.changed.set()
        return mid

    async def edit(self, message_id: str, message: Message) -> None:
        lines = _plain(message.text).splitlines()
        words = [_button_word(b) for b in message.buttons]
        old_lines, old_words = self._shown.get(message_id, ([], []))  # unknown: from an earlier life
        self._shown[message_id] = (lines, words)
        seen = set(old_lines)
        changed = [line for line in lines if line not in seen]
        if words != old_words:
            changed.append("[buttons: " + ", ".join(words) + "]" if words else "[no buttons any more]")
        if changed:
            self.console.block(f"[{CHANNEL} edit {message_id}]", "\n".join(changed))
        self.changed.set()


HELP = """\
commands (you act as {user}{admin}; clusters: {clusters}):
  /restart CLUSTER [--no-preserve] [--override] [--force-unbacked]
                             ask for a restart (announced in #infra, then consent); admins: --override
                             for a protected cluster, --force-unbacked to restart even if the head does
                             not answer (jobs are NOT backed up)
  /status [CLUSTER]          head, workers, jobs by owner, operation in progress
  /jobs CLUSTER              running and pending jobs and their owners
  /unlock CLUSTER            admin: force-unlock a cluster (its open operation is cancelled)
  /cancel [OP]               cancel your newest open operation, or OP
  /link RAY_USER             link a Ray job owner name to you (you are asked before it is stopped)
  /unlink RAY_USER           admin: remove a Ray job owner name's link
  /as NAME                   act as NAME from now on (play the other job owners)
  /submit ENTRYPOINT...      start a job on the local cluster owned by you, e.g. /submit sleep 600
  /ops                       operations, newest first (their ids, for the words below)
  /show [OP]                 an operation's announcement as it reads now (edits print only what changed)
  /wait SECONDS              let time pass (scripts), at most {max_wait:.0f}
  /wait-state OP|newest STATE [TIMEOUT]   wait until an operation reaches STATE ({states})
  /help, /quit
the buttons of an announcement are words; each acts on the newest operation you can act on, or on OP:
  confirm [OP]               the requester goes ahead
  ok [OP], object [OP]       an affected job owner agrees / objects (ok again withdraws an objection)
  delay MINUTES [OP]         an affected owner asks for time to checkpoint ({delays})
  skip [OP]                  an affected owner: don't resubmit my jobs (backed up, not resubmitted)
  cancel [OP]                the requester or an admin drops it (also during the countdown)
  override [OP]              an admin passes the consent (and protection, with /restart --override)
{admins}
windows: confirm {confirm}, consent {consent}, grace {grace} (from {config})"""


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g}s"


class Terminal:
    """Turns lines typed (or read from a script) into engine calls and prints the answers."""

    def __init__(
        self, engine: Engine, console: Console, settings: Settings, user: str, admin_note: str
    ) -> None:
        self.engine = engine
        self.console = console
        self.settings = settings
        self.user = User(id=user, name=user)
        self.admin_note = admin_note
        self.waiting = False  # in /wait or /wait-state: Ctrl-C ends the wait, not the chat
        self._interrupt = asyncio.Event()

    def interrupt(self) -> bool:
        """Ctrl-C: end a wait in progress (True), or tell the caller there was none (False)."""
        if self.waiting:
            self._interrupt.set()
        return self.waiting

    async def _pause(self, seconds: float) -> bool:
        """Sleep, unless interrupted first (then False)."""
        try:
            await asyncio.wait_for(self._interrupt.wait(), timeout=seconds)
        except TimeoutError:
            return True
        return False

    # -- output -----------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.console.block("[clusterbot]", text)

    def reply(self, text: str, ok: bool = True) -> None:
        self.console.block(f"[to {self.user.name}]", _plain(text) if ok else "refused: " + _plain(text))

    def show(self, r: Reply) -> None:
        self.reply(r.text, r.ok)

    @property
    def prompt(self) -> str:
        return f"{self.user.name}{' (admin)' if self.engine.is_admin(self.user) else ''}> "

    # -- lines ------------------------------------------------------------------------------------
    async def handle(self, line: str) -> bool:
        """Handle one line; False when it asks to quit."""
        line = TRAILING_COMMENT.sub("", line.strip())
        if not line or line.startswith("#"):
            return True
        head, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            args = shlex.split(rest)
        except ValueError as e:
            self.reply(f"cannot read that line: {e}", ok=False)
            return True
        cmd = head.lower()
        try:
            if cmd in WORDS:
                await self.word(cmd, args)
            elif cmd == "/quit":
                return False
            elif cmd in COMMANDS:
                await getattr(self, "cmd_" + cmd[1:].replace("-", "_"))(args, rest)
            else:
                self.unknown(head)
        except OpsError as e:
            self.reply(str(e), ok=False)
        return True

    def unknown(self, head: str) -> None:
        close = difflib.get_close_matches(head.lower(), COMMANDS + WORDS, n=1, cutoff=0.6)
        if not close and not head.startswith("/"):
            close = difflib.get_close_matches("/" + head.lower(), COMMANDS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.reply(f"unknown command {head}{hint} (/help lists them)", ok=False)

    # -- commands ---------------------------------------------------------------------------------
    async def cmd_help(self, args: list[str], rest: str) -> None:
        w = self.engine.windows
        self.note(
            HELP.format(
                user=self.user.name,
                admin=", an admin" if self.engine.is_admin(self.user) else "",
                clusters=", ".join(self.engine.registry.clusters),
                max_wait=MAX_WAIT_S,
                states="|".join(s.value for s in State),
                delays=" or ".join(str(m) for m in w.delay_choices_min),
                admins=self.admin_note,
                confirm=_duration(w.confirm_s),
                consent=_duration(w.consent_s),
                grace=_duration(w.grace_s),
                config=self.settings.config_path or "the defaults: no bot config file",
            )
        )

    async def cmd_restart(self, args: list[str], rest: str) -> None:
        usage = "usage: /restart CLUSTER [--no-preserve] [--override] [--force-unbacked]"
        flags = [a for a in args if a.startswith("-")]
        names = [a for a in args if not a.startswith("-")]
        for flag in flags:
            if flag not in RESTART_FLAGS:
                close = difflib.get_close_matches(flag, RESTART_FLAGS, n=1)
                self.reply(f"unknown flag {flag}" + (f"; did you mean {close[0]}?" if close else "")
                           + f" ({usage})", ok=False)  # fmt: skip
                return
        if len(names) != 1:
            clusters = ", ".join(self.engine.registry.clusters)
            self.reply(f"{usage}; clusters: {clusters}", ok=False)
            return
        params: dict[str, Any] = {"preserve_jobs": "--no-preserve" not in flags}
        if "--override" in flags:
            params["override"] = True
        if "--force-unbacked" in flags:
            params["force_unbacked"] = True
        r = await self.engine.request(self.user, "restart", names[0], params)
        if r.ok:
            r = Reply(r.text.replace("Confirm there", "type confirm"), r.ephemeral, r.ok)
        self.show(r)

    async def cmd_status(self, args: list[str], rest: str) -> None:
        if len(args) > 1:
            self.reply("usage: /status [CLUSTER]", ok=False)
            return
        self.show(await self.engine.status(args[0] if args else None))

    async def cmd_jobs(self, args: list[str], rest: str) -> None:
        if len(args) != 1:
            self.reply(
                f"usage: /jobs CLUSTER; clusters: {', '.join(self.engine.registry.clusters)}", ok=False
            )
            return
        self.show(await self.engine.jobs(args[0]))

    async def cmd_unlock(self, args: list[str], rest: str) -> None:
        if len(args) != 1:
            self.reply("usage: /unlock CLUSTER", ok=False)
            return
        self.show(await self.engine.unlock(self.user, args[0]))

    async def cmd_cancel(self, args: list[str], rest: str) -> None:
        if len(args) > 1:
            self.reply("usage: /cancel [OP]", ok=False)
            return
        op_id = self.resolve(args[0]) if args else None
        if args and op_id is None:
            return
        self.show(await self.engine.cancel(self.user, op_id))

    async def cmd_link(self, args: list[str], rest: str) -> None:
        if len(args) != 1:
            self.reply("usage: /link RAY_USER (your Ray job owner name)", ok=False)
            return
        self.show(await self.engine.link(self.user, args[0]))

    async def cmd_unlink(self, args: list[str], rest: str) -> None:
        if len(args) != 1:
            self.reply("usage: /unlink RAY_USER", ok=False)
            return
        self.show(await self.engine.unlink(self.user, args[0]))

    async def cmd_as(self, args: list[str], rest: str) -> None:
        if len(args) != 1 or not NAME.match(args[0]):
            self.reply("usage: /as NAME (letters, digits, . _ - @)", ok=False)
            return
        self.user = User(id=args[0], name=args[0])
        admin = " (an admin)" if self.engine.is_admin(self.user) else ""
        self.note(f"you are now {self.user.name}{admin}")

    async def cmd_submit(self, args: list[str], rest: str) -> None:
        if not rest:
            self.reply("usage: /submit ENTRYPOINT..., e.g. /submit sleep 600", ok=False)
            return
        cluster = self.engine.registry.clusters.get("local")
        if cluster is None:
            self.reply("the registry has no cluster named local to submit to", ok=False)
            return
        name = self.user.name

        def submit() -> str:
            return self.engine.ctx.ray(cluster).submit(entrypoint=rest, metadata={"user": name})

        try:
            sid = await asyncio.to_thread(submit)
        except OpsError:
            raise
        except Exception as e:
            text = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
            self.reply(f"could not submit to local: {text}", ok=False)
            return
        self.reply(f"submitted {sid} on local as {name}: {rest}")

    async def cmd_ops(self, args: list[str], rest: str) -> None:
        ops = sorted(self.engine.ops.values(), key=lambda o: o.created_at, reverse=True)
        shown = [o for o in ops if o.open] + [o for o in ops if not o.open][:5]
        if not shown:
            self.reply("no operations yet")
            return
        lines = [
            f"{o.op_id}  {o.kind} {o.cluster} by {o.requester.name}: {o.state.value}"
            + (" (confirmed)" if o.state == State.AWAITING and o.confirmed else "")
            for o in shown
        ]
        self.reply("\n".join(lines))

    async def cmd_show(self, args: list[str], rest: str) -> None:
        if len(args) > 1:
            self.reply("usage: /show [OP]", ok=False)
            return
        op_id = self.resolve(args[0] if args else "newest")
        if op_id is None:
            return
        op = self.engine.ops[op_id]
        chat = self.engine.chat
        text = rules.render(op, datetime.now(UTC), chat.mention, chat.when)
        words = [_button_word(b) for b in rules.buttons(op, self.engine.windows)]
        self.reply(text + (f"\n[buttons: {', '.join(words)}]" if words else ""))

    async def cmd_wait(self, args: list[str], rest: str) -> None:
        try:
            seconds = float(args[0]) if len(args) == 1 else -1.0
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= MAX_WAIT_S:
            self.reply(f"usage: /wait SECONDS (0 to {MAX_WAIT_S:.0f})", ok=False)
            return
        self._interrupt.clear()
        self.waiting = True
        try:
            if not await self._pause(seconds):
                self.note("wait interrupted")
        finally:
            self.waiting = False

    async def cmd_wait_state(self, args: list[str], rest: str) -> None:
        states = [s.value for s in State]
        usage = f"usage: /wait-state OP|newest STATE [TIMEOUT_S]; states: {', '.join(states)}"
        if len(args) not in (2, 3) or args[1] not in states:
            self.reply(usage, ok=False)
            return
        try:
            timeout = float(args[2]) if len(args) == 3 else WAIT_STATE_DEFAULT_S
        except ValueError:
            timeout = -1.0
        if not 0 <= timeout <= MAX_WAIT_S:
            self.reply(f"{usage} (TIMEOUT_S at most {MAX_WAIT_S:.0f})", ok=False)
            return
        op_id = self.resolve(args[0])
        if op_id is None:
            return
        want = State(args[1])
        self._interrupt.clear()
        self.waiting = True
        try:
            self.note(await self._wait_state(op_id, want, timeout))
        finally:
            self.waiting = False

    async def _wait_state(self, op_id: str, want: State, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            op = self.engine.ops[op_id]
            if op.state == want:
                return f"{op_id} is {want.value}"
            if not op.open:
                return f"{op_id} ended {op.state.value}, not {want.value}"
            if time.monotonic() > deadline:
                return f"timed out after {timeout:g}s: {op_id} is {op.state.value}, not {want.value}"
            if not await self._pause(0.1):
                return f"wait interrupted: {op_id} is {op.state.value}"

    # -- buttons as words ------------------------------------------------------------------------
    async def word(self, action: str, args: list[str]) -> None:
        arg = ""
        if action == "delay":
            choices = self.engine.windows.delay_choices_min
            if not args or not args[0].isdigit():
                self.reply(f"delay needs minutes: {' or '.join(f'delay {m}' for m in choices)}", ok=False)
                return
            arg, args = args[0], args[1:]
        if len(args) > 1:
            self.reply(f"usage: {action}{' MINUTES' if arg else ''} [OP]", ok=False)
            return
        if args:
            op_id = self.resolve(args[0])
            if op_id is None:
                return
        else:
            op = self.engine.newest_for(self.user, action)
            if op is None:  # nothing this user may do: let the engine say why on the newest open one
                open_ops = [o for o in self.engine.ops.values() if o.open]
                if not open_ops:
                    self.reply(f"there is no open operation to {action}", ok=False)
                    return
                op = max(open_ops, key=lambda o: o.created_at)
            op_id = op.op_id
        r = await self.engine.act(self.user, op_id, action, arg)
        self.show(Reply(r.text if op_id in r.text else f"{r.text} ({op_id})", r.ephemeral, r.ok))

    def resolve(self, ref: str) -> str | None:
        """An operation id from what was typed: the id, `newest`, or a unique part of an id."""
        ops = self.engine.ops
        if ref == "newest":
            if not ops:
                self.reply("there is no operation yet", ok=False)
                return None
            return max(ops.values(), key=lambda o: o.created_at).op_id
        if ref in ops:
            return ref
        found = [op_id for op_id in ops if ref in op_id]
        if len(found) == 1:
            return found[0]
        self.reply(f"no operation {ref}" if not found else f"{ref} matches {len(found)} operations", ok=False)
        return None


# -- running it -----------------------------------------------------------------------------------


def _login_name() -> str:
    try:
        name = getpass.getuser()
    except Exception:
        name = ""
    return name if NAME.match(name or "") else "you"


def _reader(
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[str | None],
    ready: threading.Event,
    console: Console,
    prompt: Callable[[], str],
) -> None:
    """Read one line whenever the loop is ready for the next (so the prompt names the acting user)."""
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


async def run(settings: Settings, interactive: bool, console: Console | None = None) -> int:
    from bot.app import build_engine
    from ops.context import Context

    console = console or Console(interactive=interactive)

    def note(text: str) -> None:
        console.block("[clusterbot]", text)

    ctx = Context()
    registry, store = ctx.registry, ctx.store

    admin_note = f"admins and rights: from {settings.config_path}"
    if settings.config_path is None:
        config = settings.config.model_copy(deep=True)
        config.rights.admins.append("admin")
        settings = settings.model_copy(update={"config": config})
        admin_note = "admins: with no bot config file, the user named admin is an admin (/as admin)"

    local = registry.clusters.get("local")
    if local is not None:
        from ops.locks import current_lock
        from ops.restart import find_record

        driver = ctx.driver(local)
        held = await asyncio.to_thread(current_lock, store, local.name)
        restarting = held is not None and held.kind == "restart"
        if restarting and await asyncio.to_thread(find_record, store, local.name, held.op_id) is None:
            restarting = False  # announced, not started: nothing stopped the cluster yet
        if restarting and not driver.is_up():
            note(f"local cluster down: {held.describe()} brings it back (not started here)")
        elif driver.is_up():
            note(f"local cluster up, dashboard at {local.dashboard_url}")
        else:
            note("starting the local Ray cluster (about 10 s)...")
            try:
                note(await asyncio.to_thread(driver.start))
                await asyncio.to_thread(ctx.ray(local).wait_accepting, 90)
            except OpsError as e:
                note(f"could not start the local cluster: {e}")
                return 1
    else:
        note("the registry has no cluster named local: /submit is off")

    chat = TerminalChat(console)
    engine = build_engine(chat, settings, ctx=ctx, owner_to_chat=lambda o: o)
    await engine.start()
    chat.start_ids_after([op.message_id for op in engine.ops.values()])
    term = Terminal(engine, console, settings, _login_name(), admin_note)
    w = engine.windows
    note(
        f"terminal chat: you are {term.user.name}; /help for commands; windows: confirm "
        f"{_duration(w.confirm_s)}, consent {_duration(w.consent_s)}, grace {_duration(w.grace_s)}"
    )
    pending = [o for o in engine.ops.values() if o.open]
    if pending:
        note("picked up: " + ", ".join(f"{o.op_id} ({o.state.value})" for o in pending))

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    ready = threading.Event()
    quitting = False

    def on_sigint() -> None:
        if not quitting and term.interrupt():
            return
        if quitting:
            console.write("[clusterbot] leaving now; open operations resume at the next start")
            _restore_tty(_SAVED_TTY)
            os._exit(130)
        console.write("[clusterbot] interrupted: leaving (Ctrl-C again to leave at once)")
        queue.put_nowait(None)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError):
        pass
    threading.Thread(
        target=_reader, args=(loop, queue, ready, console, lambda: term.prompt), name="stdin", daemon=True
    ).start()

    code = 0
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
        deadline = loop.time() + END_WAIT_S
        if not interactive:  # a script's last word (say `confirm`) is followed through to the report
            moving = [o.op_id for o in engine.ops.values() if o.state in MOVING]
            if moving:
                note(f"end of script: waiting (at most {END_WAIT_S / 60:.0f} min) for {', '.join(moving)}")
            await _while_moving(engine, chat, deadline)
        # The clock stops, so nothing more starts executing while we leave; what executes already
        # goes on (its lease renews itself) and is waited for, up to its report.
        await engine.close()
        executing = [o.op_id for o in engine.ops.values() if o.state == State.EXECUTING]
        if executing and interactive:
            note(f"waiting (at most {END_WAIT_S / 60:.0f} min) for {', '.join(executing)} to finish")
        try:
            await engine.wait_executing(max(deadline - loop.time(), 0.0))
        except TimeoutError:
            note("still executing; the next start resumes it")
            code = 1
        left = [o for o in engine.ops.values() if o.open and o.state != State.EXECUTING]
        if left:
            note(
                "left pending (persisted; the next start picks them up): "
                + ", ".join(f"{o.op_id} ({o.state.value})" for o in left)
            )
    finally:
        quitting = True
        await engine.close()
    if code:
        console.stream.flush()
        _restore_tty(_SAVED_TTY)
        os._exit(code)  # an operation's thread is still running: do not wait for it
    return code


MOVING = (State.GRACE, State.EXECUTING)  # states that end on their own, without anyone's answer


async def _while_moving(engine: Engine, chat: TerminalChat, deadline: float) -> None:
    """Keep the engine's clock running until no operation counts down or executes, or the deadline.
    Each step of an operation shows in the chat, so each post or edit is a moment to look again."""
    loop = asyncio.get_running_loop()
    while any(o.state in MOVING for o in engine.ops.values()):
        left = deadline - loop.time()
        if left <= 0:
            return
        chat.changed.clear()
        try:  # bounded: a state change that shows nothing is still seen within a second
            await asyncio.wait_for(chat.changed.wait(), min(left, 1.0))
        except TimeoutError:
            pass


def main(settings: Settings) -> None:
    """`python -m bot` without a Discord token: the terminal chat (interactive, or a script on stdin)."""
    logging.basicConfig(level=logging.WARNING, format="[log] %(levelname)s %(name)s: %(message)s")
    interactive = sys.stdin.isatty()
    global _SAVED_TTY
    _SAVED_TTY = _tty_state()
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
        _restore_tty(_SAVED_TTY)
    sys.exit(code)


_SAVED_TTY: Any = None  # the terminal's settings at start, put back however we leave


def _tty_state() -> Any:
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno()) if sys.stdin.isatty() else None
    except Exception:
        return None


def _restore_tty(saved: Any) -> None:
    if saved is None:
        return
    try:
        import termios

        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
    except Exception:
        pass
