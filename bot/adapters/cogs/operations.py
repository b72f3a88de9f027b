"""The protocol's commands: /restart (announce, consent, grace, execute), /cancel, /unlock.

/unlock carries Discord's `default_permissions` (administrator), so Discord shows it to admins only
(a server admin may grant it to a role in the server's Integrations settings); whoever sends it, the
engine still checks the bot's own admins.

The engine validates and decides everything; these commands only pick the visibility of the answer
and keep the 3-second deadline. The announcement itself is a channel message the engine posts and
edits through the bot's `Chat` methods, not an interaction response (tokens die after 15 minutes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_privately, answer_publicly, cluster_choices, send, user_of
from bot.protocol import rules

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


class Operations(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @app_commands.command(name="restart", description="Restart a cluster: announced in #infra, with consent")
    @app_commands.describe(
        cluster="The cluster to restart",
        preserve_jobs="Back up running and pending jobs and resubmit them after the restart",
        override="Admins only: allow a protected cluster (big-run)",
        force_unbacked="Admins only: restart even if the head does not answer: jobs are NOT backed up",
    )
    @app_commands.autocomplete(cluster=cluster_choices)
    async def restart(
        self,
        interaction: discord.Interaction[Any],
        cluster: str,
        preserve_jobs: bool = True,
        override: bool = False,
        force_unbacked: bool = False,
    ) -> None:
        # Looking at the cluster's jobs and taking the lock touch Ray and the store: defer first,
        # ephemerally, since every answer here is for the caller (the announcement is the public part).
        await interaction.response.defer(ephemeral=True, thinking=True)
        params = {"preserve_jobs": preserve_jobs, "override": override, "force_unbacked": force_unbacked}
        reply = await self.engine.request(user_of(interaction.user), "restart", cluster.strip(), params)
        await send(interaction, reply.text, ephemeral=True)

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
                label = f"{rules.describe(op)}, asked by {op.requester.name} ({op.op_id})"
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
