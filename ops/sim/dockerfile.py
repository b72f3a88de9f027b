"""What `docker build` would refuse before running anything, for the simulated Cloud Build (no Docker
daemon here, FINDINGS.md): the Dockerfile parses (known instructions, continuations, heredocs, parser
directives), its first instruction after global ARGs is FROM, each instruction has its arguments, COPY and
ADD sources exist in the context and stay inside it, `--target` names a stage. Messages follow BuildKit's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ops.gcp.build import ignored, read_ignore

INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip
_DIRECTIVE_RE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
_HEREDOC_RE = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_IMAGE_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)


class DockerfileError(Exception):
    """The build fails with this message (the step's last log line)."""


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Dockerfile:
    instructions: list[Instruction]
    stages: list[str] = field(default_factory=list)  # stage names (`FROM x AS name`), "" when unnamed
    base_images: list[str] = field(default_factory=list)


def parse(text: str) -> Dockerfile:
    """Instructions with their line numbers; DockerfileError as BuildKit words a parse error."""
    lines = text.splitlines()
    escape = "\\"
    i = 0
    while i < len(lines):  # parser directives: only at the very top, before any other line
        m = _DIRECTIVE_RE.match(lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise DockerfileError(f"invalid escape token '{m.group(2)}' does not match ` or \\")
            escape = m.group(2)
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        raw = lines[i]
        start = i + 1
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        text_ = raw.rstrip()
        while text_.endswith(escape):
            text_ = text_[: -len(escape)]
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1  # comments and blank lines inside a continuation are dropped
            if i >= len(lines):
                break
            text_ += " " + lines[i].strip()
            i += 1
        keyword, _, args = text_.strip().partition(" ")
        keyword = keyword.upper()
        if keyword not in INSTRUCTIONS:
            raise DockerfileError(f"dockerfile parse error on line {start}: unknown instruction: {keyword}")
        for heredoc in _HEREDOC_RE.finditer(args) if keyword in ("RUN", "COPY", "ADD") else ():
            word, strip = heredoc.group(3), heredoc.group(1) == "-"
            while i < len(lines) and (lines[i].lstrip("\t") if strip else lines[i]) != word:
                i += 1
            if i >= len(lines):
                raise DockerfileError(f"dockerfile parse error on line {start}: unterminated heredoc {word}")
            i += 1
        out.append(Instruction(start, keyword, args.strip()))
    return _stages(out)


def _stages(instructions: list[Instruction]) -> Dockerfile:
    if not instructions:
        raise DockerfileError("the Dockerfile (Dockerfile) cannot be empty")
    df = Dockerfile(instructions)
    seen_from = False
    for ins in instructions:
        if not ins.args and ins.keyword not in ("CMD", "ENTRYPOINT"):
            raise DockerfileError(
                f"dockerfile parse error on line {ins.line}: {ins.keyword} requires at least one argument"
            )
        if ins.keyword == "FROM":
            seen_from = True
            words = [w for w in ins.args.split() if not w.startswith("--platform")]
            if len(words) not in (1, 3) or len(words) == 3 and words[1].lower() != "as":
                raise DockerfileError(
                    f"dockerfile parse error on line {ins.line}: FROM requires either one or three arguments"
                )
            image = words[0]
            if "$" not in image and image not in df.stages and image != "scratch":
                if not _IMAGE_RE.match(image):
                    raise DockerfileError(f'failed to parse stage name "{image}": invalid reference format')
            df.base_images.append(image)
            df.stages.append(words[2].lower() if len(words) == 3 else "")
        elif not seen_from and ins.keyword != "ARG":
            raise DockerfileError(f"no build stage in current context (line {ins.line}: {ins.keyword})")
    return df


def check(dockerfile: Path, context: Path, target: str = "") -> Dockerfile:
    """Parse `dockerfile` and check it against the build `context` directory as `docker build` would."""
    if not context.is_dir():
        raise DockerfileError(f'unable to prepare context: path "{context.name}" not found')
    if not dockerfile.is_file():
        raise DockerfileError(
            f"unable to prepare context: unable to evaluate symlinks in Dockerfile path: "
            f"lstat {dockerfile}: no such file or directory"
        )
    df = parse(dockerfile.read_text(errors="replace"))
    if target and target.lower() not in df.stages:
        raise DockerfileError(f"failed to reach build target {target} in Dockerfile")
    patterns = read_ignore(context)
    root = context.resolve()
    for ins in df.instructions:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        words = _words(ins.args)
        if any(w.startswith("--from") for w in words) or _HEREDOC_RE.search(ins.args):
            continue  # from another stage or image, or inline content: nothing in the context
        paths = [w for w in words if not w.startswith("--")]
        if len(paths) < 2:
            raise DockerfileError(
                f"dockerfile parse error on line {ins.line}: {ins.keyword} requires at least two arguments, "
                "but only one was provided. Destination could not be determined"
            )
        for src in paths[:-1]:
            if "$" in src or ins.keyword == "ADD" and re.match(r"^[a-z]+://", src):
                continue
            path = (root / src.lstrip("/")).resolve()
            if not path.is_relative_to(root):
                raise DockerfileError(
                    f'failed to compute cache key: "{src}": forbidden path outside the build context'
                )
            matches = [
                p
                for p in root.glob(src.lstrip("/") or ".")
                if not ignored(p.relative_to(root).as_posix(), patterns)
            ]
            if not matches:
                raise DockerfileError(
                    f"failed to solve: failed to compute cache key: failed to calculate checksum of ref: "
                    f'"/{src.lstrip("/")}": not found'
                )
    return df


def _words(args: str) -> list[str]:
    if args.startswith("["):
        try:
            value = json.loads(args)
            if isinstance(value, list):
                return [str(v) for v in value]
        except json.JSONDecodeError:
            pass
    return args.split()
