"""The read-only commands, which just answer: /status [cluster] and /jobs cluster (as `ops status`,
`ops jobs`). Their answers are public; bad input is answered to the caller alone.

Fast under a burst (issue 10): identical reads that overlap, or come within a second of each other,
share one engine call (`ops.shared_reads`), so 50 people asking `/jobs local` at once read the
dashboard once and their acknowledgements do not queue behind 50 threads; an answer read less than a
second ago is the acknowledgement itself, any other is acknowledged at once and followed up
(`answer_read`); jobs are read as the dashboard's JSON, not through Ray's job client (no Ray in the
bot's process for a read); and the modules a read needs are imported while the cog loads, before the
bot says it is ready, not in the middle of the first burst (`Context.warm`).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_read, cluster_choices
from ops.shared_reads import SharedReads

if TYPE_CHECKING:
    from bot.protocol.engine import Engine

READ_TTL_S = 1.0  # how old an answer may be: a second-old /status is as good as a fresh one
WARM_MODULES = ("ops.status", "ops.jobs", "ops.render", "ops.health")


class ReadOnly(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.reads = SharedReads(ttl_s=READ_TTL_S)

    async def cog_load(self) -> None:
        """Import what reads need and make the clusters' drivers (in a thread: the loop keeps serving
        the gateway handshake)."""

        def warm() -> None:
            for module in WARM_MODULES:
                importlib.import_module(module)
            self.engine.ctx.warm()

        await asyncio.to_thread(warm)

    @app_commands.command(name="status", description="Head, workers, jobs by owner, operation in progress")
    @app_commands.describe(cluster="One cluster (all when omitted)")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def status(self, interaction: discord.Interaction[Any], cluster: str | None = None) -> None:
        name = cluster.strip() if cluster else None
        valid = name is None or name in self.engine.registry.clusters
        await answer_read(interaction, valid, self.reads, ("status", name), self.engine.status, name)

    @app_commands.command(name="jobs", description="A cluster's running and pending jobs, and their owners")
    @app_commands.describe(cluster="The cluster")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def jobs(self, interaction: discord.Interaction[Any], cluster: str) -> None:
        name = cluster.strip()
        valid = name in self.engine.registry.clusters
        await answer_read(interaction, valid, self.reads, ("jobs", name), self.engine.jobs, name)
