"""The terminal's commands: what a typed line means, as engine calls, and how the answer prints.

`Terminal.handle` reads a line (comments dropped, words split as a shell would) and calls the
command's handler from one table: the commands here, and every operation the engine offers (read
from its spec: bot.adapters.terminal.operations). The buttons of an announcement are words
(bot.adapters.terminal.words); /wait and /wait-state belong to scripts (bot.adapters.terminal.script).
"""

from __future__ import annotations

import asyncio
import difflib
import re
import shlex
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bot.adapters.terminal import operations, script, words
from bot.adapters.terminal.console import Console, button_word, plain
from bot.adapters.terminal.help import help_text
from bot.config import Settings
from bot.protocol import rules
from bot.protocol.engine import Engine
from bot.protocol.model import Reply, Spec, State, User
from ops.errors import OpsError
from ops.jobs import submit_job

if TYPE_CHECKING:
    from bot.alerts.monitor import Monitor

TRAILING_COMMENT = re.compile(r"\s+#.*$")
NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")

Handler = Callable[[list[str], str], Awaitable[None]]  # (words after the command, the rest as typed)


class Terminal:
    """Turns lines typed (or read from a script) into engine calls and prints the answers."""

    def __init__(
        self,
        engine: Engine,
        console: Console,
        settings: Settings,
        user: str,
        admin_note: str,
        monitor: Monitor | None = None,
    ) -> None:
        self.engine = engine
        self.monitor = monitor
        self.console = console
        self.settings = settings
        self.user = User(id=user, name=user)
        self.admin_note = admin_note
        self.waiting = False  # in /wait or /wait-state: Ctrl-C ends the wait, not the chat
        self.interrupted = asyncio.Event()
        self.commands: dict[str, Handler] = {
            "/status": self.cmd_status,
            "/jobs": self.cmd_jobs,
            "/health": self.cmd_health,
            "/check": self.cmd_check,
            "/unlock": self.cmd_unlock,
            "/cancel": self.cmd_cancel,
            "/link": self.cmd_link,
            "/unlink": self.cmd_unlink,
            "/as": self.cmd_as,
            "/submit": self.cmd_submit,
            "/ops": self.cmd_ops,
            "/show": self.cmd_show,
            "/wait": lambda args, rest: script.cmd_wait(self, args),
            "/wait-state": lambda args, rest: script.cmd_wait_state(self, args),
            "/help": self.cmd_help,
        }
        for kind, spec in engine.specs.items():  # every operation, as its spec declares it
            self.commands.setdefault(f"/{kind}", lambda args, rest, spec=spec: self.request(spec, args))

    def interrupt(self) -> bool:
        """Ctrl-C: end a wait in progress (True), or tell the caller there was none (False)."""
        if self.waiting:
            self.interrupted.set()
        return self.waiting

    # -- output -----------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.console.block("[clusterbot]", text)

    def reply(self, text: str, ok: bool = True) -> None:
        self.console.block(f"[to {self.user.name}]", plain(text) if ok else "refused: " + plain(text))

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
            if cmd in words.WORDS:
                await words.press(self, cmd, args)
            elif cmd == "/quit":
                return False
            elif cmd in self.commands:
                await self.commands[cmd](args, rest)
            else:
                self.unknown(head)
        except OpsError as e:
            self.reply(str(e), ok=False)
        return True

    def unknown(self, head: str) -> None:
        known = (*self.commands, "/quit")
        close = difflib.get_close_matches(head.lower(), known + words.WORDS, n=1, cutoff=0.6)
        if not close and not head.startswith("/"):
            close = difflib.get_close_matches("/" + head.lower(), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.reply(f"unknown command {head}{hint} (/help lists them)", ok=False)

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

    # -- commands ---------------------------------------------------------------------------------
    async def cmd_help(self, args: list[str], rest: str) -> None:
        self.note(help_text(self.engine, self.settings, self.user, self.admin_note, script.MAX_WAIT_S))

    async def request(self, spec: Spec, args: list[str]) -> None:
        """Any registered operation: the words read against its parameters, the engine decides."""
        cluster, params = operations.parse(spec, args)
        r = await self.engine.request(self.user, spec.kind, cluster, params)
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
            clusters = ", ".join(self.engine.registry.clusters)
            self.reply(f"usage: /jobs CLUSTER; clusters: {clusters}", ok=False)
            return
        self.show(await self.engine.jobs(args[0]))

    async def cmd_health(self, args: list[str], rest: str) -> None:
        if len(args) > 1 or self.monitor is None:
            self.reply("usage: /health [CLUSTER]" if self.monitor else "health checks are off", ok=False)
            return
        self.show(await self.monitor.health(args[0] if args else None))

    async def cmd_check(self, args: list[str], rest: str) -> None:
        """Run the scheduled health check now: alerts fire (after their streak), evolve and resolve."""
        if args or self.monitor is None:
            self.reply("usage: /check" if self.monitor else "health checks are off", ok=False)
            return
        healths = await self.monitor.check()
        self.reply("checked: " + ", ".join(f"{h.snapshot.cluster} {h.verdict.value}" for h in healths))

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
        """The command line as typed (quotes kept) becomes the job's entrypoint, owned by the user."""
        if not rest:
            self.reply("usage: /submit ENTRYPOINT..., e.g. /submit sleep 600", ok=False)
            return
        cluster = self.engine.registry.clusters.get("local")
        if cluster is None:
            self.reply("the registry has no cluster named local to submit to", ok=False)
            return
        name = self.user.name
        sid = await asyncio.to_thread(submit_job, self.engine.ctx, cluster, rest, name)
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
        shown = [button_word(b) for b in rules.buttons(op, self.engine.windows)]
        self.reply(text + (f"\n[buttons: {', '.join(shown)}]" if shown else ""))
