"""A fake Discord (REST + gateway) that the real discord.py client talks to on 127.0.0.1.

Nothing in discord.py is patched. The fake serves TLS on a self-signed certificate on a free port of
127.0.0.1; the bot reaches it through the documented ``connector=`` argument of ``discord.Client``:
an ``aiohttp.TCPConnector`` whose resolver maps discord.com, discord.gg and their subdomains to the
fake (with the fake's port) and refuses every other host.

Typical use::

    async with FakeDiscord() as fake:
        bot = commands.Bot(command_prefix="!", intents=discord.Intents.default(),
                           connector=fake.connector(), guild_ready_timeout=0.05)
        ...  # register commands, sync them to fake.guild.id in setup_hook
        async with run_bot(bot, fake):
            handle = await fake.slash("alice", "status", options={"cluster": "v4"}, channel="infra")
            response = await handle.response()        # waits (bounded) for the callback
            assert response.latency < 3.0 and not response.ephemeral
            msg = await handle.wait_original(lambda m: "RUNNING" in m.content)

Test-facing API (all waits are bounded and raise TimeoutError / InteractionExpired):

* ``await fake.slash(user, "name" | "group sub", options={...}, guild=..., channel=...)`` -> FakeInteraction;
  ``await fake.click(user, message, custom_id, values=None)`` -> FakeInteraction;
  ``await fake.autocomplete(user, "name", focused_option, value, options=...)`` -> list of choices;
  ``await fake.submit_modal(user, interaction_answered_with_a_modal, {custom_id: value})``;
  ``await fake.post_user_message(user, channel, content)``; ``await fake.drop_gateway(code)``.
* On a FakeInteraction: ``await .response()`` (CallbackRecord: type, data, latency, ephemeral, status),
  ``await .wait_original(predicate)``, ``await .followup(n)``, ``.callbacks``, ``.expired``,
  ``.expire_token()``; ``fake.response_latencies()`` for benchmarks.
* Messages: ``fake.messages(channel)``, ``await fake.wait_for_message(predicate, timeout, channel=...)``,
  ``fake.messages_by_id``; FakeMessage keeps ``history`` (earlier versions), ``mentions``, ``pinged``.
* A command synced with ``default_member_permissions`` is shown only to members holding them:
  ``slash``/``autocomplete`` by anyone else raise ``CommandHidden``.
* Set-up: ``add_user``, ``add_role``, ``give_role``, ``add_channel``, ``inject_error``; records:
  ``requests``, ``unknown_routes``, ``refused_hosts``, ``guild_commands``, ``global_commands``.

What is modelled (see the Discord behaviour notes in /work/shared/FINDINGS.md):

* interactions must be acknowledged within ``interaction_deadline`` (3 s): later callbacks get
  404 {"code": 10062, "message": "Unknown interaction"}; a second callback gets 400 code 40060;
* interaction tokens (follow-ups, @original) live ``token_lifetime`` (15 min): then 401 code 50027;
* after a deferred (type 5) response the first follow-up replaces the "thinking" message and keeps the
  defer's visibility; after type 6 on a component, @original is the message the component is on;
* edits never ping anyone: ``FakeMessage.pinged`` is filled only when a message is created
  (public, allowed_mentions honoured);
* message limits (content 2000, embeds, custom_id <= 100 and unique per message, ...) answer the real
  400 {"code": 50035, "message": "Invalid Form Body", "errors": {...}} shape;
* JSON is served with content-type exactly ``application/json`` (discord.py decodes nothing else).

Routes nobody implemented are logged at WARNING, kept in ``fake.unknown_routes`` and answered with a
404 JSON body, so that gaps are visible instead of silently hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import re
import secrets
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

log = logging.getLogger("tests.fakes.discord_api")

DISCORD_EPOCH_MS = 1_420_070_400_000
API_PREFIX = re.compile(r"^/api(?:/v\d+)?(?=/)")

# Message flags
EPHEMERAL = 1 << 6
LOADING = 1 << 7
IS_COMPONENTS_V2 = 1 << 15

# Interaction types
PING, APPLICATION_COMMAND, MESSAGE_COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5

# Interaction callback types
CHANNEL_MESSAGE = 4
DEFERRED_CHANNEL_MESSAGE = 5
DEFERRED_UPDATE_MESSAGE = 6
UPDATE_MESSAGE = 7
AUTOCOMPLETE_RESULT = 8
MODAL = 9
CALLBACK_NAMES = {
    1: "PONG",
    4: "CHANNEL_MESSAGE_WITH_SOURCE",
    5: "DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE",
    6: "DEFERRED_UPDATE_MESSAGE",
    7: "UPDATE_MESSAGE",
    8: "APPLICATION_COMMAND_AUTOCOMPLETE_RESULT",
    9: "MODAL",
    12: "LAUNCH_ACTIVITY",
}

# Gateway intents the fake looks at
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15

# Permissions
ADMINISTRATOR = 1 << 3
ALL_PERMISSIONS = (1 << 51) - 1
DEFAULT_EVERYONE_PERMISSIONS = (
    (1 << 6)  # add reactions
    | (1 << 10)  # view channel
    | (1 << 11)  # send messages
    | (1 << 14)  # embed links
    | (1 << 15)  # attach files
    | (1 << 16)  # read message history
    | (1 << 31)  # use application commands
)
DEFAULT_BOT_PERMISSIONS = DEFAULT_EVERYONE_PERMISSIONS | (1 << 13)  # + manage messages

# Option types of application commands
OPT_SUB_COMMAND, OPT_SUB_COMMAND_GROUP = 1, 2
OPT_STRING, OPT_INTEGER, OPT_BOOLEAN, OPT_USER, OPT_CHANNEL, OPT_ROLE, OPT_MENTIONABLE, OPT_NUMBER = (
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
)

# Component types that carry a custom_id a user can interact with
BUTTON, STRING_SELECT, TEXT_INPUT = 2, 3, 4
SELECT_TYPES = {3, 5, 6, 7, 8}

COMMAND_NAME_RE = re.compile(r"^[-_\w]{1,32}$")
MENTION_USER_RE = re.compile(r"<@!?(\d+)>")
MENTION_ROLE_RE = re.compile(r"<@&(\d+)>")


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


class InteractionExpired(AssertionError):
    """The bot did not acknowledge an interaction in time (the user sees "This interaction failed")."""


class CommandHidden(PermissionError):
    """The Discord client does not show this command to this user (its `default_member_permissions`
    asks for permissions the member lacks), so they cannot send it."""


class FakeDiscordError(Exception):
    """A REST error answered in Discord's shape."""

    def __init__(self, status: int, code: int, message: str, errors: dict | None = None):
        super().__init__(f"{status} {code} {message}")
        self.status, self.code, self.message, self.errors = status, code, message, errors

    def body(self) -> dict:
        body: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors:
            body["errors"] = self.errors
        return body


def _unknown_interaction() -> FakeDiscordError:
    return FakeDiscordError(404, 10062, "Unknown interaction")


def _unknown_webhook() -> FakeDiscordError:
    return FakeDiscordError(404, 10015, "Unknown Webhook")


def _unknown_message() -> FakeDiscordError:
    return FakeDiscordError(404, 10008, "Unknown Message")


def _unknown_channel() -> FakeDiscordError:
    return FakeDiscordError(404, 10003, "Unknown Channel")


class _FormErrors:
    """Collects Invalid Form Body errors in Discord's nested ``{"a": {"0": {"_errors": [...]}}}`` shape."""

    def __init__(self) -> None:
        self.errors: dict[str, Any] = {}

    def add(self, path: Iterable[str | int], code: str, message: str) -> None:
        node = self.errors
        for part in path:
            node = node.setdefault(str(part), {})
        node.setdefault("_errors", []).append({"code": code, "message": message})

    def raise_if_any(self) -> None:
        if self.errors:
            raise FakeDiscordError(400, 50035, "Invalid Form Body", self.errors)


# --------------------------------------------------------------------------------------------------
# Entities
# --------------------------------------------------------------------------------------------------


class _Snowflakes:
    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        candidate = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        if candidate <= self._last:
            candidate = self._last + 1
        self._last = candidate
        return candidate


@dataclass
class FakeUser:
    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"

    def payload(self) -> dict:
        data = {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "public_flags": 0,
        }
        if self.bot:
            data["bot"] = True
        return data


@dataclass
class FakeRole:
    id: int
    name: str
    permissions: int = 0
    position: int = 0
    mentionable: bool = False
    managed: bool = False

    @property
    def mention(self) -> str:
        return f"<@&{self.id}>"

    def payload(self) -> dict:
        return {
            "id": str(self.id),
            "name": self.name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": self.position,
            "permissions": str(self.permissions),
            "managed": self.managed,
            "mentionable": self.mentionable,
            "flags": 0,
        }


@dataclass
class FakeChannel:
    id: int
    name: str
    guild_id: int | None
    type: int = 0  # 0 text, 1 DM, 4 category
    position: int = 0
    topic: str | None = None
    parent_id: int | None = None
    recipients: list[FakeUser] = field(default_factory=list)

    @property
    def mention(self) -> str:
        return f"<#{self.id}>"

    def payload(self, *, with_guild_id: bool = True) -> dict:
        if self.type == 1:
            return {
                "id": str(self.id),
                "type": 1,
                "last_message_id": None,
                "recipients": [u.payload() for u in self.recipients],
                "flags": 0,
            }
        data: dict[str, Any] = {
            "id": str(self.id),
            "type": self.type,
            "name": self.name,
            "position": self.position,
            "permission_overwrites": [],
            "parent_id": str(self.parent_id) if self.parent_id else None,
            "nsfw": False,
            "flags": 0,
        }
        if self.type == 0:
            data.update({"topic": self.topic, "last_message_id": None, "rate_limit_per_user": 0})
        if with_guild_id and self.guild_id is not None:
            data["guild_id"] = str(self.guild_id)
        return data


@dataclass
class FakeMember:
    user: FakeUser
    roles: list[int] = field(default_factory=list)
    nick: str | None = None
    joined_at: str = field(default_factory=_now_iso)

    def payload(self, *, with_user: bool = True) -> dict:
        data: dict[str, Any] = {
            "roles": [str(r) for r in self.roles],
            "nick": self.nick,
            "avatar": None,
            "banner": None,
            "joined_at": self.joined_at,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = self.user.payload()
        return data


@dataclass
class FakeGuild:
    id: int
    name: str
    owner_id: int
    channels: dict[int, FakeChannel] = field(default_factory=dict)
    roles: dict[int, FakeRole] = field(default_factory=dict)
    members: dict[int, FakeMember] = field(default_factory=dict)

    def channel(self, ref: int | str | FakeChannel) -> FakeChannel:
        if isinstance(ref, FakeChannel):
            return ref
        for ch in self.channels.values():
            if ch.id == ref or ch.name == ref or str(ch.id) == str(ref):
                return ch
        names = [c.name for c in self.channels.values()]
        raise KeyError(f"guild {self.name!r} has no channel {ref!r}; channels: {names}")

    def role(self, ref: int | str | FakeRole) -> FakeRole:
        if isinstance(ref, FakeRole):
            return ref
        for role in self.roles.values():
            if role.id == ref or role.name == ref or str(role.id) == str(ref):
                return role
        raise KeyError(f"guild {self.name!r} has no role {ref!r}")

    def permissions_for(self, user_id: int) -> int:
        if user_id == self.owner_id:
            return ALL_PERMISSIONS
        member = self.members.get(user_id)
        perms = self.roles[self.id].permissions
        if member is not None:
            for rid in member.roles:
                if rid in self.roles:
                    perms |= self.roles[rid].permissions
        return ALL_PERMISSIONS if perms & ADMINISTRATOR else perms

    def payload(self, *, members: Iterable[FakeMember]) -> dict:
        members = list(members)
        return {
            "id": str(self.id),
            "name": self.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(self.owner_id),
            "region": "us-west",
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "vanity_url_code": None,
            "features": [],
            "emojis": [],
            "stickers": [],
            "roles": [r.payload() for r in self.roles.values()],
            "channels": [c.payload(with_guild_id=False) for c in self.channels.values()],
            "threads": [],
            "members": [m.payload() for m in members],
            "member_count": len(self.members),
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "large": False,
            "unavailable": False,
            "joined_at": _now_iso(),
            "application_id": None,
            "max_members": 500000,
            "max_video_channel_users": 25,
        }


@dataclass
class FakeMessage:
    """A message as the fake stores it. ``history`` keeps every earlier version (oldest first)."""

    id: int
    channel_id: int
    guild_id: int | None
    author: FakeUser
    content: str = ""
    embeds: list[dict] = field(default_factory=list)
    components: list[dict] = field(default_factory=list)
    attachments: list[dict] = field(default_factory=list)
    flags: int = 0
    type: int = 0
    tts: bool = False
    mentions: list[int] = field(default_factory=list)
    mention_roles: list[int] = field(default_factory=list)
    mention_everyone: bool = False
    pinged: set[int] = field(default_factory=set)
    webhook_id: int | None = None
    application_id: int | None = None
    interaction_id: int | None = None
    interaction_metadata: dict | None = None
    message_reference: dict | None = None
    reactions: dict[str, set[int]] = field(default_factory=dict)
    created_at: float = field(default_factory=time.monotonic)
    timestamp: str = field(default_factory=_now_iso)
    edited_timestamp: str | None = None
    edited_at: float | None = None
    history: list[dict] = field(default_factory=list)
    deleted: bool = False
    raw: dict = field(default_factory=dict)  # the last JSON body the bot sent for it

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)

    @property
    def loading(self) -> bool:
        """True while a deferred ("thinking") response has not been filled in."""
        return bool(self.flags & LOADING)

    @property
    def edits(self) -> int:
        return len(self.history)

    def snapshot(self) -> dict:
        return {
            "content": self.content,
            "embeds": json.loads(json.dumps(self.embeds)),
            "components": json.loads(json.dumps(self.components)),
            "attachments": list(self.attachments),
            "flags": self.flags,
            "mentions": list(self.mentions),
            "at": self.edited_at if self.edited_at is not None else self.created_at,
        }

    def walk_components(self) -> Iterable[dict]:
        stack = list(reversed(self.components))
        while stack:
            comp = stack.pop()
            yield comp
            children: list[dict] = []
            for key in ("components",):
                children.extend(comp.get(key) or [])
            for key in ("accessory", "component"):
                if isinstance(comp.get(key), dict):
                    children.append(comp[key])
            stack.extend(reversed(children))

    def component(self, custom_id: str) -> dict | None:
        for comp in self.walk_components():
            if comp.get("custom_id") == custom_id:
                return comp
        return None

    @property
    def custom_ids(self) -> list[str]:
        return [c["custom_id"] for c in self.walk_components() if "custom_id" in c]

    @property
    def buttons(self) -> list[dict]:
        return [c for c in self.walk_components() if c.get("type") == BUTTON]

    @property
    def text(self) -> str:
        """Content plus embed titles, descriptions and fields: handy for ``in`` assertions."""
        parts = [self.content]
        for emb in self.embeds:
            parts.extend(str(emb.get(k, "")) for k in ("title", "description"))
            for fld in emb.get("fields", []):
                parts.extend([str(fld.get("name", "")), str(fld.get("value", ""))])
            if isinstance(emb.get("footer"), dict):
                parts.append(str(emb["footer"].get("text", "")))
        for comp in self.walk_components():
            if comp.get("type") == 10:  # components v2 text display
                parts.append(str(comp.get("content", "")))
        return "\n".join(p for p in parts if p)

    def payload(self, users: dict[int, FakeUser]) -> dict:
        data: dict[str, Any] = {
            "id": str(self.id),
            "channel_id": str(self.channel_id),
            "type": self.type,
            "author": self.author.payload(),
            "content": self.content,
            "timestamp": self.timestamp,
            "edited_timestamp": self.edited_timestamp,
            "tts": self.tts,
            "mention_everyone": self.mention_everyone,
            "mentions": [users[u].payload() for u in self.mentions if u in users],
            "mention_roles": [str(r) for r in self.mention_roles],
            "attachments": list(self.attachments),
            "embeds": list(self.embeds),
            "components": list(self.components),
            "pinned": False,
            "flags": self.flags,
            "reactions": [
                {"emoji": {"id": None, "name": emoji}, "count": len(who), "me": False, "burst_colors": []}
                for emoji, who in self.reactions.items()
                if who
            ],
        }
        if self.guild_id is not None:
            data["guild_id"] = str(self.guild_id)
        if self.webhook_id is not None:
            data["webhook_id"] = str(self.webhook_id)
        if self.application_id is not None:
            data["application_id"] = str(self.application_id)
        if self.interaction_metadata is not None:
            data["interaction_metadata"] = self.interaction_metadata
        if self.message_reference is not None:
            data["message_reference"] = self.message_reference
        return data


@dataclass
class CallbackRecord:
    """One POST /interactions/{id}/{token}/callback, accepted or not."""

    type: int
    data: dict | None
    at: float
    latency: float  # seconds between dispatching the interaction and this callback arriving
    status: int
    error: dict | None = None
    message: FakeMessage | None = None

    @property
    def type_name(self) -> str:
        return CALLBACK_NAMES.get(self.type, str(self.type))

    @property
    def ephemeral(self) -> bool:
        return bool((self.data or {}).get("flags", 0) & EPHEMERAL)

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300

    @property
    def content(self) -> str | None:
        return (self.data or {}).get("content")

    @property
    def choices(self) -> list[dict]:
        return list((self.data or {}).get("choices", []))


@dataclass(eq=False)
class FakeInteraction:
    """An interaction the fake dispatched. It is also the test's handle on it."""

    fake: FakeDiscord = field(repr=False)
    id: int
    token: str
    type: int
    user: FakeUser
    guild_id: int | None
    channel_id: int
    data: dict
    payload: dict = field(repr=False)
    message: FakeMessage | None = field(default=None, repr=False)  # the message a component is on
    dispatched_at: float = 0.0
    dispatched_wall: float = 0.0
    callbacks: list[CallbackRecord] = field(default_factory=list)
    expired: bool = False
    token_expires_at: float = 0.0
    original: FakeMessage | None = None
    followups: list[FakeMessage] = field(default_factory=list)
    deferred_pending: bool = False
    parent: FakeInteraction | None = None  # for a modal submit: the interaction that opened the modal
    _expiry: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def name(self) -> str | None:
        return self.data.get("name")

    @property
    def custom_id(self) -> str | None:
        return self.data.get("custom_id")

    @property
    def answer(self) -> CallbackRecord | None:
        """The accepted initial response, if any."""
        for cb in self.callbacks:
            if cb.accepted:
                return cb
        return None

    @property
    def answered(self) -> bool:
        return self.answer is not None

    @property
    def latency(self) -> float | None:
        ans = self.answer
        return None if ans is None else ans.latency

    @property
    def rejected_callbacks(self) -> list[CallbackRecord]:
        return [cb for cb in self.callbacks if not cb.accepted]

    @property
    def modal(self) -> dict | None:
        ans = self.answer
        return ans.data if ans is not None and ans.type == MODAL else None

    async def response(self, timeout: float | None = None) -> CallbackRecord:
        """Wait for the initial callback; raises InteractionExpired if the deadline passes unanswered."""
        if timeout is None:
            timeout = self.fake.interaction_deadline + 1.0

        def ready() -> CallbackRecord | bool | None:
            return self.answer or self.expired

        result = await self.fake.wait_until(ready, timeout, f"a response to interaction {self.describe()}")
        if isinstance(result, CallbackRecord):
            return result
        late = ", ".join(f"{cb.type_name} after {cb.latency:.2f}s" for cb in self.rejected_callbacks)
        raise InteractionExpired(
            f"interaction {self.describe()} was not answered within {self.fake.interaction_deadline}s"
            + (f" (late callbacks: {late})" if late else "")
        )

    async def wait_expired(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = self.fake.interaction_deadline + 1.0
        await self.fake.wait_until(lambda: self.expired or self.answered, timeout, "expiry")
        if not self.expired:
            raise AssertionError(f"interaction {self.describe()} was answered: {self.answer}")

    async def wait_original(
        self, predicate: Callable[[FakeMessage], bool] | None = None, timeout: float = 5.0
    ) -> FakeMessage:
        """Wait until @original exists, is no longer 'thinking', and satisfies ``predicate``."""

        def ready() -> FakeMessage | None:
            msg = self.original
            if msg is None or msg.loading or msg.deleted:
                return None
            if predicate is not None and not predicate(msg):
                return None
            return msg

        return await self.fake.wait_until(ready, timeout, f"the original response of {self.describe()}")

    async def followup(self, index: int = 0, timeout: float = 5.0) -> FakeMessage:
        """Wait for the ``index``-th message posted through POST /webhooks/{app}/{token}."""
        return await self.fake.wait_until(
            lambda: self.followups[index] if len(self.followups) > index else None,
            timeout,
            f"follow-up #{index} of {self.describe()}",
        )

    def expire_token(self) -> None:
        """Make the 15-minute interaction token expire now (to test what the bot does then)."""
        self.token_expires_at = time.monotonic()

    def describe(self) -> str:
        what = self.name or self.custom_id or "?"
        return f"{self.id} (type {self.type}, {what!r})"


# --------------------------------------------------------------------------------------------------
# The resolver the bot's connector uses
# --------------------------------------------------------------------------------------------------


def is_discord_host(host: str) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in ("discord.com", "discord.gg"))


class FakeDiscordResolver(AbstractResolver):
    """Maps discord.com / discord.gg (and subdomains) to the fake; refuses every other host."""

    def __init__(self, port: int, refused: list[str] | None = None):
        self.port = port
        self.refused = refused if refused is not None else []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if is_discord_host(host):
            return [
                ResolveResult(
                    hostname=host,
                    host="127.0.0.1",
                    port=self.port,
                    family=socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST,
                )
            ]
        self.refused.append(host)
        log.error("fake Discord resolver refused host %r", host)
        raise OSError(f"fake Discord resolver refuses {host!r}: only discord.com / discord.gg go to the fake")

    async def close(self) -> None:
        return None


def make_connector(fake: FakeDiscord, **kwargs: Any) -> aiohttp.TCPConnector:
    """The connector to pass to ``commands.Bot(..., connector=...)``. Call it inside the running loop."""
    return aiohttp.TCPConnector(
        resolver=FakeDiscordResolver(fake.port, fake.refused_hosts), ssl=False, **kwargs
    )


def _make_certificate(directory: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "discord.com")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("discord.com"),
                    x509.DNSName("*.discord.com"),
                    x509.DNSName("discord.gg"),
                    x509.DNSName("*.discord.gg"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = f"{directory}/cert.pem", f"{directory}/key.pem"
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


# --------------------------------------------------------------------------------------------------
# Gateway sessions
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _GatewayConn:
    ws: web.WebSocketResponse
    query: dict[str, str]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: _GatewaySession | None = None
    heartbeats: int = 0


@dataclass(eq=False)
class _GatewaySession:
    id: str
    intents: int
    identify: dict
    seq: int = 0
    buffer: list[dict] = field(default_factory=list)
    conn: _GatewayConn | None = None


def _json_response(data: Any, status: int = 200) -> web.Response:
    # Exactly "application/json": discord.py does not decode "application/json; charset=utf-8".
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def _empty_response() -> web.Response:
    return web.Response(status=204)


# --------------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------------


class FakeDiscord:
    """Fake Discord REST API + gateway. Use ``async with FakeDiscord(...) as fake`` (or start()/close())."""

    def __init__(
        self,
        *,
        token: str = "fake-bot-token",
        bot_name: str = "clusterbot",
        guild_name: str = "Test Guild",
        channels: Iterable[str] = ("general", "infra", "alerts"),
        users: Iterable[str] = ("alice", "bob"),
        roles: dict[str, int] | None = None,
        owner: str = "owner",
        bot_permissions: int = DEFAULT_BOT_PERMISSIONS,
        interaction_deadline: float = 3.0,
        token_lifetime: float = 15 * 60.0,
        heartbeat_interval_ms: int = 41250,
    ) -> None:
        self.token = token
        self.interaction_deadline = interaction_deadline
        self.token_lifetime = token_lifetime
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._ids = _Snowflakes()
        self._sessions: dict[str, _GatewaySession] = {}

        self.users: dict[int, FakeUser] = {}
        self.bot_user = self._new_user(bot_name, bot=True)
        self.application_id = self.bot_user.id  # as for any bot created since 2019
        self.owner = self._new_user(owner)
        gid = self._ids.next()
        self.guild = FakeGuild(id=gid, name=guild_name, owner_id=self.owner.id)
        self.guilds: dict[int, FakeGuild] = {gid: self.guild}
        self.guild.roles[gid] = FakeRole(id=gid, name="@everyone", permissions=DEFAULT_EVERYONE_PERMISSIONS)
        bot_role = FakeRole(
            id=self._ids.next(), name=bot_name, permissions=bot_permissions, position=1, managed=True
        )
        self.guild.roles[bot_role.id] = bot_role
        self.guild.members[self.owner.id] = FakeMember(self.owner)
        self.guild.members[self.bot_user.id] = FakeMember(self.bot_user, roles=[bot_role.id])
        for position, (role_name, perms) in enumerate((roles or {}).items(), start=2):
            self.add_role(role_name, permissions=perms, position=position)
        for position, channel_name in enumerate(channels):
            self.add_channel(channel_name, position=position)
        for username in users:
            self.add_user(username)
        self.dm_channels: dict[int, FakeChannel] = {}

        # Recorded state
        self.messages_by_id: dict[int, FakeMessage] = {}
        self.global_commands: list[dict] = []
        self.guild_commands: dict[int, list[dict]] = {}
        self.interactions: dict[int, FakeInteraction] = {}
        self._by_token: dict[str, FakeInteraction] = {}
        self.requests: list[dict] = []
        self.unknown_routes: list[str] = []
        self.refused_hosts: list[str] = []
        self.presence: dict | None = None
        self.identifies: list[dict] = []
        self.resumes: list[dict] = []
        self.files: dict[int, bytes] = {}
        self._injected: list[tuple[str, re.Pattern, FakeDiscordError, list[int]]] = []

        self._tasks: set[asyncio.Task] = set()
        self._conns: set[_GatewayConn] = set()
        self._change_event: asyncio.Event | None = None
        self._tmpdir: str | None = None
        self._runner: web.AppRunner | None = None
        self.port: int = 0
        self._routes = self._build_routes()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeDiscord:
        self._change_event = asyncio.Event()
        self._tmpdir = tempfile.mkdtemp(prefix="fake-discord-")
        cert, key = _make_certificate(self._tmpdir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, ssl_context=ctx)
        await site.start()
        log.info("fake Discord listening on https://127.0.0.1:%d", self.port)
        return self

    async def close(self) -> None:
        for inter in self.interactions.values():
            if inter._expiry is not None:
                inter._expiry.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1001, message=b"fake Discord shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    async def __aenter__(self) -> FakeDiscord:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def connector(self, **kwargs: Any) -> aiohttp.TCPConnector:
        return make_connector(self, **kwargs)

    # ------------------------------------------------------------------ configuration

    def _new_user(self, username: str, *, bot: bool = False, user_id: int | None = None) -> FakeUser:
        user = FakeUser(id=user_id or self._ids.next(), username=username, bot=bot)
        self.users[user.id] = user
        return user

    def add_user(
        self,
        username: str,
        *,
        roles: Iterable[int | str] = (),
        nick: str | None = None,
        bot: bool = False,
        user_id: int | None = None,
    ) -> FakeUser:
        """Add a guild member (announced with GUILD_MEMBER_ADD if the bot asked for member events)."""
        user = self._new_user(username, bot=bot, user_id=user_id)
        member = FakeMember(user, roles=[self.guild.role(r).id for r in roles], nick=nick)
        self.guild.members[user.id] = member
        if self._sessions:
            self._dispatch_all(
                "GUILD_MEMBER_ADD",
                {**member.payload(), "guild_id": str(self.guild.id)},
                intent=INTENT_GUILD_MEMBERS,
            )
        return user

    def add_role(
        self, name: str, *, permissions: int = 0, position: int | None = None, mentionable: bool = False
    ) -> FakeRole:
        role = FakeRole(
            id=self._ids.next(),
            name=name,
            permissions=permissions,
            position=position if position is not None else len(self.guild.roles),
            mentionable=mentionable,
        )
        self.guild.roles[role.id] = role
        if self._sessions:
            self._dispatch_all("GUILD_ROLE_CREATE", {"guild_id": str(self.guild.id), "role": role.payload()})
        return role

    def give_role(self, user: int | str | FakeUser, role: int | str | FakeRole) -> None:
        member = self.guild.members[self.user(user).id]
        rid = self.guild.role(role).id
        if rid not in member.roles:
            member.roles.append(rid)
        if self._sessions:
            self._dispatch_all(
                "GUILD_MEMBER_UPDATE",
                {**member.payload(), "guild_id": str(self.guild.id)},
                intent=INTENT_GUILD_MEMBERS,
            )

    def add_channel(self, name: str, *, position: int | None = None, topic: str | None = None) -> FakeChannel:
        ch = FakeChannel(
            id=self._ids.next(),
            name=name,
            guild_id=self.guild.id,
            position=position if position is not None else len(self.guild.channels),
            topic=topic,
        )
        self.guild.channels[ch.id] = ch
        if self._sessions:
            self._dispatch_all("CHANNEL_CREATE", ch.payload())
        return ch

    def user(self, ref: int | str | FakeUser) -> FakeUser:
        if isinstance(ref, FakeUser):
            return ref
        if isinstance(ref, int) and ref in self.users:
            return self.users[ref]
        for user in self.users.values():
            if user.username == ref or str(user.id) == str(ref):
                return user
        raise KeyError(f"no user {ref!r}; users: {[u.username for u in self.users.values()]}")

    def channel(self, ref: int | str | FakeChannel) -> FakeChannel:
        if isinstance(ref, FakeChannel):
            return ref
        for ch in self.dm_channels.values():
            if ch.id == ref or str(ch.id) == str(ref):
                return ch
        for guild in self.guilds.values():
            with contextlib.suppress(KeyError):
                return guild.channel(ref)
        raise KeyError(f"no channel {ref!r}")

    def inject_error(
        self, method: str, path_regex: str, status: int, code: int = 0, message: str = "", times: int = 1
    ) -> None:
        """Answer the next ``times`` requests matching METHOD and the API path with this error."""
        err = FakeDiscordError(status, code, message or f"{status}: injected by the test")
        self._injected.append((method.upper(), re.compile(path_regex), err, [times]))

    # ------------------------------------------------------------------ waiting helpers

    def _bump(self) -> None:
        if self._change_event is not None:
            ev, self._change_event = self._change_event, asyncio.Event()
            ev.set()

    async def wait_until(
        self, ready: Callable[[], Any], timeout: float = 5.0, what: str = "a condition"
    ) -> Any:
        """Return ``ready()`` once it is truthy; TimeoutError after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = ready()
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"fake Discord: timed out after {timeout}s waiting for {what}")
            assert self._change_event is not None, "FakeDiscord was not started"
            # Woken by any change in the fake; the 50 ms slice also lets predicates look at the bot's state.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._change_event.wait(), min(remaining, 0.05))

    async def wait_connected(self, timeout: float = 10.0) -> None:
        """Wait until a bot has IDENTIFIED (or RESUMED) on the gateway."""
        await self.wait_until(self._active_session, timeout, "a gateway session")

    def response_latencies(self) -> list[float]:
        """Seconds from dispatch to the accepted initial callback, for every answered interaction."""
        return [i.latency for i in self.interactions.values() if i.latency is not None]

    def messages(
        self, channel: int | str | FakeChannel, *, include_ephemeral: bool = False
    ) -> list[FakeMessage]:
        """The channel's messages in order (current versions; ``m.history`` has the earlier ones)."""
        cid = self.channel(channel).id
        return sorted(
            (
                m
                for m in self.messages_by_id.values()
                if m.channel_id == cid and not m.deleted and (include_ephemeral or not m.ephemeral)
            ),
            key=lambda m: m.id,
        )

    async def wait_for_message(
        self,
        predicate: Callable[[FakeMessage], bool] = lambda m: True,
        timeout: float = 5.0,
        *,
        channel: int | str | FakeChannel | None = None,
        include_ephemeral: bool = False,
        since: float | None = None,
    ) -> FakeMessage:
        """First message (current version, created or edited) satisfying ``predicate``.

        ``since`` (a time.monotonic() value) only considers messages created or edited after it.
        """
        cid = None if channel is None else self.channel(channel).id

        def ready() -> FakeMessage | None:
            for msg in sorted(self.messages_by_id.values(), key=lambda m: m.id):
                if msg.deleted or (cid is not None and msg.channel_id != cid):
                    continue
                if msg.ephemeral and not include_ephemeral:
                    continue
                if since is not None and max(msg.created_at, msg.edited_at or 0) < since:
                    continue
                if predicate(msg):
                    return msg
            return None

        return await self.wait_until(ready, timeout, "a matching channel message")

    # ------------------------------------------------------------------ test-facing interactions

    def _active_session(self) -> _GatewaySession | None:
        live = [s for s in self._sessions.values() if s.conn is not None and not s.conn.ws.closed]
        return live[-1] if live else None

    def _find_command(self, name: str, guild_id: int | None, cmd_type: int = 1) -> tuple[dict, int | None]:
        if guild_id is not None:
            for cmd in self.guild_commands.get(guild_id, []):
                if cmd["name"] == name and cmd.get("type", 1) == cmd_type:
                    return cmd, guild_id
        for cmd in self.global_commands:
            if cmd["name"] == name and cmd.get("type", 1) == cmd_type:
                return cmd, None
        known = [c["name"] for c in self.global_commands] + [
            c["name"] for c in self.guild_commands.get(guild_id or 0, [])
        ]
        raise LookupError(
            f"no synced command /{name} for guild {guild_id} (synced: {known}); did the bot sync?"
        )

    def _member_payload(self, guild: FakeGuild, user: FakeUser, channel: FakeChannel) -> dict:
        member = guild.members.get(user.id)
        if member is None:
            raise KeyError(f"{user.username} is not a member of {guild.name}")
        return {**member.payload(), "permissions": str(guild.permissions_for(user.id))}

    def _resolve_option(
        self, opt: dict, value: Any, guild: FakeGuild | None, resolved: dict[str, dict], path: str
    ) -> Any:
        otype = opt["type"]
        name = opt["name"]
        if otype == OPT_STRING:
            if not isinstance(value, str):
                raise TypeError(f"{path} {name}: string option, got {value!r}")
            if "min_length" in opt and len(value) < opt["min_length"]:
                raise ValueError(f"{path} {name}: shorter than min_length {opt['min_length']}")
            if "max_length" in opt and len(value) > opt["max_length"]:
                raise ValueError(f"{path} {name}: longer than max_length {opt['max_length']}")
            return value
        if otype in (OPT_INTEGER, OPT_NUMBER):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{path} {name}: numeric option, got {value!r}")
            if otype == OPT_INTEGER and not float(value).is_integer():
                raise TypeError(f"{path} {name}: integer option, got {value!r}")
            value = int(value) if otype == OPT_INTEGER else float(value)
            if opt.get("min_value") is not None and value < opt["min_value"]:
                raise ValueError(f"{path} {name}: below min_value {opt['min_value']}")
            if opt.get("max_value") is not None and value > opt["max_value"]:
                raise ValueError(f"{path} {name}: above max_value {opt['max_value']}")
            return value
        if otype == OPT_BOOLEAN:
            if not isinstance(value, bool):
                raise TypeError(f"{path} {name}: boolean option, got {value!r}")
            return value
        if guild is None:
            raise ValueError(f"{path} {name}: user/channel/role options need a guild in this fake")
        if otype == OPT_USER or (otype == OPT_MENTIONABLE and not isinstance(value, FakeRole)):
            user = self.user(value)
            resolved.setdefault("users", {})[str(user.id)] = user.payload()
            member = guild.members.get(user.id)
            if member is not None:
                resolved.setdefault("members", {})[str(user.id)] = {
                    **member.payload(with_user=False),
                    "permissions": str(guild.permissions_for(user.id)),
                }
            return str(user.id)
        if otype == OPT_CHANNEL:
            ch = guild.channel(value)
            if opt.get("channel_types") and ch.type not in opt["channel_types"]:
                raise ValueError(f"{path} {name}: channel type {ch.type} not in {opt['channel_types']}")
            resolved.setdefault("channels", {})[str(ch.id)] = {
                **ch.payload(),
                "permissions": str(guild.permissions_for(self.bot_user.id)),
            }
            return str(ch.id)
        if otype in (OPT_ROLE, OPT_MENTIONABLE):
            role = guild.role(value)
            resolved.setdefault("roles", {})[str(role.id)] = role.payload()
            return str(role.id)
        raise NotImplementedError(f"{path} {name}: option type {otype} is not supported by the fake")

    def _build_options(
        self,
        schema: list[dict],
        values: dict[str, Any],
        guild: FakeGuild | None,
        resolved: dict[str, dict],
        path: str,
        focused: str | None = None,
        focused_value: Any = None,
    ) -> list[dict]:
        by_name = {o["name"]: o for o in schema}
        out: list[dict] = []
        given = dict(values)
        if focused is not None:
            given.pop(focused, None)
        for key, value in given.items():
            opt = by_name.get(key)
            if opt is None:
                raise ValueError(f"{path}: no option {key!r}; options: {sorted(by_name)}")
            value = self._resolve_option(opt, value, guild, resolved, path)
            if opt.get("choices") and value not in [c["value"] for c in opt["choices"]]:
                raise ValueError(f"{path} {key}: {value!r} is not one of the choices {opt['choices']}")
            out.append({"name": key, "type": opt["type"], "value": value})
        if focused is not None:
            opt = by_name.get(focused)
            if opt is None:
                raise ValueError(f"{path}: no option {focused!r}; options: {sorted(by_name)}")
            if not opt.get("autocomplete"):
                raise ValueError(f"{path} {focused}: option has no autocomplete")
            out.append({"name": focused, "type": opt["type"], "value": focused_value, "focused": True})
        else:
            missing = [o["name"] for o in schema if o.get("required") and o["name"] not in given]
            if missing:
                raise ValueError(f"{path}: required options missing: {missing}")
        return out

    def _command_data(
        self,
        name: str,
        options: dict[str, Any] | None,
        guild: FakeGuild | None,
        focused: str | None = None,
        focused_value: Any = None,
    ) -> dict:
        parts = name.strip().lstrip("/").split()
        cmd, cmd_guild_id = self._find_command(parts[0], guild.id if guild else None)
        resolved: dict[str, dict] = {}
        data: dict[str, Any] = {"id": cmd["id"], "name": cmd["name"], "type": cmd.get("type", 1)}
        if cmd_guild_id is not None:
            data["guild_id"] = str(cmd_guild_id)
        # Walk sub-command groups / sub-commands.
        schema = cmd.get("options", [])
        container = data
        path = "/" + parts[0]
        for sub in parts[1:]:
            match = [
                o
                for o in schema
                if o["name"] == sub and o["type"] in (OPT_SUB_COMMAND, OPT_SUB_COMMAND_GROUP)
            ]
            if not match:
                raise LookupError(f"{path} has no sub-command {sub!r}")
            node = {"name": sub, "type": match[0]["type"], "options": []}
            container["options"] = [node]
            container = node
            schema = match[0].get("options", [])
            path += " " + sub
        if any(o["type"] in (OPT_SUB_COMMAND, OPT_SUB_COMMAND_GROUP) for o in schema):
            raise LookupError(f"{path} needs a sub-command: {[o['name'] for o in schema]}")
        container["options"] = self._build_options(
            schema, options or {}, guild, resolved, path, focused=focused, focused_value=focused_value
        )
        if resolved:
            data["resolved"] = resolved
        return data

    def _interaction_payload(
        self,
        itype: int,
        user: FakeUser,
        guild: FakeGuild | None,
        channel: FakeChannel,
        data: dict,
        message: FakeMessage | None = None,
        locale: str = "en-US",
    ) -> tuple[int, str, dict]:
        iid = self._ids.next()
        token = "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(48)
        payload: dict[str, Any] = {
            "id": str(iid),
            "application_id": str(self.application_id),
            "type": itype,
            "data": data,
            "token": token,
            "version": 1,
            "locale": locale,
            "entitlements": [],
            "entitlement_sku_ids": [],
            "attachment_size_limit": 10 * 1024 * 1024,
            "channel_id": str(channel.id),
            "channel": {
                **channel.payload(),
                "permissions": str(guild.permissions_for(user.id) if guild else ALL_PERMISSIONS),
            },
        }
        if guild is not None:
            payload.update(
                {
                    "guild_id": str(guild.id),
                    "guild": {"id": str(guild.id), "locale": "en-US", "features": []},
                    "guild_locale": "en-US",
                    "member": self._member_payload(guild, user, channel),
                    "app_permissions": str(guild.permissions_for(self.bot_user.id)),
                    "authorizing_integration_owners": {"0": str(guild.id)},
                    "context": 0,
                }
            )
        else:
            payload.update(
                {
                    "user": user.payload(),
                    "app_permissions": str(ALL_PERMISSIONS),
                    "authorizing_integration_owners": {"0": str(self.guild.id)},
                    "context": 1,
                }
            )
        if message is not None:
            payload["message"] = message.payload(self.users)
        return iid, token, payload

    async def _dispatch_interaction(
        self,
        itype: int,
        user: FakeUser,
        guild: FakeGuild | None,
        channel: FakeChannel,
        data: dict,
        message: FakeMessage | None = None,
        parent: FakeInteraction | None = None,
    ) -> FakeInteraction:
        session = self._active_session()
        if session is None:
            raise RuntimeError("no bot is connected to the fake gateway")
        iid, token, payload = self._interaction_payload(itype, user, guild, channel, data, message)
        inter = FakeInteraction(
            fake=self,
            id=iid,
            token=token,
            type=itype,
            user=user,
            guild_id=guild.id if guild else None,
            channel_id=channel.id,
            data=data,
            payload=payload,
            message=message,
            parent=parent,
        )
        self.interactions[iid] = inter
        self._by_token[token] = inter
        inter.dispatched_at = time.monotonic()
        inter.dispatched_wall = time.time()
        inter.token_expires_at = inter.dispatched_at + self.token_lifetime
        loop = asyncio.get_running_loop()
        inter._expiry = loop.call_later(self.interaction_deadline, self._expire, inter)
        await self._dispatch(session, "INTERACTION_CREATE", payload)
        return inter

    def _expire(self, inter: FakeInteraction) -> None:
        inter._expiry = None
        if not inter.answered:
            inter.expired = True
            log.info(
                "interaction %s expired unanswered after %.1fs", inter.describe(), self.interaction_deadline
            )
            self._bump()

    def _guild_and_channel(
        self, guild: int | str | FakeGuild | None, channel: int | str | FakeChannel | None
    ) -> tuple[FakeGuild | None, FakeChannel]:
        if isinstance(guild, FakeGuild):
            g: FakeGuild | None = guild
        elif guild is None:
            g = self.guild
        else:
            g = next(
                x for x in self.guilds.values() if x.id == guild or x.name == guild or str(x.id) == str(guild)
            )
        if channel is None:
            assert g is not None
            ch = next(c for c in g.channels.values() if c.type == 0)
        else:
            try:
                ch = g.channel(channel) if g is not None else self.channel(channel)
            except KeyError:
                ch = self.channel(channel)  # a DM channel
        if ch.type == 1:
            g = None
        return g, ch

    async def slash(
        self,
        user: int | str | FakeUser,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        guild: int | str | FakeGuild | None = None,
        channel: int | str | FakeChannel | None = None,
    ) -> FakeInteraction:
        """Invoke ``/name`` (``"group sub"`` for sub-commands) as ``user``; returns the interaction handle.

        The option values are checked against the synced command the way the Discord client does
        (required options, choices, ranges, types). Users, channels and roles may be given by name.
        """
        u = self.user(user)
        g, ch = self._guild_and_channel(guild, channel)
        self._check_shown(name, u, g)
        data = self._command_data(name, options, g)
        return await self._dispatch_interaction(APPLICATION_COMMAND, u, g, ch, data)

    def _check_shown(self, name: str, user: FakeUser, guild: FakeGuild | None) -> None:
        """Discord shows a command with `default_member_permissions` only to members holding all of
        those permissions (administrators and the owner hold all; "0": admins only)."""
        cmd, _ = self._find_command(name.split()[0], guild.id if guild else None)
        needed = cmd.get("default_member_permissions")
        if needed is None or guild is None:
            return
        held, want = guild.permissions_for(user.id), int(needed)
        shown = held == ALL_PERMISSIONS if want == 0 else held & want == want
        if not shown:
            raise CommandHidden(
                f"/{name} is not shown to {user.username}: it needs permissions {needed}, they hold {held}"
            )

    async def autocomplete(
        self,
        user: int | str | FakeUser,
        name: str,
        focused_option: str,
        value: Any,
        *,
        options: dict[str, Any] | None = None,
        guild: int | str | FakeGuild | None = None,
        channel: int | str | FakeChannel | None = None,
        timeout: float | None = None,
    ) -> list[dict]:
        """Type ``value`` into ``focused_option`` of ``/name``; returns the choices the bot answered."""
        u = self.user(user)
        g, ch = self._guild_and_channel(guild, channel)
        self._check_shown(name, u, g)
        data = self._command_data(name, options, g, focused=focused_option, focused_value=value)
        inter = await self._dispatch_interaction(AUTOCOMPLETE, u, g, ch, data)
        answer = await inter.response(timeout)
        if answer.type != AUTOCOMPLETE_RESULT:
            raise AssertionError(f"autocomplete answered with {answer.type_name}")
        return answer.choices

    async def click(
        self,
        user: int | str | FakeUser,
        message: FakeMessage | int,
        custom_id: str,
        *,
        values: list[str] | None = None,
    ) -> FakeInteraction:
        """Click the button (or pick ``values`` in the select) ``custom_id`` on ``message``."""
        u = self.user(user)
        msg = message if isinstance(message, FakeMessage) else self.messages_by_id[message]
        msg = self.messages_by_id.get(msg.id, msg)
        if msg.deleted:
            raise ValueError(f"message {msg.id} was deleted")
        comp = msg.component(custom_id)
        if comp is None:
            raise ValueError(f"message {msg.id} has no component {custom_id!r}; it has {msg.custom_ids}")
        if comp.get("disabled"):
            raise ValueError(f"component {custom_id!r} is disabled: the Discord client cannot click it")
        ctype = comp["type"]
        data: dict[str, Any] = {"custom_id": custom_id, "component_type": ctype}
        if ctype in SELECT_TYPES:
            if values is None:
                raise ValueError(f"{custom_id!r} is a select: pass values=[...]")
            if ctype == STRING_SELECT:
                allowed = [o["value"] for o in comp.get("options", [])]
                bad = [v for v in values if v not in allowed]
                if bad:
                    raise ValueError(f"{custom_id!r}: {bad} are not options ({allowed})")
            lo, hi = comp.get("min_values", 1), comp.get("max_values", 1)
            if not lo <= len(values) <= hi:
                raise ValueError(f"{custom_id!r}: pick between {lo} and {hi} values")
            data["values"] = list(values)
        elif ctype != BUTTON:
            raise ValueError(f"component {custom_id!r} of type {ctype} cannot be clicked")
        elif comp.get("style") == 5:
            raise ValueError(f"{custom_id!r} is a link button: it sends no interaction")
        g = self.guilds.get(msg.guild_id) if msg.guild_id else None
        ch = self.channel(msg.channel_id)
        return await self._dispatch_interaction(MESSAGE_COMPONENT, u, g, ch, data, message=msg)

    async def submit_modal(
        self,
        user: int | str | FakeUser,
        opened_by: FakeInteraction,
        values: dict[str, str | list[str]],
    ) -> FakeInteraction:
        """Submit the modal ``opened_by`` was answered with; ``values`` fills inputs/selects by custom_id."""
        modal = opened_by.modal
        if modal is None:
            raise ValueError(f"interaction {opened_by.describe()} was not answered with a modal")
        remaining = dict(values)

        def fill(comp: dict) -> dict | None:
            ctype = comp.get("type")
            if ctype == 1:
                return {"type": 1, "components": [x for x in map(fill, comp.get("components", [])) if x]}
            if ctype == 18:
                inner = fill(comp["component"])
                return {"type": 18, "id": comp.get("id", 0), "component": inner} if inner else None
            if ctype == TEXT_INPUT:
                value = remaining.pop(comp["custom_id"], comp.get("value", ""))
                if comp.get("required", True) and not value:
                    raise ValueError(f"text input {comp['custom_id']!r} is required")
                return {"type": TEXT_INPUT, "custom_id": comp["custom_id"], "value": value}
            if ctype in SELECT_TYPES:
                picked = remaining.pop(comp["custom_id"], [])
                return {"type": ctype, "custom_id": comp["custom_id"], "values": list(picked)}
            return None

        components = [x for x in map(fill, modal.get("components", [])) if x]
        if remaining:
            raise ValueError(f"modal has no inputs {sorted(remaining)}")
        data = {"custom_id": modal["custom_id"], "components": components}
        g = self.guilds.get(opened_by.guild_id) if opened_by.guild_id else None
        ch = self.channel(opened_by.channel_id)
        return await self._dispatch_interaction(
            MODAL_SUBMIT, self.user(user), g, ch, data, message=opened_by.message, parent=opened_by
        )

    async def post_user_message(
        self, user: int | str | FakeUser, channel: int | str | FakeChannel, content: str
    ) -> FakeMessage:
        """A user writes in a channel: stored and sent to the bot as MESSAGE_CREATE."""
        u = self.user(user)
        ch = self.channel(channel)
        msg = self._new_message(ch, u, {"content": content})
        self._store_created(msg, notify=True)
        return msg

    async def drop_gateway(self, code: int = 4000) -> None:
        """Close the bot's gateway connection(s) with ``code``; discord.py then RESUMEs."""
        for conn in list(self._conns):
            await conn.ws.close(code=code, message=b"dropped by the test")

    # ------------------------------------------------------------------ messages

    def _parse_mentions(self, msg: FakeMessage, allowed: dict | None, guild: FakeGuild | None) -> None:
        content = msg.content or ""
        user_ids = [int(x) for x in MENTION_USER_RE.findall(content)]
        role_ids = [int(x) for x in MENTION_ROLE_RE.findall(content)]
        everyone = "@everyone" in content or "@here" in content
        if allowed is not None:
            parse = allowed.get("parse", [])
            if "users" not in parse:
                listed = {int(x) for x in allowed.get("users", [])}
                user_ids = [u for u in user_ids if u in listed]
            if "roles" not in parse:
                listed = {int(x) for x in allowed.get("roles", [])}
                role_ids = [r for r in role_ids if r in listed]
            everyone = everyone and "everyone" in parse
        msg.mentions = list(dict.fromkeys(u for u in user_ids if u in self.users))
        msg.mention_roles = list(dict.fromkeys(r for r in role_ids if guild is not None and r in guild.roles))
        msg.mention_everyone = everyone

    def _compute_pings(self, msg: FakeMessage, guild: FakeGuild | None) -> set[int]:
        if msg.ephemeral:
            return set()
        pinged = set(msg.mentions)
        if guild is not None:
            for member in guild.members.values():
                if msg.mention_everyone or any(r in member.roles for r in msg.mention_roles):
                    pinged.add(member.user.id)
        elif msg.mention_everyone:
            pinged.update(u.id for u in self.channel(msg.channel_id).recipients)
        pinged.discard(msg.author.id)
        return pinged

    def _validate_message(self, body: dict, *, creating: bool, has_files: bool = False) -> None:
        errs = _FormErrors()
        content = body.get("content")
        if content is not None and len(str(content)) > 2000:
            errs.add(["content"], "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
        embeds = body.get("embeds") or []
        if len(embeds) > 10:
            errs.add(["embeds"], "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        total = 0
        for i, emb in enumerate(embeds):
            for key, limit in (("title", 256), ("description", 4096)):
                text = emb.get(key) or ""
                total += len(text)
                if len(text) > limit:
                    errs.add(
                        ["embeds", i, key], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length."
                    )
            fields_ = emb.get("fields") or []
            if len(fields_) > 25:
                errs.add(["embeds", i, "fields"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            for j, fld in enumerate(fields_):
                for key, limit in (("name", 256), ("value", 1024)):
                    text = str(fld.get(key) or "")
                    total += len(text)
                    if not text:
                        errs.add(
                            ["embeds", i, "fields", j, key], "BASE_TYPE_REQUIRED", "This field is required"
                        )
                    elif len(text) > limit:
                        errs.add(
                            ["embeds", i, "fields", j, key],
                            "BASE_TYPE_MAX_LENGTH",
                            f"Must be {limit} or fewer in length.",
                        )
            footer = (emb.get("footer") or {}).get("text") or ""
            total += len(footer)
            if len(footer) > 2048:
                errs.add(
                    ["embeds", i, "footer", "text"],
                    "BASE_TYPE_MAX_LENGTH",
                    "Must be 2048 or fewer in length.",
                )
        if total > 6000:
            errs.add(["embeds"], "MAX_EMBED_SIZE_EXCEEDED", "Embed size exceeds maximum size of 6000")
        self._validate_components(body.get("components") or [], body.get("flags", 0), errs, ["components"])
        errs.raise_if_any()
        if creating and not (
            content
            or embeds
            or body.get("components")
            or has_files
            or body.get("sticker_ids")
            or body.get("poll")
        ):
            raise FakeDiscordError(400, 50006, "Cannot send an empty message")

    def _validate_components(self, components: list[dict], flags: int, errs: _FormErrors, path: list) -> None:
        seen: set[str] = set()
        v2 = bool((flags or 0) & IS_COMPONENTS_V2)
        if not v2 and len(components) > 5:
            errs.add(path, "BASE_TYPE_MAX_LENGTH", "Must be 5 or fewer in length.")

        def walk(comp: dict, where: list) -> None:
            ctype = comp.get("type")
            if ctype == 1 and not v2 and len(comp.get("components", [])) > 5:
                errs.add(where + ["components"], "BASE_TYPE_MAX_LENGTH", "Must be 5 or fewer in length.")
            custom_id = comp.get("custom_id")
            if custom_id is not None:
                if not 1 <= len(custom_id) <= 100:
                    errs.add(
                        where + ["custom_id"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."
                    )
                if custom_id in seen:
                    errs.add(
                        where + ["custom_id"],
                        "COMPONENT_CUSTOM_ID_DUPLICATED",
                        "Component custom id cannot be duplicated",
                    )
                seen.add(custom_id)
            if ctype == BUTTON:
                if comp.get("style") == 5 and not comp.get("url"):
                    errs.add(where + ["url"], "BASE_TYPE_REQUIRED", "This field is required")
                if comp.get("style") not in (5, 6) and custom_id is None:
                    errs.add(where + ["custom_id"], "BASE_TYPE_REQUIRED", "This field is required")
                if len(comp.get("label") or "") > 80:
                    errs.add(where + ["label"], "BASE_TYPE_MAX_LENGTH", "Must be 80 or fewer in length.")
            if ctype == STRING_SELECT and not 1 <= len(comp.get("options", [])) <= 25:
                errs.add(where + ["options"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 25 in length.")
            for i, child in enumerate(comp.get("components") or []):
                walk(child, where + ["components", i])
            for key in ("accessory", "component"):
                if isinstance(comp.get(key), dict):
                    walk(comp[key], where + [key])

        for i, comp in enumerate(components):
            walk(comp, path + [i])

    def _attachments_from(self, body: dict, files: list[tuple[str, str, bytes]]) -> list[dict] | None:
        if not files and "attachments" not in body:
            return None
        out: list[dict] = []
        for att in body.get("attachments") or []:
            if str(att.get("id", "")).isdigit() and int(att["id"]) in self.files:
                out.append(att)
        for _field, filename, content in files:
            aid = self._ids.next()
            self.files[aid] = content
            out.append(
                {
                    "id": str(aid),
                    "filename": filename,
                    "size": len(content),
                    "url": f"https://cdn.discordapp.com/attachments/0/{aid}/{filename}",
                    "proxy_url": f"https://media.discordapp.net/attachments/0/{aid}/{filename}",
                    "content_type": "application/octet-stream",
                }
            )
        return out

    def _new_message(
        self,
        channel: FakeChannel,
        author: FakeUser,
        body: dict,
        *,
        files: list[tuple[str, str, bytes]] | None = None,
        inter: FakeInteraction | None = None,
        mtype: int = 0,
        flags: int | None = None,
    ) -> FakeMessage:
        msg = FakeMessage(
            id=self._ids.next(),
            channel_id=channel.id,
            guild_id=channel.guild_id,
            author=author,
            content=str(body.get("content") or ""),
            embeds=list(body.get("embeds") or []),
            components=list(body.get("components") or []),
            flags=(body.get("flags") or 0) if flags is None else flags,
            tts=bool(body.get("tts", False)),
            type=mtype,
            raw=body,
        )
        msg.attachments = self._attachments_from(body, files or []) or []
        if body.get("message_reference"):
            ref = body["message_reference"]
            msg.message_reference = {**ref, "channel_id": str(channel.id)}
            msg.type = 19
        if inter is not None:
            msg.webhook_id = self.application_id
            msg.application_id = self.application_id
            msg.interaction_id = inter.id
            msg.interaction_metadata = {
                "id": str(inter.id),
                "type": inter.type,
                "user": inter.user.payload(),
                "authorizing_integration_owners": {"0": str(inter.guild_id or self.guild.id)},
            }
            if inter.name:
                msg.interaction_metadata["name"] = inter.name
        guild = self.guilds.get(channel.guild_id) if channel.guild_id else None
        self._parse_mentions(msg, body.get("allowed_mentions"), guild)
        if msg.message_reference and (body.get("allowed_mentions") or {}).get("replied_user", True):
            ref_msg = self.messages_by_id.get(int(msg.message_reference.get("message_id", 0)))
            if ref_msg is not None and ref_msg.author.id not in msg.mentions:
                msg.mentions.append(ref_msg.author.id)
        return msg

    def _store_created(self, msg: FakeMessage, *, notify: bool) -> None:
        guild = self.guilds.get(msg.guild_id) if msg.guild_id else None
        msg.pinged = self._compute_pings(msg, guild) if notify else set()
        self.messages_by_id[msg.id] = msg
        if not msg.ephemeral:
            self._dispatch_message_event("MESSAGE_CREATE", msg)
        self._bump()

    def _apply_edit(
        self, msg: FakeMessage, body: dict, files: list[tuple[str, str, bytes]] | None = None
    ) -> None:
        if msg.deleted:
            raise _unknown_message()
        merged_flags = body.get("flags", msg.flags)
        self._validate_message({**body, "flags": merged_flags}, creating=False)
        msg.history.append(msg.snapshot())
        if "content" in body:
            msg.content = str(body["content"] or "")
        if "embeds" in body:
            msg.embeds = list(body["embeds"] or [])
        if "components" in body:
            msg.components = list(body["components"] or [])
        if "flags" in body and body["flags"] is not None:
            # Only SUPPRESS_EMBEDS (and the components-v2 switch) can change on edit.
            keep = msg.flags & ~((1 << 2) | IS_COMPONENTS_V2)
            msg.flags = keep | (body["flags"] & ((1 << 2) | IS_COMPONENTS_V2))
        attachments = self._attachments_from(body, files or [])
        if attachments is not None:
            msg.attachments = attachments
        guild = self.guilds.get(msg.guild_id) if msg.guild_id else None
        if "content" in body or "allowed_mentions" in body:
            self._parse_mentions(msg, body.get("allowed_mentions"), guild)
        msg.raw = body
        msg.edited_timestamp = _now_iso()
        msg.edited_at = time.monotonic()
        # Edits never ping: msg.pinged stays what the creation computed.
        if not msg.ephemeral:
            self._dispatch_message_event("MESSAGE_UPDATE", msg)
        self._bump()

    def _fill_deferred(
        self, msg: FakeMessage, body: dict, files: list[tuple[str, str, bytes]] | None
    ) -> None:
        """Fill a "thinking" message: an edit (no pings) that keeps the defer's visibility."""
        body = {k: v for k, v in body.items() if k != "flags"}
        self._apply_edit(msg, body, files)
        msg.flags &= ~LOADING

    def _delete_message(self, msg: FakeMessage) -> None:
        if msg.deleted:
            raise _unknown_message()
        msg.deleted = True
        if not msg.ephemeral:
            data = {"id": str(msg.id), "channel_id": str(msg.channel_id)}
            if msg.guild_id:
                data["guild_id"] = str(msg.guild_id)
            self._dispatch_all("MESSAGE_DELETE", data, intent=self._message_intent(msg))
        self._bump()

    def _message_intent(self, msg: FakeMessage) -> int:
        return INTENT_GUILD_MESSAGES if msg.guild_id else INTENT_DIRECT_MESSAGES

    def _dispatch_message_event(self, event: str, msg: FakeMessage) -> None:
        data = msg.payload(self.users)
        if msg.guild_id:
            guild = self.guilds[msg.guild_id]
            member = guild.members.get(msg.author.id)
            if member is not None and msg.webhook_id is None:
                data["member"] = member.payload(with_user=False)
        for session in list(self._sessions.values()):
            if not session.intents & self._message_intent(msg):
                continue
            payload = data
            bot_mentioned = self.bot_user.id in msg.mentions
            if (
                not session.intents & INTENT_MESSAGE_CONTENT
                and msg.author.id != self.bot_user.id
                and not bot_mentioned
                and msg.guild_id is not None
            ):
                payload = {**data, "content": "", "embeds": [], "attachments": [], "components": []}
            self._schedule(self._dispatch(session, event, payload))

    # ------------------------------------------------------------------ gateway

    def _schedule(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch_all(self, event: str, data: dict, *, intent: int = INTENT_GUILDS) -> None:
        for session in list(self._sessions.values()):
            if session.intents & intent:
                self._schedule(self._dispatch(session, event, data))

    async def _dispatch(self, session: _GatewaySession, event: str, data: dict) -> None:
        session.seq += 1
        payload = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.buffer.append(payload)
        del session.buffer[:-1000]
        if session.conn is not None:
            await self._gw_send(session.conn, payload)

    async def _gw_send(self, conn: _GatewayConn, payload: dict) -> None:
        async with conn.lock:
            if conn.ws.closed:
                return
            try:
                await conn.ws.send_str(json.dumps(payload))
            except (ConnectionResetError, RuntimeError) as exc:
                log.info("gateway send failed: %r", exc)

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = _GatewayConn(ws=ws, query=dict(request.query))
        self._conns.add(conn)
        if request.query.get("encoding", "json") != "json":
            await ws.close(code=4002, message=b"only encoding=json is faked")
            return ws
        await self._gw_send(
            conn, {"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}, "s": None, "t": None}
        )
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        await self._gw_receive(conn, json.loads(msg.data))
                    except Exception:
                        log.exception("fake gateway failed handling %s", msg.data[:500])
                        await ws.close(code=4000, message=b"fake gateway error")
                elif msg.type == aiohttp.WSMsgType.BINARY:
                    log.warning("fake gateway got a binary frame (etf is not faked)")
                    await ws.close(code=4002, message=b"decode error")
        finally:
            self._conns.discard(conn)
            if conn.session is not None and conn.session.conn is conn:
                conn.session.conn = None
            self._bump()
        return ws

    async def _gw_receive(self, conn: _GatewayConn, msg: dict) -> None:
        op, data = msg.get("op"), msg.get("d")
        if op == 1:  # heartbeat
            conn.heartbeats += 1
            await self._gw_send(conn, {"op": 11, "d": None, "s": None, "t": None})
        elif op == 2:  # identify
            await self._identify(conn, data or {})
        elif op == 3:  # presence update
            self.presence = data
        elif op == 6:  # resume
            await self._resume(conn, data or {})
        elif op == 8:  # request guild members
            await self._request_members(conn, data or {})
        else:
            log.warning("fake gateway: unhandled op %s: %s", op, msg)

    async def _identify(self, conn: _GatewayConn, data: dict) -> None:
        if data.get("token", "").removeprefix("Bot ") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        if conn.session is not None:
            await conn.ws.close(code=4005, message=b"Already authenticated.")
            return
        self.identifies.append(data)
        intents = int(data.get("intents", 0))
        session = _GatewaySession(id=secrets.token_hex(16), intents=intents, identify=data)
        self._sessions[session.id] = session
        session.conn = conn
        conn.session = session
        ready = {
            "v": 10,
            "user": {**self.bot_user.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": str(g.id), "unavailable": True} for g in self.guilds.values()],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": "wss://gateway.discord.gg",
            "application": {"id": str(self.application_id), "flags": 0},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "geo_ordered_rtc_regions": [],
            "user_settings": {},
            "_trace": ["fake-discord"],
        }
        if "shard" in data:
            ready["shard"] = data["shard"]
        await self._dispatch(session, "READY", ready)
        if intents & INTENT_GUILDS:
            for guild in self.guilds.values():
                members = (
                    guild.members.values()
                    if intents & INTENT_GUILD_MEMBERS
                    else [guild.members[self.bot_user.id]]
                )
                await self._dispatch(session, "GUILD_CREATE", guild.payload(members=members))
        self._bump()

    async def _resume(self, conn: _GatewayConn, data: dict) -> None:
        self.resumes.append(data)
        session = self._sessions.get(str(data.get("session_id")))
        if session is None or data.get("token", "").removeprefix("Bot ") != self.token:
            await self._gw_send(conn, {"op": 9, "d": False, "s": None, "t": None})
            return
        session.conn = conn
        conn.session = session
        seq = int(data.get("seq") or 0)
        for payload in list(session.buffer):
            if payload["s"] > seq:
                await self._gw_send(conn, payload)
        await self._dispatch(session, "RESUMED", {"_trace": ["fake-discord"]})
        self._bump()

    async def _request_members(self, conn: _GatewayConn, data: dict) -> None:
        session = conn.session
        if session is None:
            return
        guild = self.guilds.get(int(data.get("guild_id", 0)))
        if guild is None:
            return
        members = list(guild.members.values())
        if data.get("user_ids"):
            wanted = {int(x) for x in data["user_ids"]}
            members = [m for m in members if m.user.id in wanted]
        elif data.get("query"):
            members = [m for m in members if m.user.username.startswith(data["query"])]
        if data.get("limit"):
            members = members[: int(data["limit"])]
        chunk = {
            "guild_id": str(guild.id),
            "members": [m.payload() for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [],
        }
        if data.get("nonce"):
            chunk["nonce"] = data["nonce"]
        await self._dispatch(session, "GUILD_MEMBERS_CHUNK", chunk)

    # ------------------------------------------------------------------ HTTP plumbing

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._gateway(request)
        path = API_PREFIX.sub("", request.path)
        body, files = await self._read_body(request)
        entry = {
            "method": request.method,
            "path": path,
            "query": dict(request.query),
            "json": body,
            "at": time.monotonic(),
        }
        self.requests.append(entry)
        try:
            for method, pattern, err, left in self._injected:
                if method == request.method and pattern.search(path) and left[0] > 0:
                    left[0] -= 1
                    raise err
            for method, pattern, handler, needs_auth in self._routes:
                if method != request.method:
                    continue
                match = pattern.fullmatch(path)
                if match is None:
                    continue
                if needs_auth and request.headers.get("Authorization") != f"Bot {self.token}":
                    raise FakeDiscordError(401, 0, "401: Unauthorized")
                result = await handler(request, body, files, *match.groups())
                entry["status"] = result.status
                return result
            self.unknown_routes.append(f"{request.method} {path}")
            log.warning("fake Discord: UNKNOWN ROUTE %s %s body=%s -> 404", request.method, path, body)
            raise FakeDiscordError(404, 0, "404: Not Found")
        except FakeDiscordError as err:
            entry["status"] = err.status
            entry["error"] = err.body()
            return _json_response(err.body(), err.status)

    async def _read_body(self, request: web.Request) -> tuple[Any, list[tuple[str, str, bytes]]]:
        if not request.can_read_body:
            return None, []
        ctype = request.content_type
        if ctype.startswith("multipart/"):
            body: Any = {}
            files: list[tuple[str, str, bytes]] = []
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, aiohttp.BodyPartReader):
                    continue
                if part.name == "payload_json":
                    body = json.loads(await part.text())
                elif part.filename:
                    files.append((part.name or "", part.filename, bytes(await part.read())))
            return body, files
        raw = await request.read()
        if not raw:
            return None, []
        try:
            return json.loads(raw), []
        except ValueError:
            return raw.decode(errors="replace"), []

    def _build_routes(self) -> list[tuple[str, re.Pattern, Callable, bool]]:
        S = r"(\d+)"  # snowflake
        T = r"([^/]+)"  # token
        table: list[tuple[str, str, Callable, bool]] = [
            ("GET", "/gateway", self._r_gateway, False),
            ("GET", "/gateway/bot", self._r_gateway_bot, True),
            ("GET", "/users/@me", self._r_me, True),
            ("GET", f"/users/{S}", self._r_get_user, True),
            ("POST", "/users/@me/channels", self._r_create_dm, True),
            ("GET", "/oauth2/applications/@me", self._r_app_info, True),
            ("GET", "/applications/@me", self._r_app_info, True),
            ("GET", f"/applications/{S}/commands", self._r_get_commands, True),
            ("PUT", f"/applications/{S}/commands", self._r_put_commands, True),
            ("POST", f"/applications/{S}/commands", self._r_post_command, True),
            ("DELETE", f"/applications/{S}/commands/{S}", self._r_delete_command, True),
            ("GET", f"/applications/{S}/guilds/{S}/commands", self._r_get_commands, True),
            ("PUT", f"/applications/{S}/guilds/{S}/commands", self._r_put_commands, True),
            ("POST", f"/applications/{S}/guilds/{S}/commands", self._r_post_command, True),
            ("DELETE", f"/applications/{S}/guilds/{S}/commands/{S}", self._r_delete_command, True),
            ("GET", f"/applications/{S}/emojis", self._r_app_emojis, True),
            ("POST", f"/interactions/{S}/{T}/callback", self._r_callback, False),
            ("POST", f"/webhooks/{S}/{T}", self._r_followup, False),
            ("GET", f"/webhooks/{S}/{T}", self._r_get_webhook, False),
            ("PATCH", f"/webhooks/{S}/{T}", self._r_modify_webhook, False),
            ("DELETE", f"/webhooks/{S}/{T}", self._r_modify_webhook, False),
            ("GET", f"/webhooks/{S}/{T}/messages/(@original|\\d+)", self._r_wh_get, False),
            ("PATCH", f"/webhooks/{S}/{T}/messages/(@original|\\d+)", self._r_wh_edit, False),
            ("DELETE", f"/webhooks/{S}/{T}/messages/(@original|\\d+)", self._r_wh_delete, False),
            ("GET", f"/channels/{S}", self._r_get_channel, True),
            ("GET", f"/channels/{S}/messages", self._r_list_messages, True),
            ("POST", f"/channels/{S}/messages", self._r_create_message, True),
            ("GET", f"/channels/{S}/messages/{S}", self._r_get_message, True),
            ("PATCH", f"/channels/{S}/messages/{S}", self._r_edit_message, True),
            ("DELETE", f"/channels/{S}/messages/{S}", self._r_delete_message, True),
            ("POST", f"/channels/{S}/typing", self._r_typing, True),
            ("PUT", f"/channels/{S}/messages/{S}/reactions/{T}/@me", self._r_add_reaction, True),
            ("DELETE", f"/channels/{S}/messages/{S}/reactions/{T}/@me", self._r_remove_reaction, True),
            ("GET", f"/guilds/{S}", self._r_get_guild, True),
            ("GET", f"/guilds/{S}/channels", self._r_guild_channels, True),
            ("GET", f"/guilds/{S}/roles", self._r_guild_roles, True),
            ("GET", f"/guilds/{S}/members/{S}", self._r_guild_member, True),
        ]
        return [(m, re.compile(p), h, auth) for m, p, h, auth in table]

    # ------------------------------------------------------------------ REST: identity, apps, commands

    async def _r_gateway(self, request, body, files) -> web.Response:
        return _json_response({"url": "wss://gateway.discord.gg"})

    async def _r_gateway_bot(self, request, body, files) -> web.Response:
        return _json_response(
            {
                "url": "wss://gateway.discord.gg",
                "shards": 1,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 999,
                    "reset_after": 0,
                    "max_concurrency": 1,
                },
            }
        )

    async def _r_me(self, request, body, files) -> web.Response:
        return _json_response(
            {**self.bot_user.payload(), "verified": True, "mfa_enabled": False, "flags": 0, "bio": ""}
        )

    async def _r_get_user(self, request, body, files, uid) -> web.Response:
        user = self.users.get(int(uid))
        if user is None:
            raise FakeDiscordError(404, 10013, "Unknown User")
        return _json_response(user.payload())

    async def _r_create_dm(self, request, body, files) -> web.Response:
        recipient = self.users.get(int((body or {}).get("recipient_id", 0)))
        if recipient is None:
            raise FakeDiscordError(404, 10013, "Unknown User")
        for ch in self.dm_channels.values():
            if ch.recipients and ch.recipients[0].id == recipient.id:
                return _json_response(ch.payload())
        ch = FakeChannel(id=self._ids.next(), name=f"dm-{recipient.username}", guild_id=None, type=1)
        ch.recipients = [recipient]
        self.dm_channels[ch.id] = ch
        return _json_response(ch.payload())

    async def _r_app_info(self, request, body, files) -> web.Response:
        return _json_response(
            {
                "id": str(self.application_id),
                "name": self.bot_user.username,
                "icon": None,
                "description": "fake application",
                "summary": "",
                "type": None,
                "hook": True,
                "bot_public": False,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "owner": self.owner.payload(),
                "team": None,
                "flags": 0,
                "bot": self.bot_user.payload(),
                "rpc_origins": [],
                "tags": [],
                "redirect_uris": [],
                "interactions_endpoint_url": None,
                "approximate_guild_count": len(self.guilds),
                "integration_types_config": {"0": {}},
            }
        )

    async def _r_app_emojis(self, request, body, files, app_id) -> web.Response:
        return _json_response({"items": []})

    def _check_app(self, app_id: str) -> None:
        if int(app_id) != self.application_id:
            raise FakeDiscordError(403, 50001, "Missing Access")

    def _command_store(self, guild_id: str | None) -> list[dict]:
        if guild_id is None:
            return self.global_commands
        gid = int(guild_id)
        if gid not in self.guilds:
            raise FakeDiscordError(403, 50001, "Missing Access")
        return self.guild_commands.setdefault(gid, [])

    def _validate_command(self, cmd: dict, errs: _FormErrors, where: list) -> None:
        ctype = cmd.get("type", 1)
        name = cmd.get("name", "")
        if not COMMAND_NAME_RE.fullmatch(name) or (ctype == 1 and name != name.lower()):
            errs.add(where + ["name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
        if ctype == 1 and not 1 <= len(cmd.get("description", "")) <= 100:
            errs.add(where + ["description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        perms = cmd.get("default_member_permissions")  # discord.py sends an int; Discord stores a string
        if perms is not None and not (isinstance(perms, int) or (isinstance(perms, str) and perms.isdigit())):
            errs.add(where + ["default_member_permissions"], "NUMBER_TYPE_COERCE", "Value is not int.")

        def check_options(options: list[dict], path: list) -> None:
            if len(options) > 25:
                errs.add(path, "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            seen_optional = False
            for i, opt in enumerate(options):
                if not COMMAND_NAME_RE.fullmatch(opt.get("name", "")) or opt["name"] != opt["name"].lower():
                    errs.add(
                        path + [i, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid"
                    )
                if not 1 <= len(opt.get("description", "")) <= 100:
                    errs.add(
                        path + [i, "description"],
                        "BASE_TYPE_BAD_LENGTH",
                        "Must be between 1 and 100 in length.",
                    )
                if len(opt.get("choices") or []) > 25:
                    errs.add(path + [i, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
                if opt.get("autocomplete") and opt.get("choices"):
                    errs.add(
                        path + [i, "autocomplete"],
                        "AUTOCOMPLETE_AND_CHOICES",
                        "Autocomplete cannot be set with choices",
                    )
                if opt.get("type") in (OPT_SUB_COMMAND, OPT_SUB_COMMAND_GROUP):
                    check_options(opt.get("options") or [], path + [i, "options"])
                elif opt.get("required"):
                    if seen_optional:
                        errs.add(
                            path + [i, "required"],
                            "APPLICATION_COMMAND_OPTIONS_REQUIRED_INVALID",
                            "Required options must be placed before non-required options",
                        )
                else:
                    seen_optional = True

        check_options(cmd.get("options") or [], where + ["options"])

    def _store_command(self, store: list[dict], cmd: dict, guild_id: str | None) -> dict:
        ctype = cmd.get("type", 1)
        existing = next((c for c in store if c["name"] == cmd["name"] and c.get("type", 1) == ctype), None)
        stored = {
            "description": "",
            "options": [],
            "default_member_permissions": None,
            "dm_permission": True,
            "nsfw": False,
            "contexts": None,
            "integration_types": [0],
            **cmd,
            "id": existing["id"] if existing else str(self._ids.next()),
            "application_id": str(self.application_id),
            "type": ctype,
            "version": str(self._ids.next()),
        }
        if stored["default_member_permissions"] is not None:
            stored["default_member_permissions"] = str(stored["default_member_permissions"])
        if guild_id is not None:
            stored["guild_id"] = guild_id
        return stored

    async def _r_get_commands(self, request, body, files, app_id, guild_id=None) -> web.Response:
        self._check_app(app_id)
        return _json_response(self._command_store(guild_id))

    async def _r_put_commands(self, request, body, files, app_id, guild_id=None) -> web.Response:
        self._check_app(app_id)
        store = self._command_store(guild_id)
        commands = body or []
        errs = _FormErrors()
        if len([c for c in commands if c.get("type", 1) == 1]) > 100:
            errs.add([], "BASE_TYPE_MAX_LENGTH", "Must be 100 or fewer in length.")
        names: set[tuple[str, int]] = set()
        for i, cmd in enumerate(commands):
            self._validate_command(cmd, errs, [i])
            key = (cmd.get("name", ""), cmd.get("type", 1))
            if key in names:
                errs.add(
                    [i, "name"],
                    "APPLICATION_COMMANDS_DUPLICATE_NAME",
                    "Application command names must be unique",
                )
            names.add(key)
        errs.raise_if_any()
        new = [self._store_command(store, cmd, guild_id) for cmd in commands]
        store[:] = new
        self._bump()
        return _json_response(new)

    async def _r_post_command(self, request, body, files, app_id, guild_id=None) -> web.Response:
        self._check_app(app_id)
        store = self._command_store(guild_id)
        errs = _FormErrors()
        self._validate_command(body or {}, errs, [])
        errs.raise_if_any()
        stored = self._store_command(store, body, guild_id)
        store[:] = [c for c in store if c["id"] != stored["id"]] + [stored]
        self._bump()
        return _json_response(stored, 201)

    async def _r_delete_command(self, request, body, files, app_id, *rest) -> web.Response:
        self._check_app(app_id)
        guild_id, cmd_id = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
        store = self._command_store(guild_id)
        if not any(c["id"] == cmd_id for c in store):
            raise FakeDiscordError(404, 10063, "Unknown application command")
        store[:] = [c for c in store if c["id"] != cmd_id]
        return _empty_response()

    # ------------------------------------------------------------------ REST: interactions

    async def _r_callback(self, request, body, files, iid, token) -> web.Response:
        inter = self.interactions.get(int(iid))
        now = time.monotonic()
        body = body or {}
        ctype = int(body.get("type", 0))
        data = body.get("data")
        if inter is None or inter.token != token:
            raise _unknown_interaction()
        record = CallbackRecord(type=ctype, data=data, at=now, latency=now - inter.dispatched_at, status=0)
        inter.callbacks.append(record)
        try:
            if inter.answered:
                raise FakeDiscordError(400, 40060, "Interaction has already been acknowledged.")
            if inter.expired or record.latency > self.interaction_deadline:
                inter.expired = True
                raise _unknown_interaction()
            resource = self._apply_callback(inter, ctype, data or {}, files)
            record.status = 200 if request.query.get("with_response") in ("1", "true", "True") else 204
            record.message = resource
        except FakeDiscordError as err:
            record.status, record.error = err.status, err.body()
            self._bump()
            raise
        if inter._expiry is not None:
            inter._expiry.cancel()
            inter._expiry = None
        self._bump()
        if record.status == 204:
            return _empty_response()
        answer: dict[str, Any] = {
            "interaction": {
                "id": str(inter.id),
                "type": inter.type,
                "response_message_loading": ctype == DEFERRED_CHANNEL_MESSAGE,
                "response_message_ephemeral": bool(resource is not None and resource.ephemeral),
            }
        }
        if resource is not None:
            answer["interaction"]["response_message_id"] = str(resource.id)
        if ctype in (CHANNEL_MESSAGE, DEFERRED_CHANNEL_MESSAGE, UPDATE_MESSAGE) and resource is not None:
            answer["resource"] = {"type": ctype, "message": resource.payload(self.users)}
        elif ctype in (DEFERRED_UPDATE_MESSAGE,):
            answer["resource"] = {"type": ctype}
        return _json_response(answer)

    def _apply_callback(
        self, inter: FakeInteraction, ctype: int, data: dict, files: list[tuple[str, str, bytes]]
    ) -> FakeMessage | None:
        channel = self.channel(inter.channel_id)
        bad_type = FakeDiscordError(
            400,
            50035,
            "Invalid Form Body",
            {"type": {"_errors": [{"code": "INTERACTION_RESPONSE_TYPE_INVALID", "message": "Invalid type"}]}},
        )
        if inter.type == AUTOCOMPLETE:
            if ctype != AUTOCOMPLETE_RESULT:
                raise bad_type
            choices = data.get("choices") or []
            errs = _FormErrors()
            if len(choices) > 25:
                errs.add(["data", "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            for i, choice in enumerate(choices):
                if not 1 <= len(str(choice.get("name", ""))) <= 100:
                    errs.add(
                        ["data", "choices", i, "name"],
                        "BASE_TYPE_BAD_LENGTH",
                        "Must be between 1 and 100 in length.",
                    )
            errs.raise_if_any()
            return None
        if ctype == AUTOCOMPLETE_RESULT:
            raise bad_type
        if ctype == CHANNEL_MESSAGE:
            self._validate_message(data, creating=True, has_files=bool(files))
            mtype = 20 if inter.type == APPLICATION_COMMAND else 0
            msg = self._new_message(channel, self.bot_user, data, files=files, inter=inter, mtype=mtype)
            self._store_created(msg, notify=True)
            inter.original = msg
            return msg
        if ctype == DEFERRED_CHANNEL_MESSAGE:
            flags = LOADING | ((data.get("flags") or 0) & EPHEMERAL)
            mtype = 20 if inter.type == APPLICATION_COMMAND else 0
            msg = self._new_message(channel, self.bot_user, {}, inter=inter, mtype=mtype, flags=flags)
            self._store_created(msg, notify=False)
            inter.original = msg
            inter.deferred_pending = True
            return msg
        if ctype in (DEFERRED_UPDATE_MESSAGE, UPDATE_MESSAGE):
            target = inter.message
            if inter.type not in (MESSAGE_COMPONENT, MODAL_SUBMIT) or target is None:
                raise bad_type
            target = self.messages_by_id.get(target.id, target)
            inter.original = target
            if ctype == UPDATE_MESSAGE:
                self._apply_edit(target, data, files)
            return target
        if ctype == MODAL:
            if inter.type == MODAL_SUBMIT:
                raise bad_type
            errs = _FormErrors()
            if not 1 <= len(data.get("title", "")) <= 45:
                errs.add(["data", "title"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 45 in length.")
            if not 1 <= len(data.get("custom_id", "")) <= 100:
                errs.add(
                    ["data", "custom_id"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."
                )
            self._validate_components(
                data.get("components") or [], IS_COMPONENTS_V2, errs, ["data", "components"]
            )
            errs.raise_if_any()
            return None
        raise bad_type

    def _interaction_for_token(self, app_id: str, token: str) -> FakeInteraction:
        inter = self._by_token.get(token)
        if inter is None or int(app_id) != self.application_id:
            raise _unknown_webhook()
        if time.monotonic() >= inter.token_expires_at:
            raise FakeDiscordError(401, 50027, "Invalid Webhook Token")
        if not inter.answered:
            # Never acknowledged (or not yet): there is no webhook behind the token.
            raise _unknown_webhook()
        return inter

    def _interaction_message(self, inter: FakeInteraction, ref: str) -> FakeMessage:
        if ref == "@original":
            if inter.original is None:
                raise _unknown_message()
            msg = inter.original
        else:
            msg = next((m for m in [inter.original, *inter.followups] if m and m.id == int(ref)), None)
            if msg is None:
                raise _unknown_message()
        msg = self.messages_by_id.get(msg.id, msg)
        if msg.deleted:
            raise _unknown_message()
        return msg

    async def _r_followup(self, request, body, files, app_id, token) -> web.Response:
        inter = self._interaction_for_token(app_id, token)
        body = body or {}
        wait = request.query.get("wait", "false").lower() in ("1", "true")
        if inter.deferred_pending and inter.original is not None:
            # The first follow-up after a "thinking" defer replaces it, with the defer's visibility.
            self._validate_message(body, creating=True, has_files=bool(files))
            msg = inter.original
            self._fill_deferred(msg, body, files)
            inter.deferred_pending = False
        else:
            self._validate_message(body, creating=True, has_files=bool(files))
            channel = self.channel(inter.channel_id)
            msg = self._new_message(channel, self.bot_user, body, files=files, inter=inter)
            self._store_created(msg, notify=True)
        inter.followups.append(msg)
        self._bump()
        return _json_response(msg.payload(self.users)) if wait else _empty_response()

    async def _r_get_webhook(self, request, body, files, app_id, token) -> web.Response:
        self._interaction_for_token(app_id, token)
        return _json_response(
            {
                "id": str(self.application_id),
                "type": 3,
                "name": self.bot_user.username,
                "avatar": None,
                "application_id": str(self.application_id),
                "token": token,
            }
        )

    async def _r_modify_webhook(self, request, body, files, app_id, token) -> web.Response:
        self._interaction_for_token(app_id, token)
        raise FakeDiscordError(405, 0, "405: Method Not Allowed")

    async def _r_wh_get(self, request, body, files, app_id, token, ref) -> web.Response:
        inter = self._interaction_for_token(app_id, token)
        return _json_response(self._interaction_message(inter, ref).payload(self.users))

    async def _r_wh_edit(self, request, body, files, app_id, token, ref) -> web.Response:
        inter = self._interaction_for_token(app_id, token)
        msg = self._interaction_message(inter, ref)
        if msg.loading:
            self._fill_deferred(msg, body or {}, files)
            inter.deferred_pending = False
        else:
            self._apply_edit(msg, body or {}, files)
        return _json_response(msg.payload(self.users))

    async def _r_wh_delete(self, request, body, files, app_id, token, ref) -> web.Response:
        inter = self._interaction_for_token(app_id, token)
        self._delete_message(self._interaction_message(inter, ref))
        return _empty_response()

    # ------------------------------------------------------------------ REST: channels and guilds

    def _rest_channel(self, cid: str) -> FakeChannel:
        try:
            return self.channel(int(cid))
        except KeyError:
            raise _unknown_channel() from None

    def _rest_message(self, cid: str, mid: str) -> FakeMessage:
        self._rest_channel(cid)
        msg = self.messages_by_id.get(int(mid))
        if msg is None or msg.deleted or msg.channel_id != int(cid) or msg.ephemeral:
            raise _unknown_message()
        return msg

    async def _r_get_channel(self, request, body, files, cid) -> web.Response:
        return _json_response(self._rest_channel(cid).payload())

    async def _r_list_messages(self, request, body, files, cid) -> web.Response:
        ch = self._rest_channel(cid)
        msgs = list(reversed(self.messages(ch)))  # newest first, like Discord
        q = request.query
        if "before" in q:
            msgs = [m for m in msgs if m.id < int(q["before"])]
        if "after" in q:
            msgs = [m for m in msgs if m.id > int(q["after"])]
        limit = max(1, min(100, int(q.get("limit", 50))))
        return _json_response([m.payload(self.users) for m in msgs[:limit]])

    async def _r_create_message(self, request, body, files, cid) -> web.Response:
        ch = self._rest_channel(cid)
        body = body or {}
        self._validate_message(body, creating=True, has_files=bool(files))
        if body.get("message_reference"):
            ref_id = int(body["message_reference"].get("message_id", 0))
            if ref_id not in self.messages_by_id and body["message_reference"].get(
                "fail_if_not_exists", True
            ):
                raise FakeDiscordError(
                    400,
                    50035,
                    "Invalid Form Body",
                    {
                        "message_reference": {
                            "_errors": [
                                {"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}
                            ]
                        }
                    },
                )
        msg = self._new_message(
            ch, self.bot_user, body, files=files, flags=(body.get("flags") or 0) & ~EPHEMERAL
        )
        self._store_created(msg, notify=True)
        return _json_response(msg.payload(self.users))

    async def _r_get_message(self, request, body, files, cid, mid) -> web.Response:
        return _json_response(self._rest_message(cid, mid).payload(self.users))

    async def _r_edit_message(self, request, body, files, cid, mid) -> web.Response:
        msg = self._rest_message(cid, mid)
        if msg.author.id != self.bot_user.id:
            raise FakeDiscordError(403, 50005, "Cannot edit a message authored by another user")
        self._apply_edit(msg, body or {}, files)
        return _json_response(msg.payload(self.users))

    async def _r_delete_message(self, request, body, files, cid, mid) -> web.Response:
        self._delete_message(self._rest_message(cid, mid))
        return _empty_response()

    async def _r_typing(self, request, body, files, cid) -> web.Response:
        self._rest_channel(cid)
        return _empty_response()

    async def _r_add_reaction(self, request, body, files, cid, mid, emoji) -> web.Response:
        msg = self._rest_message(cid, mid)
        msg.reactions.setdefault(unquote(emoji), set()).add(self.bot_user.id)
        self._bump()
        return _empty_response()

    async def _r_remove_reaction(self, request, body, files, cid, mid, emoji) -> web.Response:
        msg = self._rest_message(cid, mid)
        msg.reactions.get(unquote(emoji), set()).discard(self.bot_user.id)
        self._bump()
        return _empty_response()

    def _rest_guild(self, gid: str) -> FakeGuild:
        guild = self.guilds.get(int(gid))
        if guild is None:
            raise FakeDiscordError(404, 10004, "Unknown Guild")
        return guild

    async def _r_get_guild(self, request, body, files, gid) -> web.Response:
        guild = self._rest_guild(gid)
        data = guild.payload(members=[])
        for key in ("members", "channels", "threads", "presences", "voice_states", "member_count", "large"):
            data.pop(key, None)
        return _json_response(data)

    async def _r_guild_channels(self, request, body, files, gid) -> web.Response:
        return _json_response([c.payload() for c in self._rest_guild(gid).channels.values()])

    async def _r_guild_roles(self, request, body, files, gid) -> web.Response:
        return _json_response([r.payload() for r in self._rest_guild(gid).roles.values()])

    async def _r_guild_member(self, request, body, files, gid, uid) -> web.Response:
        member = self._rest_guild(gid).members.get(int(uid))
        if member is None:
            raise FakeDiscordError(404, 10007, "Unknown Member")
        return _json_response(member.payload())


# --------------------------------------------------------------------------------------------------
# Running a bot against the fake
# --------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def run_bot(bot: Any, fake: FakeDiscord, *, ready_timeout: float = 10.0) -> AsyncIterator[Any]:
    """Start ``bot`` (built with ``connector=fake.connector()``) until ``on_ready``; close it on exit."""
    task = asyncio.create_task(bot.start(fake.token), name="fake-discord-bot")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ready_timeout
        while not bot.is_ready():
            if task.done():
                task.result()  # raises the bot's start-up error
                raise RuntimeError("bot.start() returned before the bot became ready")
            if loop.time() > deadline:
                raise TimeoutError(
                    f"bot not ready after {ready_timeout}s (unknown routes: {fake.unknown_routes})"
                )
            await asyncio.sleep(0.01)
        yield bot
    finally:
        await bot.close()
        try:
            await asyncio.wait_for(task, 5.0)
        except (asyncio.CancelledError, TimeoutError):
            task.cancel()
        except Exception:
            log.exception("bot.start() ended with an error")


__all__ = [
    "CallbackRecord",
    "CommandHidden",
    "FakeChannel",
    "FakeDiscord",
    "FakeDiscordError",
    "FakeDiscordResolver",
    "FakeGuild",
    "FakeInteraction",
    "FakeMember",
    "FakeMessage",
    "FakeRole",
    "FakeUser",
    "InteractionExpired",
    "is_discord_host",
    "make_connector",
    "run_bot",
]
