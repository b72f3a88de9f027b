"""The audit journal: an append-only list of events per operation, one create-only object each."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ops.store import Conflict, Store


def append(store: Store, scope: str, event: str, **data: Any) -> str:
    """Add `event` to the journal under `scope`; returns its key. Never overwrites an entry."""
    seq = len(store.list(f"{scope}/journal/"))
    entry = {"at": datetime.now(UTC).isoformat(), "event": event, **data}
    body = json.dumps(entry, default=str, sort_keys=True).encode()
    for _ in range(100):
        key = f"{scope}/journal/{seq:06d}-{event}.json"
        try:
            store.create(key, body)
            return key
        except Conflict:
            seq += 1
    raise RuntimeError(f"could not append to the journal of {scope}")


def read(store: Store, scope: str) -> list[dict[str, Any]]:
    """All entries of a journal, oldest first."""
    out = []
    for key in store.list(f"{scope}/journal/"):
        got = store.read(key)
        if got is not None:
            out.append(json.loads(got.data))
    return out
