"""The Discord bot's command families, one Cog per module, and what they share.

`operations` holds the protocol's commands (/restart, /cancel, /unlock); `readonly` the commands that
just answer (/status, /jobs); `owners` who owns which Ray jobs (/link, /unlink). Each Cog gets the
engine in its constructor and knows no store, no Ray: it turns an interaction into an engine call and
the engine's `Reply` into an interaction response.

Shared here: the chat user of an interaction, cluster autocomplete, and answering within Discord's
3-second deadline (answer at once when the work is quick, else defer and follow up).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot.protocol.model import Reply, User
from ops.shared_reads import SharedReads

if TYPE_CHECKING:
    from bot.protocol.engine import Engine

CONTENT_LIMIT = 2000  # Discord refuses longer message content (50035 Invalid Form Body)
ANSWER_BUDGET_S = 1.0  # work that takes longer than this is deferred first (the deadline is 3 s)
NO_PINGS = discord.AllowedMentions.none()


def user_of(who: discord.Member | discord.User) -> User:
    """The engine's view of a Discord user: id, username, and role ids (guild members only; rights
    name roles by id, since anyone who may create a role may give it any name)."""
    roles = [str(r.id) for r in who.roles if not r.is_default()] if isinstance(who, discord.Member) else []
    return User(id=str(who.id), name=who.name, roles=roles)


def fit(text: str, limit: int = CONTENT_LIMIT) -> str:
    """Text cut to what Discord accepts, saying that it was cut."""
    if len(text) <= limit:
        return text
    tail = "\n… (cut: too long for one Discord message)"
    return text[: limit - len(tail)] + tail


def code_block(text: str) -> str:
    """Column-aligned ops output as a code block, cut to the limit without breaking the fence."""
    return "```\n" + fit(text, CONTENT_LIMIT - 8) + "\n```"


def engine_of(interaction: discord.Interaction[Any]) -> Engine:
    return interaction.client.engine  # type: ignore[attr-defined]  # a ClusterBot


async def send(interaction: discord.Interaction[Any], text: str, *, ephemeral: bool) -> None:
    """The answer: the initial response if none was sent yet, else a follow-up (which keeps the
    defer's visibility; FINDINGS: choose visibility when deferring). Answers never ping anyone."""
    text = fit(text)
    if interaction.response.is_done():
        await interaction.followup.send(text, ephemeral=ephemeral, allowed_mentions=NO_PINGS)
    else:
        await interaction.response.send_message(text, ephemeral=ephemeral, allowed_mentions=NO_PINGS)


async def answer_privately(
    interaction: discord.Interaction[Any], work: Awaitable[Reply], budget: float = ANSWER_BUDGET_S
) -> Reply:
    """Answer `work`'s reply to the caller alone: directly when it is ready within `budget`, else
    after an ephemeral defer, so the 3-second deadline holds even when the store or Discord is slow."""
    reply = await _reply_within(interaction, work, budget, ephemeral=True)
    await send(interaction, reply.text, ephemeral=True)
    return reply


async def answer_publicly(
    interaction: discord.Interaction[Any],
    valid: bool,
    work: Awaitable[Reply],
    code: bool = False,
    budget: float = 0.0,
) -> Reply:
    """Answer `work` in the channel, except bad input (`valid` False: the engine refuses it without
    any I/O), which is answered at once to the caller alone. A reply ready within `budget` is the
    acknowledgement itself (one request to Discord instead of a defer and a follow-up)."""
    if not valid:
        reply = await work
        await send(interaction, reply.text, ephemeral=True)
        return reply
    reply = await _reply_within(interaction, work, budget, ephemeral=False)
    text = code_block(reply.text) if code and reply.ok else reply.text
    await send(interaction, text, ephemeral=False)
    return reply


async def _reply_within(
    interaction: discord.Interaction[Any], work: Awaitable[Reply], budget: float, *, ephemeral: bool
) -> Reply:
    """`work`'s reply, awaited in place: a reply that needs no I/O (a refused click, a fresh read)
    costs no turn of the event loop, which under a burst of 50 means not queueing behind the 49
    others (issue 10; a task and `asyncio.wait` cost three turns). Work still running after `budget`
    has the interaction deferred meanwhile, with the answer's visibility (the follow-up keeps it);
    a budget of 0 defers before the work starts."""
    defer = lambda: interaction.response.defer(ephemeral=ephemeral, thinking=True)  # noqa: E731
    if budget <= 0:
        try:
            await defer()
        except BaseException:
            if inspect.iscoroutine(work):
                work.close()  # not acknowledged: nothing done
            raise
        return await work
    loop = asyncio.get_running_loop()
    deferring: list[asyncio.Task[None]] = []
    timer = loop.call_later(budget, lambda: deferring.append(loop.create_task(defer())))
    try:
        return await work
    finally:
        timer.cancel()
        if deferring:
            await deferring[0]


async def answer_read(
    interaction: discord.Interaction[Any],
    valid: bool,
    reads: SharedReads,
    key: Hashable,
    read: Callable[..., Awaitable[Reply]],
    *args: Any,
) -> Reply:
    """A read-only command's public answer: the answer itself when an identical read finished less
    than `reads.ttl_s` ago (one request to Discord), else an acknowledgement at once and the answer as
    a follow-up (a burst's acknowledgements never wait for the read; measured in bench/bot.py)."""
    hit, reply = reads.peek(key)
    if hit:
        return await answer_publicly(interaction, valid, _ready(reply), code=True, budget=1.0)
    return await answer_publicly(interaction, valid, reads.aget(key, read, *args), code=True)


async def _ready(reply: Reply) -> Reply:
    return reply


async def cluster_choices(
    interaction: discord.Interaction[Any], current: str
) -> list[app_commands.Choice[str]]:
    """Autocomplete: registered clusters whose name contains what was typed (the engine validates
    the value all the same: autocomplete can be bypassed)."""
    registry = engine_of(interaction).registry
    typed = current.strip().lower()
    out = []
    for name, cluster in registry.clusters.items():
        if typed in name.lower():
            label = f"{name} (protected: read-only unless an admin overrides)" if cluster.protected else name
            out.append(app_commands.Choice(name=label[:100], value=name))
    return out[:25]
