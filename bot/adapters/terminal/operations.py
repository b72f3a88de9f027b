"""Every operation the engine offers, as a terminal command read from its Spec (nothing to declare):
`/<kind> [CLUSTER] [VALUE ...] [key=value ...] [--flag ...]`.

The words map onto the spec's pydantic `params` model: a yes/no parameter is a flag (`--name` turns on
one that is off by default, `--no-name` turns off one that is on: `--no-preserve-jobs`); any parameter
may be given as `name=value`; bare words fill the required parameters in their order, after the
cluster when the operation needs one (`/add-worker v6e-8 reserved`, `/restart local`). The engine
validates the values against the model; here only the shape of the line is checked.
"""

from __future__ import annotations

import difflib
from typing import Any

from bot.protocol.model import Spec
from ops.errors import BadInput


def flags(spec: Spec) -> dict[str, tuple[str, bool]]:
    """`--flag` -> (parameter, the value it sets), for each yes/no parameter of the operation."""
    out = {}
    for name, info in spec.params.model_fields.items():
        if info.annotation is bool:
            word = name.replace("_", "-")
            out[f"--no-{word}" if info.default is True else f"--{word}"] = (name, info.default is not True)
    return out


def usage(spec: Spec) -> str:
    """`/restart CLUSTER [--no-preserve-jobs] [--override] [--force-unbacked]`."""
    parts = [f"/{spec.kind}"] + (["CLUSTER"] if spec.needs_cluster else [])
    flagged = {name for name, _ in flags(spec).values()}
    for name, info in spec.params.model_fields.items():
        if name in flagged:
            continue
        parts.append(name.upper() if info.is_required() else f"[{name}={info.get_default()}]")
    return " ".join(parts + [f"[{f}]" for f in flags(spec)])


def describe(spec: Spec) -> str:
    """The operation for /help: its usage, what it does, and each parameter's description."""
    lines = [f"  {usage(spec)}", f"      {spec.summary or spec.kind}"]
    words = {name: f" ({flag})" for flag, (name, _) in flags(spec).items()}
    for name, info in spec.params.model_fields.items():
        said = f": {info.description}" if info.description else ""
        lines.append(f"      {name}{words.get(name, '')}{said}")
    return "\n".join(lines)


def parse(spec: Spec, words: list[str]) -> tuple[str | None, dict[str, Any]]:
    """(cluster, parameters) from the words after `/<kind>`; BadInput with the usage when the line
    does not fit the operation's shape."""
    known = flags(spec)
    params: dict[str, Any] = {}
    bare: list[str] = []
    for word in words:
        if word.startswith("-"):
            if word not in known:
                close = difflib.get_close_matches(word, list(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise BadInput(f"unknown flag {word}{hint} (usage: {usage(spec)})")
            name, value = known[word]
            params[name] = value
        elif "=" in word:
            name, _, value = word.partition("=")
            params[name.replace("-", "_")] = value
        else:
            bare.append(word)
    required = [n for n, info in spec.params.model_fields.items() if info.is_required() and n not in params]
    cluster = bare.pop(0) if spec.needs_cluster and len(bare) > len(required) else None
    if len(bare) > len(required):
        raise BadInput(f"too many words: {' '.join(bare[len(required) :])} (usage: {usage(spec)})")
    params.update(zip(required, bare, strict=False))
    return cluster, params
