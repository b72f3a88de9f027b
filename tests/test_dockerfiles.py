"""Static checks of docker/: no Docker daemon or registry here (FINDINGS), so the images are not built.

Each Dockerfile must parse (known instructions, continuation lines joined), the cluster image must run
the same Ray as clusterbot, and the bot image must start `python -m bot`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import ray

from ops.registry import REPO_ROOT

CLUSTER = REPO_ROOT / "docker" / "cluster" / "Dockerfile"
BOT = REPO_ROOT / "docker" / "bot" / "Dockerfile"

KEYWORDS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped (also inside a
    continuation, as Docker does). Raises ValueError on an unknown instruction or a dangling `\\`."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        keyword, _, args = " ".join(p for p in parts if p).partition(" ")
        parts = []
        if keyword.upper() not in KEYWORDS:
            raise ValueError(f"line {start}: unknown instruction {keyword!r}")
        if not args.strip():
            raise ValueError(f"line {start}: {keyword} without arguments")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    if parts:
        raise ValueError(f"line {start}: the file ends inside a continuation")
    if not out:
        raise ValueError("no instructions")
    first = next((i for i in out if i.keyword != "ARG"), None)
    if first is None or first.keyword != "FROM":
        raise ValueError("the first instruction after ARGs must be FROM")
    return out


def only(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"use the exec (JSON) form, not {args!r}"
    return json.loads(args)


# --- the parser itself ----------------------------------------------------------------------------


def test_parser_joins_continuations_and_skips_comments():
    text = '# c\nFROM x:1\nRUN a \\\n  # inside\n  && b \\\n  && c\nCMD ["d"]\n'
    assert parse(text) == [
        Instruction("FROM", "x:1", 2),
        Instruction("RUN", "a && b && c", 3),
        Instruction("CMD", '["d"]', 7),
    ]


@pytest.mark.parametrize(
    "text, error",
    [
        ("FROM x\nRUNN y\n", "unknown instruction 'RUNN'"),
        ("FROM x\nRUN a \\\n", "ends inside a continuation"),
        ("RUN a\nFROM x\n", "must be FROM"),
        ("FROM x\nRUN\n", "without arguments"),
    ],
)
def test_parser_rejects_broken_files(text, error):
    with pytest.raises(ValueError, match=error):
        parse(text)


# --- the cluster image ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CLUSTER, BOT], ids=["cluster", "bot"])
def test_dockerfile_parses(path):
    assert parse(path.read_text())


def test_cluster_image_runs_the_same_ray_as_clusterbot():
    froms = only(parse(CLUSTER.read_text()), "FROM")
    assert [f.args for f in froms] == [f"rayproject/ray:{ray.__version__}-py311"]


def test_cluster_image_has_gcloud_for_the_token_fetch():
    runs = " ".join(i.args for i in only(parse(CLUSTER.read_text()), "RUN"))
    assert "install -y --no-install-recommends google-cloud-cli" in runs


def test_cluster_image_has_what_the_heads_autoscaler_imports():
    """The head's autoscaler runs Ray's GCP node provider, which builds its clients with
    google-api-python-client (the rayproject image lacks it): without it no TPU worker is ever launched."""
    provider = Path(ray.__file__).parent / "autoscaler" / "_private" / "gcp" / "config.py"
    assert "from googleapiclient import discovery" in provider.read_text()
    runs = [i.args for i in only(parse(CLUSTER.read_text()), "RUN") if "pip install" in i.args]
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s\"']+)", " ".join(runs)))
    assert pins.get("google-api-python-client") == metadata.version("google-api-python-client")


def test_cluster_image_pins_what_clusterbot_also_uses_to_the_same_version():
    runs = [i.args for i in only(parse(CLUSTER.read_text()), "RUN") if "pip install" in i.args]
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s\"']+)", " ".join(runs)))
    assert "jax" in pins  # the TPU runtime
    for name, version in pins.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        assert version == installed, f"{name}: image pins {version}, clusterbot runs {installed}"


# --- the bot image --------------------------------------------------------------------------------


def test_bot_image_installs_the_project_and_runs_the_bot():
    instructions = parse(BOT.read_text())
    assert [f.args for f in only(instructions, "FROM")] == ["python:3.11-slim"]
    assert any(shlex.split(i.args)[:3] == ["pip", "install", "-e"] for i in only(instructions, "RUN"))
    assert not only(instructions, "ENTRYPOINT")
    assert exec_form(only(instructions, "CMD")[-1].args) == ["python", "-m", "bot"]


def test_bot_image_copies_only_what_exists_and_bakes_in_no_secrets():
    instructions = parse(BOT.read_text())
    for copy in only(instructions, "COPY"):
        *sources, _dest = shlex.split(copy.args)
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"line {copy.line}: COPY {source}: not in the repository"
    for env in only(instructions, "ENV"):
        assert not re.search(r"TOKEN|SECRET|PASSW", env.args, re.IGNORECASE), env
