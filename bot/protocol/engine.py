"""The engine: every operation that can hurt other people goes through here, step by visible step.

request -> validate -> lock -> look at the jobs -> announce -> consent -> grace -> execute -> report.
All state lives in the store (the CLI's store, lock and journal), so a bot killed at any step picks
its operations up again on start, with the consent window extended by the time it was down. The
engine runs on one asyncio loop; store and ops calls go to threads so the loop never blocks.

It knows no operation by name: each kind is a `Spec` (bot/protocol/model.py) registered in
`bot/operations/`, which brings its parameters, ceremony, lease, look, execution and texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from bot.config import BotConfig
from bot.protocol import rules
from bot.protocol.model import (
    PLAIN,
    TERMINAL,
    Affected,
    Button,
    Look,
    Message,
    Operation,
    Outcome,
    Outside,
    Params,
    Reply,
    Spec,
    State,
    Texts,
    User,
    admin_only,
)
from ops import journal
from ops.context import Context
from ops.errors import OpsError
from ops.locks import Lease, acquire, current_lock, force_unlock, new_op_id, take_over
from ops.store import Conflict, dump, read_model

__all__ = ["Chat", "Engine", "Look", "Outcome", "Spec"]  # the plug-in's types live in model.py

log = logging.getLogger("clusterbot")
HOLDER = "clusterbot-bot"
ALIVE_KEY = "bot/alive.json"
PROGRESS_EVERY_S = 1.0  # at most one write of bot/ops/<op>.json and one edit per this, per operation
_PATH = re.compile(r"(?<![\w/])(?:[a-z][a-z0-9+.-]*://|/)[^\s,;]+")  # URLs and absolute paths


LINKS_KEY = "bot/links.json"
_LINK_TRIES = 10
_RAY_USER = re.compile(r"[A-Za-z0-9._@-]{1,64}")


class Links(BaseModel):
    """Ray job owners linked to chat users by themselves (/link)."""

    owners: dict[str, str] = Field(default_factory=dict)  # Ray user -> chat id


NEXT = "next"  # the target of a report's buttons: "next:<op id>" (Outcome.buttons)

FOREIGN_KEY = "bot/foreign.json"
FOREIGN_EVERY_S = 10.0  # how often the locks are read for operations someone else (the CLI) runs


class Shown(BaseModel):
    """An operation the bot did not start, as it shows it in #infra."""

    op_id: str
    kind: str = "restart"  # records written before kinds were kept showed restarts only
    message_id: str
    text: str
    ended: bool = False


class Foreign(BaseModel):
    clusters: dict[str, Shown] = Field(default_factory=dict)  # cluster -> the last operation shown


class _Alive(BaseModel):
    """When the bot last said it was alive, and how often it says so (a dead bot is silent)."""

    at: datetime
    every_s: float = 0.0


def utcnow() -> datetime:
    return datetime.now(UTC)


Clock = Callable[[], datetime]  # aware UTC now: the windows' time (tests drive it; real time otherwise)
# A click on a message that shows something other than an operation (an alert): (user, target, action, arg).
Target = Callable[[User, str, str, str], Awaitable[Reply]]


class Chat(Protocol):
    """What the engine needs from a chat: post and edit messages in #infra, mention people."""

    def mention(self, chat_id: str) -> str: ...
    def when(self, at: datetime | None) -> str: ...
    async def post(self, message: Message) -> str: ...
    async def edit(self, message_id: str, message: Message) -> None: ...
    def link(self, message_id: str) -> str | None:
        """Where a person can open the message (a jump URL), or None when the chat has no such thing."""
        ...


def _bad_params(kind: str, model: type[Params], error: ValidationError) -> str:
    """Which parameters were wrong and which exist, in one line."""
    wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'parameters'}: {e['msg']}" for e in error.errors())
    valid = ", ".join(model.model_fields) or "none"
    return f"bad parameters for /{kind}: {wrong} (parameters: {valid})"


class Engine:
    def __init__(
        self,
        ctx: Context,
        config: BotConfig,
        chat: Chat,
        specs: dict[str, Spec],
        owner_to_chat: Callable[[str], str | None] | None = None,
        holder: str = HOLDER,
        clock: Clock = utcnow,
    ) -> None:
        self.ctx = ctx  # the one place clients come from: store, registry, drivers, Ray APIs
        self.store = ctx.store
        self.registry = ctx.registry
        self.config = config
        self.windows = config.windows
        self.chat = chat
        self.specs = specs
        self._owner_map = owner_to_chat or config.owners.get
        self._links: dict[str, str] = {}  # Ray job owner -> chat id, linked by the people themselves
        self.holder = holder
        self.clock = clock
        self.ops: dict[str, Operation] = {}
        self._versions: dict[str, str] = {}
        self._leases: dict[str, Lease] = {}
        self._mutex: dict[str, asyncio.Lock] = {}
        self._edit_mutex: dict[str, asyncio.Lock] = {}  # one edit of an operation's message at a time
        self._shown: dict[str, str] = {}
        self._tasks: set[asyncio.Task] = set()
        self._pending: dict[str, list[str]] = {}  # progress lines not yet written, per operation
        self._flushers: dict[str, asyncio.Task] = {}
        self._flushed_at: dict[str, float] = {}  # monotonic time of the last progress write
        self._ticker: asyncio.Task | None = None
        self._tick_lock = asyncio.Lock()  # held during a tick: close() waits for it
        self.alive_s = config.windows.alive_s
        self._last_alive: datetime | None = None
        self._last_watch: datetime | None = None
        self._foreign: Foreign | None = None  # loaded on the first watch
        # Buttons whose target is "<prefix>:..." and no operation go to the handler of that prefix.
        self.targets: dict[str, Target] = {NEXT: self._next_operation}
        # Set on start when the liveness record was stale: since when the bot was down, for how long.
        self.down_since: datetime | None = None
        self.downtime_s = 0.0

    # -- life cycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load persisted operations and continue them; then check deadlines every tick."""
        await self._resume()
        self._ticker = asyncio.create_task(self._tick_loop(), name="clusterbot-ticker")

    async def close(self) -> None:
        """Stop ticking. Open operations stay persisted (and locked) for the next start.

        A tick in progress finishes first: cancelled between saving a new state and acting on it
        (say EXECUTING saved, its execution not yet started), it would leave a state without its
        action. Operations already executing go on; `wait_executing` waits for them."""
        if self._ticker:
            async with self._tick_lock:
                self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        for lease in self._leases.values():
            lease.stop_renewing()

    async def wait_executing(self, timeout: float) -> None:
        """Wait (bounded) until no operation is executing: the terminal chat's end of script."""
        deadline = time.monotonic() + timeout
        while any(op.state == State.EXECUTING for op in self.ops.values()) or self._tasks:
            if time.monotonic() > deadline:
                raise TimeoutError("an operation is still executing")
            await asyncio.sleep(0.2)

    # -- helpers ----------------------------------------------------------------------------------
    def is_admin(self, user: User) -> bool:
        r = self.config.rights
        # Ids only: a display name (or a role's name) is anyone's to change or create.
        return user.id in r.admins or bool(set(user.roles) & set(r.admin_roles))

    def owner_to_chat(self, owner: str) -> str | None:
        """The chat user of a Ray job owner: their own /link first, then the configured map."""
        return self._links.get(owner) or self._owner_map(owner)

    async def _load_links(self) -> str | None:
        got = await asyncio.to_thread(read_model, self.store, LINKS_KEY, Links)
        self._links = dict(got[0].owners) if got else {}
        return got[1] if got else None

    async def link(self, user: User, ray_user: str) -> Reply:
        """/link RAY_USER: `user` says the Ray jobs of `ray_user` are theirs, so they are asked about them."""
        ray_user = ray_user.strip()
        if not _RAY_USER.fullmatch(ray_user):
            return Reply(f"{ray_user!r} is not a Ray user name (letters, digits, . _ - and @)", ok=False)
        return await self._change_links(ray_user, user.id, by=user)

    async def unlink(self, admin: User, ray_user: str) -> Reply:
        """Admins undo a link (a wrong or abandoned one)."""
        if not self.is_admin(admin):
            return Reply("only an admin can unlink a Ray user", ok=False)
        return await self._change_links(ray_user.strip(), None, by=admin)

    async def _change_links(self, ray_user: str, chat_id: str | None, by: User) -> Reply:
        for _ in range(_LINK_TRIES):  # compare-and-set: another change in between means read again
            version = await self._load_links()
            now = self._links.get(ray_user)
            if chat_id is not None and now not in (None, chat_id):
                return Reply(
                    f"{ray_user} is linked to {self.chat.mention(now)}; an admin can /unlink it", ok=False
                )
            if now == chat_id:
                return Reply(f"{ray_user} is already {'linked to you' if chat_id else 'not linked'}")
            links = dict(self._links)
            if chat_id is None:
                links.pop(ray_user)
            else:
                links[ray_user] = chat_id
            body = dump(Links(owners=links))
            try:
                if version is None:
                    await asyncio.to_thread(self.store.create, LINKS_KEY, body)
                else:
                    await asyncio.to_thread(self.store.replace, LINKS_KEY, body, version)
            except Conflict:
                continue
            self._links = links
            await asyncio.to_thread(journal.append, self.store, "bot/links", "link" if chat_id else "unlink",
                                    ray_user=ray_user, chat_id=chat_id or now, by=by.id)  # fmt: skip
            if chat_id is None:
                return Reply(f"{ray_user} is no longer linked to {self.chat.mention(now)}")
            return Reply(f"linked: you are asked about the Ray jobs of {ray_user}")
        return Reply("the links changed on every try; try again", ok=False)

    def allowed(self, user: User, kind: str, cluster: str | None) -> str | None:
        """Why `user` may not do `kind` (on `cluster`), or None when they may: the configured rights."""
        if self.is_admin(user):
            return None
        r = self.config.rights
        on_cluster = r.clusters.get(cluster) if cluster is not None else None
        for scope, roles in (("command", r.commands.get(kind)), ("cluster", on_cluster)):
            if roles is not None and "*" not in roles and not set(user.roles) & set(roles):
                where = f"/{kind}" if scope == "command" else f"on {cluster}"
                return f"you may not {kind} {where}: it needs one of the roles {', '.join(roles)}"
        return None

    def _lock(self, op_id: str) -> asyncio.Lock:
        return self._mutex.setdefault(op_id, asyncio.Lock())

    async def _save(self, op: Operation) -> None:
        key = f"bot/ops/{op.op_id}.json"
        version = self._versions.get(op.op_id)
        try:
            if version is None:
                self._versions[op.op_id] = await asyncio.to_thread(self.store.create, key, dump(op))
            else:
                self._versions[op.op_id] = await asyncio.to_thread(self.store.replace, key, dump(op), version)
        except Conflict:  # written by an earlier life of this bot: take the newest and overwrite
            got = await asyncio.to_thread(self.store.read, key)
            self._versions[op.op_id] = await asyncio.to_thread(
                self.store.replace, key, dump(op), got.version if got else ""
            )
        self.ops[op.op_id] = op

    async def _journal(self, op: Operation, event: str, **data: Any) -> None:
        await asyncio.to_thread(journal.append, self.store, f"bot/journal/{op.op_id}", event, **data)

    def texts(self, op: Operation) -> Texts:
        """How `op` reads: its kind's texts (plain ones for a kind no longer registered)."""
        spec = self.specs.get(op.kind)
        return spec.texts if spec else PLAIN

    def render(self, op: Operation, chat: Chat | None = None) -> str:
        """`op`'s message as it reads now, in `chat`'s mentions and times (the engine's chat by default)."""
        chat = chat or self.chat
        return rules.render(op, self.clock(), chat.mention, chat.when, self.texts(op))

    def buttons(self, op: Operation) -> list[Button]:
        """The buttons `op`'s message offers now."""
        return rules.buttons(op, self.windows, self.texts(op))

    def _message(self, op: Operation, mentions: list[str] | None = None) -> Message:
        return Message(self.render(op), self.buttons(op), mentions or [], op_id=op.op_id)

    async def _show(self, op: Operation) -> None:
        """Edit the operation's message if what it shows changed. Edits of one message go one at a
        time, each showing the newest state when its turn comes, under a lock of their own: a click
        never waits for an edit held up by Discord's rate limit."""
        async with self._edit_mutex.setdefault(op.op_id, asyncio.Lock()):
            op = self.ops.get(op.op_id, op)  # saved before shown: the newest state
            if op.message_id is None:
                return
            message = self._message(op)
            shown = message.text + "|" + ",".join(b.action for b in message.buttons)
            if self._shown.get(op.op_id) == shown:
                return
            self._shown[op.op_id] = shown
            try:
                await self.chat.edit(op.message_id, message)
            except Exception:
                log.exception("could not edit the message of %s", op.op_id)

    async def _end(
        self, op: Operation, state: State, event: str, ping: str | None = None, **data: Any
    ) -> None:
        """Finish an operation that never executed: persist, release its lock, show it. `ping` tells the
        requester why, in a new message that mentions them (edits notify nobody)."""
        lease = self._leases.pop(op.op_id, None)
        if lease is not None:
            await asyncio.to_thread(lease.release)
        op.state = state
        await self._save(op)
        await self._journal(op, event, **data)
        await self._show(op)
        if ping is not None:
            who = op.requester.id
            text = (
                f"{self.chat.mention(who)}: your {self.texts(op).title(op)} (`{op.op_id}`) {ping}; "
                "nothing was done"
            )
            try:
                await self.chat.post(Message(text, mentions=[who], op_id=op.op_id))
            except Exception:  # the message shows it; only the ping is missed
                log.exception("could not ping the requester of %s", op.op_id)

    # -- requests ---------------------------------------------------------------------------------
    async def request(
        self, user: User, kind: str, cluster_name: str | None, params: dict[str, Any] | None = None
    ) -> Reply:
        """Someone asks for an operation (`cluster_name` None for one that takes no cluster). Bad input
        and refusals are answered to them alone."""
        spec = self.specs.get(kind)
        if spec is None:
            return Reply(f"unknown operation {kind!r}; valid: {', '.join(self.specs)}", ok=False)
        cluster_name = (cluster_name or "").strip() or None
        clusters = ", ".join(self.registry.clusters)
        if spec.needs_cluster and cluster_name is None and spec.infer_cluster is not None:
            try:
                cluster_name = await asyncio.to_thread(spec.infer_cluster, self, dict(params or {}))
            except OpsError as e:
                return Reply(str(e), ok=False)
        if spec.needs_cluster and cluster_name is None:
            return Reply(f"/{kind} needs a cluster; valid: {clusters}", ok=False)
        if not spec.needs_cluster and cluster_name is not None:
            return Reply(f"/{kind} takes no cluster (it was given {cluster_name!r})", ok=False)
        if cluster_name is not None and cluster_name not in self.registry.clusters:
            return Reply(f"unknown cluster {cluster_name!r}; valid: {clusters}", ok=False)
        cluster = self.registry.clusters[cluster_name] if cluster_name else None
        try:
            parsed = spec.params.model_validate(params or {})
        except ValidationError as e:
            return Reply(_bad_params(kind, spec.params, e), ok=False)
        needs_admin = [] if self.is_admin(user) else admin_only(parsed)
        if needs_admin:
            return Reply(f"{needs_admin[0]} is for admins", ok=False)
        if cluster is not None and cluster.protected and not getattr(parsed, "override", False):
            return Reply(
                f"{cluster.name} is protected: only read-only commands, unless an admin passes override",
                ok=False,
            )
        refused = self.allowed(user, kind, cluster_name)
        if refused:
            return Reply(refused, ok=False)
        if cluster is not None:
            busy = await self._busy(cluster.name)
            if busy:
                return busy
        op_id = new_op_id(cluster.name if cluster else kind)
        lease: Lease | None = None
        try:
            look = await asyncio.to_thread(spec.look, self, cluster, user, parsed)
            if cluster is not None:
                lease = await asyncio.to_thread(
                    acquire, self.store, cluster.name, op_id, kind, user.name, spec.lease_s, self.holder,
                    phase="announced",
                )  # fmt: skip
        except OpsError as e:  # taken meanwhile (two requests at once): the same answer as above
            busy = await self._busy(cluster.name) if cluster is not None else None
            return busy or Reply(str(e), ok=False)
        if lease is not None:
            self._leases[op_id] = lease
            lease.start_renewing()
        params = parsed.model_dump(mode="json")
        now = self.clock()
        op = Operation(
            op_id=op_id,
            kind=kind,
            cluster=cluster_name,
            requester=user,
            params=params,
            created_at=now,
            confirm_deadline=now + timedelta(seconds=self.windows.confirm_s),
            consent_deadline=now + timedelta(seconds=self.windows.consent_s),
            jobs_total=len(look.jobs),
            job_ids=[j.submission_id for j in look.jobs],
            notes=look.notes,
            unbacked=look.unbacked,
        )
        await self._load_links()
        for job in look.jobs:
            chat_id = self.owner_to_chat(job.owner) if job.owner else None
            if chat_id == user.id:
                continue
            if chat_id is None:
                op.unreachable_jobs += 1
                if job.owner_label not in op.unreachable_owners:
                    op.unreachable_owners.append(job.owner_label)
                continue
            entry = op.affected.setdefault(chat_id, Affected(chat_id=chat_id, owners=[], jobs=0))
            entry.jobs += 1
            entry.job_ids.append(job.submission_id)
            if job.owner not in entry.owners:
                entry.owners.append(job.owner)
        if spec.ceremony == "announce":
            op.confirmed = True
            op.state = State.EXECUTING
        await self._save(op)
        await self._journal(op, "announced", by=user.name, params=params, jobs=len(look.jobs),
                            affected=list(op.affected), unreachable=op.unreachable_jobs)  # fmt: skip
        announcement = self._message(op, mentions=list(op.affected))
        try:
            op.message_id = await self.chat.post(announcement)
        except Exception as e:  # nobody saw it: it must not hold the cluster
            log.exception("could not post the announcement of %s", op.op_id)
            await self._end(op.model_copy(update={"error": f"could not post the announcement: {e}"}),
                            State.FAILED, "announce_failed")  # fmt: skip
            return Reply(f"could not post the announcement in #infra ({type(e).__name__}); nothing was done",
                         ok=False)  # fmt: skip
        # What the message shows now: the first tick must not edit it to the same content.
        self._shown[op.op_id] = announcement.text + "|" + ",".join(b.action for b in announcement.buttons)
        await self._save(op)
        where = self._where(op.message_id)
        if spec.ceremony == "announce":
            self._spawn(self._execute(op))
            return Reply(f"{spec.texts.title(op)} announced in #infra{where} and started (`{op_id}`)")
        return Reply(f"announced `{op_id}` in #infra{where}: Confirm there to go ahead", ok=True)

    def _where(self, message_id: str) -> str:
        """` (link)` to the message, when the chat can link it."""
        try:
            url = self.chat.link(message_id)
        except Exception:  # a chat that cannot link: the reply goes without
            log.exception("could not link message %s", message_id)
            url = None
        return f" ({url})" if url else ""

    async def _busy(self, cluster: str) -> Reply | None:
        held = await asyncio.to_thread(current_lock, self.store, cluster)
        return None if held is None else Reply(f"{cluster} is busy: {held.describe()}", ok=False)

    async def act(
        self, user: User, op_id: str, action: str, arg: str = "", show_later: bool = False
    ) -> Reply:
        """A button click (or its terminal word) on an operation, or on another target (an alert).

        The click is recorded (state and journal) before the answer; with `show_later` the message's
        edit follows the answer instead of preceding it (Discord: the clicker reads their answer without
        waiting for the announcement's edit and its rate limit; everyone else sees the edit a moment
        later)."""
        if op_id not in self.ops:
            handler = self.targets.get(op_id.split(":", 1)[0]) if ":" in op_id else None
            if handler is not None:
                return await handler(user, op_id, action, arg)
            return Reply(f"no operation {op_id}", ok=False)
        # A refusal needs no I/O and stays a refusal (states only move forward): answered at once, not
        # behind the clicks that write (a burst of clicks on one announcement; issue 10).
        seen = self.ops[op_id]
        refused = rules.refusal(seen, user, action, self.is_admin(user), self.texts(seen))
        if refused:
            return Reply(refused, ok=False)
        async with self._lock(op_id):
            op = self.ops[op_id]
            texts = self.texts(op)
            refused = rules.refusal(op, user, action, self.is_admin(user), texts)
            if refused:
                return Reply(refused, ok=False)
            new, text = rules.apply(op, user, action, arg, self.clock(), self.windows, texts)
            if new == op:
                return Reply(text)
            if new.state == State.CANCELLED:
                ping = None if user.id == op.requester.id else f"was cancelled by {user.name}"
                await self._end(new, State.CANCELLED, "cancelled", ping, by=user.name, during=op.state.value)
                return Reply(text)
            # The journal's entry and the state are written at once, the state awaited in place (a
            # gather's tasks would cost a click two more turns of a loop busy with a burst; issue 10).
            journaled = asyncio.ensure_future(self._journal(new, action, by=user.name, arg=arg))
            try:
                await self._save(new)
            finally:
                await journaled
            await self._advance(new)
            if not show_later:
                await self._show(self.ops[op_id])
                return Reply(text)
        self._spawn(self._show(self.ops[op_id]))
        return Reply(text)

    async def _next_operation(self, user: User, target: str, action: str, arg: str = "") -> Reply:
        """A button on a report (`Outcome.buttons`): the operation it names, on its cluster, requested by
        the clicker with their own rights and the whole protocol."""
        if action not in self.specs:
            return Reply(f"no operation {action!r}", ok=False)
        return await self.request(user, action, arg or None, {})

    async def cancel(self, user: User, op_id: str | None = None) -> Reply:
        """/cancel: the given operation, or the caller's newest open one."""
        if op_id is None:
            mine = [o for o in self.ops.values() if o.requester.id == user.id
                    and rules.refusal(o, user, "cancel", self.is_admin(user)) is None]  # fmt: skip
            if not mine:
                return Reply("you have no operation that can still be cancelled", ok=False)
            op_id = max(mine, key=lambda o: o.created_at).op_id
        return await self.act(user, op_id, "cancel")

    def newest_for(self, user: User, action: str) -> Operation | None:
        """The newest open operation on which `user` may do `action` (the terminal's default)."""
        for op in sorted(self.ops.values(), key=lambda o: o.created_at, reverse=True):
            if op.open and rules.refusal(op, user, action, self.is_admin(user)) is None:
                return op
        return None

    async def unlock(self, user: User, cluster_name: str) -> Reply:
        """Admin force-unlock: whatever holds the cluster lets go; its open operation is cancelled."""
        if not self.is_admin(user):
            return Reply("only an admin can force-unlock a cluster", ok=False)
        if cluster_name not in self.registry.clusters:
            return Reply(
                f"unknown cluster {cluster_name!r}; valid: {', '.join(self.registry.clusters)}", ok=False
            )
        released = await asyncio.to_thread(force_unlock, self.store, cluster_name)
        for op in list(self.ops.values()):
            if op.cluster == cluster_name and op.open and op.state != State.EXECUTING:
                async with self._lock(op.op_id):
                    lease = self._leases.pop(op.op_id, None)
                    if lease is not None:
                        lease.stop_renewing()
                    op = op.model_copy(update={"cancelled_by": f"{user.name} (force-unlock)"})
                    ping = f"was cancelled: {user.name} force-unlocked {cluster_name}"
                    await self._end(op, State.CANCELLED, "force_unlocked", ping, by=user.name)
        if released is None:
            return Reply(f"{cluster_name} was not locked", ephemeral=False)
        return Reply(
            f"{user.name} force-unlocked {cluster_name} (was: {released.describe()})", ephemeral=False
        )

    # -- read-only ------------------------------------------------------------------------------------
    async def status(self, cluster_name: str | None = None) -> Reply:
        from ops.render import render_status
        from ops.status import cluster_status

        names = [cluster_name] if cluster_name else list(self.registry.clusters)
        bad = [n for n in names if n not in self.registry.clusters]
        if bad:
            return Reply(f"unknown cluster {bad[0]!r}; valid: {', '.join(self.registry.clusters)}", ok=False)
        reports = await asyncio.gather(
            *(asyncio.to_thread(cluster_status, self.ctx, self.registry.clusters[n]) for n in names)
        )
        return Reply("\n\n".join(render_status(r) for r in reports), ephemeral=False)

    async def jobs(self, cluster_name: str) -> Reply:
        from ops.jobs import active_jobs
        from ops.render import render_jobs

        if cluster_name not in self.registry.clusters:
            return Reply(
                f"unknown cluster {cluster_name!r}; valid: {', '.join(self.registry.clusters)}", ok=False
            )
        try:
            cluster = self.registry.clusters[cluster_name]
            jobs = await asyncio.to_thread(lambda: active_jobs(self.ctx.ray(cluster)))
        except OpsError as e:
            return Reply(str(e), ok=False)
        return Reply(f"{cluster_name}:\n" + render_jobs(jobs), ephemeral=False)

    # -- time -----------------------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        while True:
            async with self._tick_lock:
                try:
                    await self.tick()
                except Exception:
                    log.exception("tick failed")
            await asyncio.sleep(self.windows.tick_s)

    async def tick(self) -> None:
        """Move operations whose deadlines passed; every `alive_s`, note that the bot is alive.

        The liveness record is one object GCS rate-limits (a write per second): written on its own
        interval, and a failed write does not hold up the deadlines."""
        now = self.clock()
        if self._last_alive is None or (now - self._last_alive).total_seconds() >= self.alive_s:
            self._last_alive = now
            try:
                body = dump(_Alive(at=now, every_s=self.alive_s))
                await asyncio.to_thread(self.store.put, ALIVE_KEY, body)
            except Exception as e:  # the next interval tries again; the windows go on meanwhile
                log.warning("could not write %s: %s: %s", ALIVE_KEY, type(e).__name__, e)
        if self._last_watch is None or (now - self._last_watch).total_seconds() >= FOREIGN_EVERY_S:
            self._last_watch = now
            try:
                await self._watch_foreign()
            except Exception:  # the next watch tries again; the deadlines go on
                log.exception("could not show the operations run outside the bot")
        for op_id in [o.op_id for o in self.ops.values() if o.state in (State.AWAITING, State.GRACE)]:
            async with self._lock(op_id):
                op = self.ops[op_id]
                lease = self._leases.get(op_id)
                if op.state in (State.AWAITING, State.GRACE) and lease is not None and lease.lost:
                    # `ops unlock` (or an admin elsewhere) cleared the lock: the operation is over.
                    op = op.model_copy(
                        update={"cancelled_by": "an unlock outside the bot (its lock was cleared)"}
                    )
                    await self._end(
                        op, State.CANCELLED, "lock_lost", ping="was cancelled: its lock was cleared"
                    )
                    continue
                if op.state in (State.AWAITING, State.GRACE):
                    await self._advance(op)
                    await self._show(self.ops[op_id])

    async def _watch_foreign(self) -> None:
        """Show in #infra what holds a cluster without the bot (a CLI restart): one message per
        operation, edited as its step changes, a last edit when its lock goes. What was posted is kept in
        the store so that a restarted bot does not post it again."""
        from ops.locks import LockRecord

        if self._foreign is None:
            got = await asyncio.to_thread(read_model, self.store, FOREIGN_KEY, Foreign)
            self._foreign = got[0] if got else Foreign()
        changed = False
        for key in await asyncio.to_thread(self.store.list, "locks/"):
            got = await asyncio.to_thread(read_model, self.store, key, LockRecord)
            if got is None:
                continue
            lock = got[0]
            shown = self._foreign.clusters.get(lock.cluster)
            ours = lock.holder == self.holder
            if not lock.released and not ours:
                seen = await self._outside(lock.kind, lock.cluster, lock.op_id)
                what = f"{lock.kind} of {lock.cluster} (`{lock.op_id}`) by {lock.owner}"
                text = f"{what}, run outside the bot: {seen.step if seen else 'running'}"
                if seen and seen.error:
                    text += f"\nlast error: {seen.error}"
                if shown is None or shown.op_id != lock.op_id:
                    if shown is not None and not shown.ended:
                        await self._end_foreign(shown, "ended")
                    mid = await self.chat.post(Message(text))
                    self._foreign.clusters[lock.cluster] = Shown(
                        op_id=lock.op_id, kind=lock.kind, message_id=mid, text=text
                    )
                    changed = True
                elif text != shown.text:
                    await self.chat.edit(shown.message_id, Message(text))
                    shown.text, changed = text, True
            elif shown is not None and not shown.ended and (lock.released or lock.op_id != shown.op_id):
                seen = await self._outside(shown.kind, lock.cluster, shown.op_id)
                await self._end_foreign(shown, (seen.ended if seen else None) or "unlocked")
                changed = True
        if changed:
            await asyncio.to_thread(self.store.put, FOREIGN_KEY, dump(self._foreign))

    async def _outside(self, kind: str, cluster: str, op_id: str) -> Outside | None:
        """What an operation run outside the bot says of itself, if its kind can tell."""
        spec = self.specs.get(kind)
        if spec is None or spec.outside is None:
            return None
        return await asyncio.to_thread(spec.outside, self.store, cluster, op_id)

    async def _end_foreign(self, shown: Shown, end: str) -> None:
        shown.text = shown.text.rsplit(": ", 1)[0].split("\n")[0] + f": {end}"
        shown.ended = True
        await self.chat.edit(shown.message_id, Message(shown.text))

    async def _advance(self, op: Operation) -> None:
        """Apply the clock to an operation (called under its mutex)."""
        now = self.clock()
        if (
            op.state == State.AWAITING
            and not op.confirmed
            and op.confirm_deadline
            and now >= op.confirm_deadline
        ):
            await self._end(op, State.EXPIRED, "expired", "expired: it was not confirmed in time")
            return
        if rules.ready_for_grace(op, now):
            grace = now + timedelta(seconds=self.windows.grace_s)
            op = op.model_copy(update={"state": State.GRACE, "grace_deadline": grace})
            await self._save(op)
            await self._journal(op, "grace", why=rules.consent(op, now)[1])
        if op.state == State.GRACE and op.grace_deadline and now >= op.grace_deadline:
            op = op.model_copy(update={"state": State.EXECUTING})
            await self._save(op)
            await self._journal(op, "executing")
            self._spawn(self._execute(op))

    # -- execution ------------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, op: Operation) -> None:
        spec = self.specs[op.kind]
        texts = spec.texts
        loop = asyncio.get_running_loop()
        await self._show(op)
        self._flushed_at[op.op_id] = time.monotonic()  # that edit counts against the rate

        def progress(line: str) -> None:
            loop.call_soon_threadsafe(self._queue_progress, op.op_id, line)

        lease = self._leases.pop(op.op_id, None)
        if lease is None and op.cluster is not None:
            lease = await self._take_back(op, spec.lease_s)
        try:
            if lease is not None:  # whoever asks for the cluster now hears it is running
                await asyncio.to_thread(lease.set_phase, "executing")
            try:
                outcome = await asyncio.to_thread(spec.execute, self, op, lease, progress)
            finally:
                if lease is not None and not spec.owns_lock:  # what runs no more holds nothing
                    await self._release(op, lease)
        except Exception as e:
            if not isinstance(e, OpsError):
                log.exception("operation %s failed", op.op_id)
            error = str(e) if isinstance(e, OpsError) else f"unexpected error: {type(e).__name__}: {e}"
            held = False
            if op.cluster is not None:
                lock = await asyncio.to_thread(current_lock, self.store, op.cluster)
                held = lock is not None and lock.op_id == op.op_id
            report = Message(
                f"{texts.title(op)} FAILED (`{op.op_id}`), asked by {self.chat.mention(op.requester.id)}: "
                f"{error}\n{texts.failed(op, held)}",
                mentions=[op.requester.id],
            )
            await self._finish(op.op_id, State.FAILED, report, error=error)
            return
        owners = sorted({c for o in outcome.owners if o and (c := self.owner_to_chat(o))})
        lines = [f"{texts.title(op)} is done (`{op.op_id}`), asked by {op.requester.name}", outcome.text]
        if owners:
            lines.append(texts.owners(" ".join(self.chat.mention(c) for c in owners)))
        report = Message("\n".join(lines), outcome.buttons, mentions=owners,
                         op_id=f"{NEXT}:{op.op_id}" if outcome.buttons else None)  # fmt: skip
        await self._finish(op.op_id, State.DONE, report, result=outcome.text)

    async def _take_back(self, op: Operation, lease_s: float) -> Lease | None:
        """The lock of an operation that was executing when the bot went down, taken back (the same
        holder may, at once). None when it is not the operation's any more (a restart that finished
        meanwhile released it; an unlock cleared it): the operation's `execute` says what that means."""
        try:
            lease = await asyncio.to_thread(
                take_over, self.store, op.cluster, op.op_id, op.requester.name, lease_s, self.holder
            )
        except OpsError as e:
            log.warning("%s: its lock was not taken back: %s", op.op_id, e)
            return None
        lease.start_renewing()
        return lease

    async def _release(self, op: Operation, lease: Lease) -> None:
        """Let go of an executed operation's lock; one cleared meanwhile (an unlock) is nothing to undo."""
        try:
            await asyncio.to_thread(lease.release)
        except OpsError as e:
            log.warning("could not release the lock of %s: %s", op.op_id, e)

    def _queue_progress(self, op_id: str, line: str) -> None:
        """Progress lines wait in memory and land together: at most one store write of the operation
        and one chat edit per PROGRESS_EVERY_S (GCS allows one write per second per object)."""
        self._pending.setdefault(op_id, []).append(line)
        flusher = self._flushers.get(op_id)
        if flusher is None or flusher.done():
            self._flushers[op_id] = asyncio.create_task(self._flush_progress(op_id))

    async def _wait_rate(self, op_id: str) -> None:
        wait = self._flushed_at.get(op_id, -PROGRESS_EVERY_S) + PROGRESS_EVERY_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _flush_progress(self, op_id: str) -> None:
        while self._pending.get(op_id):
            await self._wait_rate(op_id)
            async with self._lock(op_id):
                lines = self._pending.pop(op_id, [])
                if lines:
                    await self._land(op_id, lines)

    async def _land(self, op_id: str, lines: list[str], **changes: Any) -> None:
        """Write progress lines (and changes) in one store write and one edit (under the op's mutex)."""
        op = self.ops[op_id].model_copy(deep=True, update=changes)
        op.progress += [self._public(line) for line in lines]
        self._flushed_at[op_id] = time.monotonic()
        await self._save(op)
        await self._show(op)

    def _public(self, line: str) -> str:
        """A progress line as chat may read it: where the store keeps backups is not for the channel."""
        return _PATH.sub("(path hidden)", line.replace(self.store.url, "the store"))

    async def _finish(self, op_id: str, state: State, report: Message, **changes: Any) -> None:
        """Record the end of an execution with the progress lines still waiting, then report it in a new
        message (edits notify nobody): the report always comes after the last progress line."""
        async with self._lock(op_id):
            lines = self._pending.pop(op_id, [])
            await self._wait_rate(op_id)
            await self._land(op_id, lines, state=state, **changes)
            op = self.ops[op_id]
            await self._journal(op, state.value, **changes)
        flusher = self._flushers.pop(op_id, None)
        if flusher is not None:  # nothing is left for it to write
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        try:
            await self.chat.post(report)
        except Exception:  # the state and the journal have it; the channel missed the report
            log.exception("could not post the report of %s", op_id)

    # -- start-up -------------------------------------------------------------------------------------
    async def _resume(self) -> None:
        await self._load_links()
        keys = await asyncio.to_thread(self.store.list, "bot/ops/")
        for key in keys:
            got = await asyncio.to_thread(read_model, self.store, key, Operation)
            if got is not None:
                self.ops[got[0].op_id], self._versions[got[0].op_id] = got
        alive = await asyncio.to_thread(read_model, self.store, ALIVE_KEY, _Alive)
        # Down since some time after the last liveness write: the gap beyond one interval.
        gap = (self.clock() - alive[0].at).total_seconds() if alive else 0.0
        downtime = max(gap - alive[0].every_s, 0.0) if alive else 0.0
        if alive and downtime > 0:
            self.down_since, self.downtime_s = alive[0].at, downtime
        for op in [o for o in self.ops.values() if o.state not in TERMINAL]:
            await self._journal(op, "resumed", at_state=op.state.value, downtime_s=round(downtime, 1))
            if op.state == State.EXECUTING and op.kind in self.specs:
                self._spawn(self._execute(op))
                continue
            spec = self.specs.get(op.kind)
            if spec is None:  # its kind was unregistered: nothing here can run it, nor should it hold a lock
                if op.cluster is not None:
                    with contextlib.suppress(OpsError):
                        self._leases[op.op_id] = await asyncio.to_thread(
                            take_over, self.store, op.cluster, op.op_id, op.requester.name, 60.0, self.holder
                        )
                op = op.model_copy(update={"error": f"this bot runs no {op.kind!r} any more"})
                await self._end(op, State.FAILED, "unknown_kind")
                continue
            try:
                if op.cluster is not None:
                    lease = await asyncio.to_thread(
                        take_over, self.store, op.cluster, op.op_id, op.requester.name, spec.lease_s,
                        self.holder,
                    )  # fmt: skip
            except OpsError as e:
                op = op.model_copy(
                    update={"cancelled_by": f"nobody (the lock went while the bot was down: {e})"}
                )
                await self._end(
                    op, State.CANCELLED, "lost_lock", "was cancelled: its lock went while the bot was down"
                )
                continue
            if op.cluster is not None:
                lease.start_renewing()
                self._leases[op.op_id] = lease
            if downtime > 0:
                op = rules.extend(op, downtime)
                await self._save(op)
            await self._show(op)
