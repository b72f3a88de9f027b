"""The read-only commands, which just answer: /status [cluster] and /jobs cluster (as `ops status`,
`ops jobs`). Their answers are public; bad input is answered to the caller alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_publicly, cluster_choices

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


class ReadOnly(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @app_commands.command(name="status", description="Head, workers, jobs by owner, operation in progress")
    @app_commands.describe(cluster="One cluster (all when omitted)")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def status(self, interaction: discord.Interaction[Any], cluster: str | None = None) -> None:
        name = cluster.strip() if cluster else None
        valid = name is None or name in self.engine.registry.clusters
        await answer_publicly(interaction, valid, self.engine.status(name), code=True)

    @app_commands.command(name="jobs", description="A cluster's running and pending jobs, and their owners")
    @app_commands.describe(cluster="The cluster")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def jobs(self, interaction: discord.Interaction[Any], cluster: str) -> None:
        name = cluster.strip()
        valid = name in self.engine.registry.clusters
        await answer_publicly(interaction, valid, self.engine.jobs(name), code=True)
