"""Wiring shared by every adapter: settings -> store, registry, engine with the registered operations."""

from __future__ import annotations

from collections.abc import Callable

from bot.config import Settings
from bot.operations import SPECS
from bot.protocol.engine import Chat, Engine, Spec
from ops.registry import Registry, load_registry
from ops.restart import Settings as RestartSettings
from ops.store import Store, open_store


def build_engine(
    chat: Chat,
    settings: Settings,
    registry: Registry | None = None,
    store: Store | None = None,
    owner_to_chat: Callable[[str], str | None] | None = None,
    specs: dict[str, Spec] | None = None,
    restart_settings: RestartSettings | None = None,
) -> Engine:
    """The engine for `chat`: the CLI's store (CLUSTERBOT_STORE) and registry, the bot config's rights,
    the registered operations (tests pass their own)."""
    return Engine(
        store or open_store(),
        registry or load_registry(),
        settings.config,
        chat,
        SPECS if specs is None else specs,
        owner_to_chat=owner_to_chat,
        restart_settings=restart_settings,
    )
