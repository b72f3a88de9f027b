"""Who owns which Ray jobs: /link (a user links their own Ray job owner name to themselves) and
/unlink (admins). The engine persists the links in the store; answers go to the caller alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import answer_privately, user_of

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


class Owners(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @app_commands.command(
        name="link", description="Link your Ray job owner name to you: you are asked before a restart"
    )
    @app_commands.describe(ray_user="Your Ray job owner name (job metadata `user`, ray-run-<user>-... ids)")
    async def link(self, interaction: discord.Interaction[Any], ray_user: str) -> None:
        await answer_privately(interaction, self.engine.link(user_of(interaction.user), ray_user.strip()))

    @app_commands.command(name="unlink", description="Admins: remove the link of a Ray job owner name")
    @app_commands.default_permissions(administrator=True)  # shown to Discord admins; the engine decides
    @app_commands.describe(ray_user="The Ray job owner name to unlink")
    async def unlink(self, interaction: discord.Interaction[Any], ray_user: str) -> None:
        await answer_privately(interaction, self.engine.unlink(user_of(interaction.user), ray_user.strip()))
