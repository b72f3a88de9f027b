"""Wiring shared by every adapter: settings -> store, registry, engine with the registered operations."""

from __future__ import annotations

from collections.abc import Callable

from bot.config import Settings
from bot.operations import registered
from bot.protocol.engine import Chat, Engine, Spec
from ops.context import Context
from ops.restart import Settings as RestartSettings


def build_engine(
    chat: Chat,
    settings: Settings,
    ctx: Context | None = None,
    owner_to_chat: Callable[[str], str | None] | None = None,
    specs: dict[str, Spec] | None = None,
    restart_settings: RestartSettings | None = None,
) -> Engine:
    """The engine for `chat`: the CLI's context (store CLUSTERBOT_STORE, registry, drivers) unless
    given, the bot config's rights, the registered operations (with `restart_settings`, else the
    CLUSTERBOT_* defaults) unless `specs` are given (tests pass their own)."""
    return Engine(
        ctx or Context(),
        settings.config,
        chat,
        registered(restart_settings) if specs is None else specs,
        owner_to_chat=owner_to_chat,
    )
