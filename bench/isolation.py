"""A benchmark's private world: its own CLUSTERBOT_HOME, store and registry copy, whose `local` cluster
runs on the benchmark's own ports, so it never meets a developer's cluster, a test session's, or another
benchmark's (nor their tokens)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def isolate(home: Path, ports: dict[str, int], **local: Any) -> Path:
    """Point this process and its children at `home`; the registry copy's `local` cluster gets `ports`
    (and any other `local` fields given). Returns the registry copy's path."""
    from ops.registry import DEFAULT_REGISTRY

    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text())
    raw["clusters"]["local"].update(
        local_ports=ports, dashboard_url=f"http://127.0.0.1:{ports['dashboard']}", **local
    )
    registry = home / "clusters.yaml"
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    for key in list(os.environ):
        if key.startswith(("RAY_AUTH", "CLUSTERBOT_", "DISCORD_")) or key == "RAY_ADDRESS":
            del os.environ[key]
    os.environ.update(
        CLUSTERBOT_HOME=str(home),
        CLUSTERBOT_REGISTRY=str(registry),
        CLUSTERBOT_STORE=str(home / "store"),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return registry
