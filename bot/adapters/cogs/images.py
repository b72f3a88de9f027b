"""The images family: /build-image, declared from its spec in one line (no cluster option: it builds for
every region, or those its `regions` option names). The engine announces it and edits the announcement
with the build's progress; the answer here is the caller's alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from discord.ext import commands

from bot.adapters.cogs.operations import operation_command
from bot.operations import build_image as build_image_op

if TYPE_CHECKING:
    from bot.protocol.engine import Engine


class Images(commands.Cog):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    build_image = operation_command(build_image_op.spec())
