"""The protocol's commands: each operation's (/restart: announce, consent, grace, execute), /cancel, /unlock.

An operation's command is declared in one line, `<name> = operation_command(spec)`, in a cog's class
body: its options come from the operation's parameter model (see `bot/operations/__init__.py`).

/unlock carries Discord's `default_permissions` (administrator), so Discord shows it to admins only
(a server admin may grant it to a role in the server's Integrations settings); whoever sends it, the
engine still checks the bot's own admins.

The engine validates and decides everything; these commands only pick the visibility of the answer
and keep the 3-second deadline. The announcement itself is a channel message the engine posts and
edits through the bot's `Chat` methods, not an interaction response (tokens die after 15 minutes).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_privately, answer_publicly, cluster_choices, send, user_of
from bot.operations import registered
from bot.protocol import rules
from bot.protocol.model import AdminOnly, Spec

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


def operation_command(spec: Spec) -> app_commands.Command[Any, ..., None]:
    """The slash command of an operation, for a cog's class body: `/<kind> [cluster] <parameters>`, the
    parameters' types, defaults and descriptions taken from `spec.params` (admin-only ones last), the
    cluster autocompleted."""
    kind = spec.kind

    async def callback(cog: Any, interaction: discord.Interaction[Any], **values: Any) -> None:
        # Looking before acting and taking the lock touch Ray and the store: defer first, ephemerally,
        # since every answer here is for the caller (the announcement is the public part).
        await interaction.response.defer(ephemeral=True, thinking=True)
        cluster = values.pop("cluster", None)
        reply = await cog.engine.request(user_of(interaction.user), kind, cluster, values)
        await send(interaction, reply.text, ephemeral=True)

    P = inspect.Parameter
    params = [
        P("cog", P.POSITIONAL_OR_KEYWORD),
        P("interaction", P.POSITIONAL_OR_KEYWORD, annotation=discord.Interaction),
    ]
    described = {}
    if spec.needs_cluster:
        params.append(P("cluster", P.POSITIONAL_OR_KEYWORD, annotation=str))
        described["cluster"] = spec.cluster_help
    fields = spec.params.model_fields.items()
    for name, info in sorted(fields, key=lambda f: any(isinstance(m, AdminOnly) for m in f[1].metadata)):
        default = P.empty if info.is_required() else info.get_default(call_default_factory=True)
        params.append(P(name, P.POSITIONAL_OR_KEYWORD, annotation=info.annotation, default=default))
        described[name] = info.description or name
    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__name__ = kind.replace("-", "_")
    callback.__qualname__ = f"Operations.{callback.__name__}"  # a method: discord.py skips the cog argument
    app_commands.describe(**described)(callback)
    if spec.needs_cluster:
        app_commands.autocomplete(cluster=cluster_choices)(callback)
    return app_commands.Command(name=kind, description=spec.summary or kind, callback=callback)


class Operations(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    restart = operation_command(registered()["restart"])
    rotate_token = operation_command(registered()["rotate-token"])

    @app_commands.command(name="cancel", description="Cancel an operation (your newest when omitted)")
    @app_commands.describe(operation="The operation id (see the announcement)")
    async def cancel(self, interaction: discord.Interaction[Any], operation: str | None = None) -> None:
        user = user_of(interaction.user)
        await answer_privately(
            interaction, self.engine.cancel(user, operation.strip() if operation else None)
        )

    @cancel.autocomplete("operation")
    async def cancel_operation(
        self, interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        user = user_of(interaction.user)
        admin = self.engine.is_admin(user)
        ops = sorted(self.engine.ops.values(), key=lambda o: o.created_at, reverse=True)
        out = []
        for op in ops:
            if op.open and current in op.op_id and rules.refusal(op, user, "cancel", admin) is None:
                label = f"{self.engine.texts(op).title(op)}, asked by {op.requester.name} ({op.op_id})"
                out.append(app_commands.Choice(name=label[:100], value=op.op_id))
        return out[:25]

    @app_commands.command(name="unlock", description="Admins: force-unlock a cluster (cancels its operation)")
    @app_commands.default_permissions(administrator=True)  # shown to Discord admins; the engine decides
    @app_commands.describe(cluster="The cluster whose lock to release")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def unlock(self, interaction: discord.Interaction[Any], cluster: str) -> None:
        user = user_of(interaction.user)
        cluster = cluster.strip()
        # A force-unlock is answered in the channel, for everyone to see; a refusal to the caller.
        valid = self.engine.is_admin(user) and cluster in self.engine.registry.clusters
        await answer_publicly(interaction, valid, self.engine.unlock(user, cluster))
