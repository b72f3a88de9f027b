"""The workers family: /add-worker, /workers and /clean-preempted.

`/add-worker v6e-8 reserved` reads exactly so: the type and the capacity first, the cluster optional.
Left out, the cluster is the one whose reservation or zone takes the type (`ops.workers`); when several
could, the caller is told which, and the cluster option's autocomplete offers just those to pick from.
/clean-preempted is declared from its spec in one line. /workers just answers (the ledger beside the
cloud and Ray), publicly.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_publicly, cluster_choices, send, user_of
from bot.adapters.cogs.operations import operation_command
from bot.operations import add_worker as add_worker_op
from bot.operations import registered
from bot.protocol.model import Reply
from ops.errors import OpsError
from ops.workers import MAX_COUNT, candidates, workers_view

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


class Workers(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    clean_preempted = operation_command(registered()["clean-preempted"])

    @app_commands.command(name="add-worker", description="Add TPU capacity to a cluster: announced in #infra")
    @app_commands.describe(
        tpu_type="The TPU type, e.g. v6e-8 (one the cluster's zone offers)",
        capacity="reserved, spot (preemptible is the same) or best-effort",
        cluster="The cluster (default: the one whose reservation or zone takes the type)",
        count="How many slices",
        reason="Why: shown in the announcement and the ledger",
        for_hours="Hours you need it; then you are reminded",
    )
    async def add_worker(
        self,
        interaction: discord.Interaction[Any],
        tpu_type: str,
        capacity: Literal["reserved", "spot", "preemptible", "best-effort"],
        cluster: str | None = None,
        count: app_commands.Range[int, 1, MAX_COUNT] = 1,
        reason: str = "",
        for_hours: float | None = None,
    ) -> None:
        # Inferring the cluster and looking before acting read the cloud (cached types): defer first.
        await interaction.response.defer(ephemeral=True, thinking=True)
        name = cluster.strip() if cluster else None
        if name is None:
            try:
                name = await asyncio.to_thread(add_worker_op.infer_cluster, self.engine, tpu_type.strip())
            except OpsError as e:
                await send(interaction, str(e), ephemeral=True)
                return
        params: dict[str, Any] = {"tpu_type": tpu_type.strip(), "capacity": capacity, "count": count,
                                  "reason": reason, "for_hours": for_hours}  # fmt: skip
        reply = await self.engine.request(user_of(interaction.user), "add-worker", name, params)
        await send(interaction, reply.text, ephemeral=True)

    @add_worker.autocomplete("cluster")
    async def add_worker_cluster(
        self, interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        """The clusters the typed TPU type could go to; every cluster before a type is typed."""
        tpu_type = str(getattr(interaction.namespace, "tpu_type", "") or "").strip()
        if not tpu_type:
            return await cluster_choices(interaction, current)
        names = await asyncio.to_thread(candidates, self.engine.ctx, tpu_type)
        return [app_commands.Choice(name=n, value=n) for n in names if current.strip() in n][:25]

    @app_commands.command(name="workers", description="Added workers: the ledger beside the cloud and Ray")
    @app_commands.describe(cluster="The cluster")
    @app_commands.autocomplete(cluster=cluster_choices)
    async def workers(self, interaction: discord.Interaction[Any], cluster: str) -> None:
        name = cluster.strip()
        valid = name in self.engine.registry.clusters
        await answer_publicly(interaction, valid, self._workers(name), code=True)

    async def _workers(self, name: str) -> Reply:
        if name not in self.engine.registry.clusters:
            return Reply(
                f"unknown cluster {name!r}; valid: {', '.join(self.engine.registry.clusters)}", ok=False
            )
        try:
            view = await asyncio.to_thread(workers_view, self.engine.ctx, name)
        except OpsError as e:
            return Reply(str(e), ok=False)
        return Reply(view.summary(), ephemeral=False)
