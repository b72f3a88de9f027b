"""The reference of the bot benchmark: a minimal discord.py bot with the same commands and buttons as
clusterbot that answers each one at once with a fixed text (no engine, no store, no Ray).

What clusterbot is held to is this bot's latency in the same run, on the same machine and load: the
part of a figure that discord.py, the fake Discord and the machine cost, which no code of ours can
remove. /restart posts an announcement with clusterbot's button custom_ids, so the clicks are alike.
"""

from __future__ import annotations

import re
from typing import Any

import discord
from discord.ext import commands

BUTTONS = [("confirm", "", "Confirm"), ("ok", "", "OK"), ("delay", "10", "Delay"), ("cancel", "", "Cancel")]
CUSTOM_ID = re.compile(r"cb:(?P<action>[a-z]+):[^:]*:.+")  # clusterbot's shape


class Button(discord.ui.DynamicItem[discord.ui.Button], template=CUSTOM_ID):
    def __init__(self, cid: str, label: str = "") -> None:
        super().__init__(discord.ui.Button(label=label or cid, custom_id=cid))

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str]
    ) -> Button:
        return cls(match.string)

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        await interaction.response.send_message(f"noted: {self.item.custom_id}", ephemeral=True)


class MinimalBot(commands.Bot):
    def __init__(self, guild_id: int, infra_channel_id: int, **options: Any) -> None:
        super().__init__(command_prefix=commands.when_mentioned, intents=discord.Intents.default(), **options)
        self.guild_id, self.infra_channel_id = guild_id, infra_channel_id
        guild = discord.Object(guild_id)

        @self.tree.command(name="status", description="status", guild=guild)
        async def status(interaction: discord.Interaction[Any], cluster: str | None = None) -> None:
            await interaction.response.send_message(f"status of {cluster or 'every cluster'}: fine")

        @self.tree.command(name="jobs", description="jobs", guild=guild)
        async def jobs(interaction: discord.Interaction[Any], cluster: str) -> None:
            await interaction.response.send_message(f"{cluster}: no jobs")

        @self.tree.command(name="restart", description="restart", guild=guild)
        async def restart(interaction: discord.Interaction[Any], cluster: str) -> None:
            view = discord.ui.View(timeout=None)
            for action, arg, label in BUTTONS:
                view.add_item(Button(f"cb:{action}:{arg}:minimal-{interaction.id}", label))
            channel = self.get_partial_messageable(infra_channel_id, guild_id=guild_id)
            await channel.send(f"{interaction.user.name} asks to restart {cluster}", view=view)
            await interaction.response.send_message("announced", ephemeral=True)

    async def setup_hook(self) -> None:
        self.add_dynamic_items(Button)
        await self.tree.sync(guild=discord.Object(self.guild_id))
