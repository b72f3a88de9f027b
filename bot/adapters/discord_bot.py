"""The Discord adapter: a `commands.Bot` that is the engine's `Chat` in one #infra channel.

- Chat: the engine posts and edits channel messages in #infra with the bot token (interaction
  tokens die after 15 minutes, longer than a consent window); `<@id>` mentions ping only on new
  messages and only the users the engine names; times read as Discord timestamps `<t:UNIX:R>`.
- Buttons: every button of an operation is an `ActionButton`, a `DynamicItem` whose custom_id
  `cb:<action>:<arg>:<op_id>` carries all its state. It is registered in `setup_hook`, so a click on
  any old message (even one posted before a bot restart) reaches `engine.act`.
- Commands: one Cog per family (`bot/adapters/cogs/`: operations, readonly, owners, workers, images,
  health), synced to the configured guild in `setup_hook` (which runs before the gateway connects: the
  guild comes from configuration).
- Alerts: the monitor (`bot/alerts/`) starts after the engine; its buttons are `ActionButton`s too,
  on "alert:<cluster>:<problem>" targets that the engine hands to it.
- Errors: everything ends in `report_error` (the command tree's `on_error`, and the buttons'):
  an `OpsError` reaches the user as its text, anything else is logged with its traceback and the
  user gets a short apology, ephemerally, never a traceback.
- Life cycle: the engine starts in `setup_hook` (logged in, so it can edit the messages of the
  operations it resumes) and closes with the bot.
"""

from __future__ import annotations

import gc
import io
import logging
import re
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import aiohttp
import discord
from discord import app_commands
from discord.ext import commands

from bot.adapters.cogs import CONTENT_LIMIT, NO_PINGS, answer_privately, fit, send, user_of
from bot.adapters.cogs.health import Health
from bot.adapters.cogs.images import Images
from bot.adapters.cogs.operations import Operations
from bot.adapters.cogs.owners import Owners
from bot.adapters.cogs.readonly import ReadOnly
from bot.adapters.cogs.workers import Workers
from bot.alerts.monitor import Monitor
from bot.app import build_engine
from bot.config import ConfigError, Settings
from bot.protocol.engine import Spec
from bot.protocol.model import Message
from ops.context import Context
from ops.errors import OpsError
from ops.restart import Settings as RestartSettings

log = logging.getLogger("clusterbot.discord")

CUSTOM_ID_LIMIT = 100  # Discord's limit on a component's custom_id
CUSTOM_ID = re.compile(r"cb:(?P<action>[a-z]+):(?P<arg>[^:]*):(?P<op_id>.+)")
STYLES = {
    "primary": discord.ButtonStyle.primary,
    "success": discord.ButtonStyle.success,
    "danger": discord.ButtonStyle.danger,
    "secondary": discord.ButtonStyle.secondary,
}
APOLOGY = "Sorry, something went wrong on our side; it is logged. Try again, or ask an admin to look."


def custom_id(action: str, arg: str, op_id: str) -> str:
    cid = f"cb:{action}:{arg}:{op_id}"
    if len(cid) > CUSTOM_ID_LIMIT or not CUSTOM_ID.fullmatch(cid):
        raise ValueError(f"cannot make a button custom_id of {action!r}, {arg!r}, {op_id!r}: {cid!r}")
    return cid


class ActionButton(discord.ui.DynamicItem[discord.ui.Button], template=CUSTOM_ID):
    """A button of an operation's message; a click is `engine.act(user, op_id, action, arg)`."""

    def __init__(
        self,
        action: str,
        arg: str,
        op_id: str,
        *,
        label: str | None = None,
        style: discord.ButtonStyle = discord.ButtonStyle.secondary,
    ) -> None:
        button: discord.ui.Button = discord.ui.Button(
            label=label or action, style=style, custom_id=custom_id(action, arg, op_id)
        )
        super().__init__(button)
        self.action, self.arg, self.op_id = action, arg, op_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str]
    ) -> ActionButton:
        button: Any = item
        return cls(match["action"], match["arg"], match["op_id"], label=button.label, style=button.style)

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        bot: ClusterBot = interaction.client  # type: ignore[assignment]
        try:
            # The engine edits the announcement itself (Chat.edit); the clicker gets its reply alone.
            user = user_of(interaction.user)
            act = bot.engine.act(user, self.op_id, self.action, self.arg, show_later=True)
            await answer_privately(interaction, act)
        except Exception as e:  # discord.py would only log it: the user must hear something
            await bot.report_error(interaction, e)


def view_of(message: Message) -> discord.ui.View | None:
    """The message's buttons as a persistent view (timeout None; all state in the custom_ids)."""
    if not message.buttons:
        return None
    if not message.op_id:
        raise ValueError("a message with buttons must say which operation they act on (Message.op_id)")
    view = discord.ui.View(timeout=None)
    for b in message.buttons:
        style = STYLES.get(b.style, discord.ButtonStyle.secondary)
        view.add_item(ActionButton(b.action, b.arg, message.op_id, label=b.label, style=style))
    return view


class ClusterTree(app_commands.CommandTree):
    async def on_error(
        self, interaction: discord.Interaction[Any], error: app_commands.AppCommandError
    ) -> None:
        await self.client.report_error(interaction, error)  # type: ignore[attr-defined]


class ClusterBot(commands.Bot):
    """The bot: the engine's chat in #infra, its slash commands and its buttons.

    Pass the engine's inputs (the context with store and registry, operation specs, restart settings;
    the defaults are the CLI's context and the registered operations) and discord.py's own options, e.g.
    `connector=` (tests pass the fake Discord's)."""

    def __init__(
        self,
        settings: Settings,
        *,
        ctx: Context | None = None,
        specs: dict[str, Spec] | None = None,
        restart_settings: RestartSettings | None = None,
        owner_to_chat: Callable[[str], str | None] | None = None,
        connector: aiohttp.BaseConnector | None = None,
        **options: Any,
    ) -> None:
        settings.check_discord()
        super().__init__(
            command_prefix=commands.when_mentioned,  # no prefix commands: slash commands only
            intents=discord.Intents.default(),
            connector=connector,
            tree_cls=ClusterTree,
            allowed_mentions=NO_PINGS,  # pings only where a message names whom to notify
            **options,
        )
        self.settings = settings
        self.guild_id: int = settings.guild_id  # type: ignore[assignment]  # checked above
        self.infra_channel_id: int = settings.infra_channel_id  # type: ignore[assignment]
        self.engine = build_engine(
            self, settings, ctx=ctx, owner_to_chat=owner_to_chat, specs=specs,
            restart_settings=restart_settings,
        )  # fmt: skip
        self.monitor = Monitor(self.engine)
        self.synced: list[app_commands.AppCommand] = []
        self._engine_closed = False

    # -- life cycle -------------------------------------------------------------------------------
    async def setup_hook(self) -> None:
        guild = discord.Object(self.guild_id)
        await self.add_cog(Operations(self.engine), guild=guild)
        await self.add_cog(ReadOnly(self.engine), guild=guild)
        await self.add_cog(Owners(self.engine), guild=guild)
        await self.add_cog(Workers(self.engine), guild=guild)
        await self.add_cog(Images(self.engine), guild=guild)
        await self.add_cog(Health(self.monitor), guild=guild)
        self.add_dynamic_items(ActionButton)  # before the gateway: old buttons work from the start
        await self._check_channel()
        # Guild commands update at once; global ones would take up to an hour and are never synced.
        try:
            self.synced = await self.tree.sync(guild=guild)
        except discord.Forbidden:
            raise ConfigError(
                f"CLUSTERBOT_GUILD_ID {self.guild_id}: Discord refuses the bot's commands there "
                "(is the bot in that server, invited with the applications.commands scope?)"
            ) from None
        await self.engine.start()  # resumes open operations; may edit their messages (REST works now)
        await self.monitor.start()  # says what it missed if the bot was down; schedules the checks
        # What start-up made (modules, clients, the registry: ~120,000 objects) lives as long as
        # the bot: out of the collector's sight, a full collection no longer stalls the loop for 20-60 ms
        # in the middle of a burst of clicks (issue 10; measured in bench/bot.py).
        gc.collect()
        gc.freeze()

    async def _check_channel(self) -> None:
        """A wrong #infra id is one clear line at start-up, not a failure at the first announcement."""
        where = f"CLUSTERBOT_INFRA_CHANNEL_ID {self.infra_channel_id}"
        try:
            channel = await self.fetch_channel(self.infra_channel_id)
        except (discord.NotFound, discord.Forbidden):
            raise ConfigError(f"{where}: no such channel the bot can see") from None
        guild = getattr(channel, "guild", None)
        if guild is None or guild.id != self.guild_id:
            raise ConfigError(f"{where} is not a channel of the guild {self.guild_id} (CLUSTERBOT_GUILD_ID)")

    async def on_ready(self) -> None:
        log.info("connected to Discord as %s; #infra is channel %s", self.user, self.infra_channel_id)

    async def close(self) -> None:
        if not self._engine_closed:
            self._engine_closed = True
            await self.monitor.close()
            await self.engine.close()  # open operations stay persisted for the next start
        await super().close()

    # -- the engine's Chat ---------------------------------------------------------------------------
    def mention(self, chat_id: str) -> str:
        return f"<@{chat_id}>" if chat_id.isdigit() else f"@{chat_id}"

    def when(self, at: datetime | None) -> str:
        return "-" if at is None else discord.utils.format_dt(at, "R")

    def link(self, message_id: str) -> str | None:
        """The jump URL of an #infra message (what the reply to /restart links to)."""
        if not message_id.isdigit():
            return None
        return f"https://discord.com/channels/{self.guild_id}/{self.infra_channel_id}/{message_id}"

    def _infra(self) -> discord.PartialMessageable:
        # REST only: works in setup_hook, before the guild (and its channel cache) arrives.
        return self.get_partial_messageable(
            self.infra_channel_id, guild_id=self.guild_id, type=discord.ChannelType.text
        )

    async def post(self, message: Message) -> str:
        """A new message in #infra; it pings exactly the users in `message.mentions`."""
        ids = [i for i in dict.fromkeys(message.mentions) if i.isdigit()]
        # Discord pings only users mentioned in the content: add those the text leaves out (or loses
        # when cut to the length limit).
        text = fit(message.text)
        missing = [i for i in ids if f"<@{i}>" not in text and f"<@!{i}>" not in text]
        if missing:
            cc = "\ncc " + " ".join(self.mention(i) for i in missing)
            text = fit(message.text, CONTENT_LIMIT - len(cc)) + cc
        pings = discord.AllowedMentions(
            everyone=False, roles=False, users=[discord.Object(int(i)) for i in ids]
        )
        extra: dict[str, Any] = {}
        view = view_of(message)
        if view is not None:
            extra["view"] = view
        if message.files:
            extra["files"] = [discord.File(io.BytesIO(data), filename=name) for name, data in message.files]
        sent = await self._infra().send(text, allowed_mentions=pings, **extra)
        return str(sent.id)

    async def edit(self, message_id: str, message: Message) -> None:
        """Edit an engine message in place (edits never ping); no buttons removes them."""
        partial = self._infra().get_partial_message(int(message_id))
        await partial.edit(content=fit(message.text), view=view_of(message), allowed_mentions=NO_PINGS)

    # -- errors -------------------------------------------------------------------------------------------
    async def report_error(self, interaction: discord.Interaction[Any], error: BaseException) -> None:
        """The one place errors go: known ones say what happened, others are logged and apologised for."""
        original = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        if isinstance(original, OpsError):
            text = str(original)
        elif isinstance(original, app_commands.AppCommandError) and not isinstance(
            original, app_commands.CommandInvokeError
        ):
            text = str(original)  # discord.py's own user-facing errors (checks, transformers, ...)
        else:
            what = interaction.command.qualified_name if interaction.command else interaction.data
            log.error("interaction %s by %s failed", what, interaction.user, exc_info=original)
            text = APOLOGY
        try:
            await send(interaction, text, ephemeral=True)
        except discord.HTTPException as e:  # expired interaction, or Discord down: nothing more to do
            log.warning("could not tell %s about an error: %s", interaction.user, e)


def run(settings: Settings) -> None:
    """Run the bot on Discord until interrupted (logging is left to the caller). A wrong setting
    (token, guild, channel, store, registry) ends it with one line on stderr and exit code 2."""
    try:
        if not settings.discord_token:
            raise ConfigError("DISCORD_TOKEN is not set: the Discord bot needs it")
        ClusterBot(settings).run(settings.discord_token, log_handler=None)
    except discord.LoginFailure:
        _exit("DISCORD_TOKEN was refused by Discord: check the bot token")
    except (ConfigError, OpsError) as e:
        _exit(str(e))


def _exit(line: str) -> NoReturn:
    print(f"clusterbot: {line}", file=sys.stderr)
    sys.exit(2)
