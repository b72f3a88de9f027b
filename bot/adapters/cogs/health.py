"""/health [cluster]: the snapshot the scheduled alerts judge (Ray's view and the cloud's, a verdict
with its evidence and the action to take), now. Public, like /status; bad input to the caller alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_read, cluster_choices
from ops.shared_reads import SharedReads

if TYPE_CHECKING:
    from bot.alerts.monitor import Monitor

READ_TTL_S = 1.0  # as /status: overlapping identical asks share one check


class Health(commands.Cog):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.reads = SharedReads(ttl_s=READ_TTL_S)

    @app_commands.command(name="health", description="Verdict, evidence and what to do, per cluster")
    @app_commands.describe(cluster="One cluster (all when omitted)")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def health(self, interaction: discord.Interaction[Any], cluster: str | None = None) -> None:
        name = cluster.strip() if cluster else None
        valid = name is None or name in self.monitor.engine.registry.clusters
        await answer_read(interaction, valid, self.reads, ("health", name), self.monitor.health, name)
