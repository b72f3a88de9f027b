"""The two API versions over one state: the state keeps v2alpha1 messages (the superset), and the v2
servicer converts by field name (the versions are not wire-compatible, GCP_API_FACTS.md 1.5).

What v2 cannot say is dropped on the way out (a best-effort tier, `guaranteed.reserved`), as a v2 client
of the real service would not see it either.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from google.cloud import tpu_v2, tpu_v2alpha1

V2 = "v2"
V2ALPHA1 = "v2alpha1"
CANON = V2ALPHA1


def types(api: str) -> ModuleType:
    """The client library's types module for `api`."""
    return {V2: tpu_v2, V2ALPHA1: tpu_v2alpha1}[api]


def convert(msg: Any, api: str) -> Any:
    """A proto-plus message as the same-named type of `api` (by JSON field names, unknown ones dropped)."""
    target = _same_type(type(msg), api)
    if target is type(msg):
        return msg
    return target.from_json(type(msg).to_json(msg), ignore_unknown_fields=True)


def _same_type(cls: type, api: str) -> type:
    mod = types(api)
    obj: Any = mod
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part)
    return obj
