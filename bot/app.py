"""Wiring shared by every adapter: settings -> store, registry, engine with the registered operations."""

from __future__ import annotations

from collections.abc import Callable

from bot.config import Settings
from bot.operations import SPECS
from bot.protocol.engine import Chat, Engine
from ops.registry import Registry, load_registry
from ops.store import Store, open_store


def build_engine(
    chat: Chat,
    settings: Settings,
    registry: Registry | None = None,
    store: Store | None = None,
    owner_to_chat: Callable[[str], str | None] | None = None,
) -> Engine:
    """The engine for `chat`: the CLI's store (CLUSTERBOT_STORE) and registry, the bot config's rights."""
    return Engine(
        store or open_store(),
        registry or load_registry(),
        settings.config,
        chat,
        SPECS,
        owner_to_chat=owner_to_chat,
    )
