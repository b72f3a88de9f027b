"""Per-cluster Ray cluster-launcher configs, rendered from one template and the registry.

`infra/cluster-template.yaml` + `infra/clusters.yaml` -> `infra/<cluster>.yaml`, one for each cluster
whose driver is "gcp". The generated files are committed (people run `ray up infra/<cluster>.yaml`);
`update_configs(check=True)` reports drift between them and the template as unified diffs and writes
nothing. Every rendered config is checked the way `ray up` checks it before it would touch GCP,
including the resources Ray's GCP provider fills in itself (`TPU-<type>-head`), which the template
leaves to it. `tpu_node_types` turns a cluster's worker types into Ray node types.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel, computed_field

from ops.errors import BadInput, OpsError
from ops.registry import REPO_ROOT, Cluster, Registry

INFRA_DIR = REPO_ROOT / "infra"
TEMPLATE_NAME = "cluster-template.yaml"
# The first line of every generated file; also how a stale generated file is recognised.
GENERATED_MARKER = "# GENERATED from infra/cluster-template.yaml by `python -m ops update-configs`."
HEADER = (
    f"{GENERATED_MARKER}\n"
    "# Do not edit: change infra/cluster-template.yaml or infra/clusters.yaml, then run\n"
    "# `python -m ops update-configs` and commit the result (`--check` fails on any drift).\n"
)
# Where nodes keep the Ray auth token inside the container (the image's user is `ray`).
TOKEN_PATH = "/home/ray/.ray/auth_token"
# Where nodes keep the workload secrets inside the container, one file per secret named as the secret.
SECRETS_DIR = "/home/ray/.secrets"

# Files in infra/ that a cluster's config must not overwrite.
_RESERVED_NAMES = {Path(TEMPLATE_NAME).stem, "clusters"}
_CLUSTER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Values go into YAML and shell commands unquoted: allow only plain tokens.
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")
_INTERPOLATED_FIELDS = (
    "ray_cluster_name",
    "project",
    "region",
    "zone",
    "bucket",
    "head_machine_type",
    "token_secret",
)


@dataclass(frozen=True)
class TpuNodeType:
    """One TPU node type of a generated config, as the template writes it."""

    name: str  # Ray's node type name: tpu_worker, tpu_slice_v6e_8, ...
    accelerator: str  # acceleratorType, e.g. v6e-8
    runtime_version: str
    chips_per_host: int  # what the raylet on each host of the slice detects
    min_workers: int  # slices
    max_workers: int  # slices


def tpu_node_types(cluster: Cluster) -> list[TpuNodeType]:
    """The cluster's worker types as Ray node types, the default worker (`tpu_worker`) first.

    The chip count is Ray's own (the function its raylet uses on a TPU host): 8 on single-host v5e/v6e
    shapes up to 8 chips, 4 per host otherwise. A node type declaring more than the hosts detect would be
    launched for demands its hosts cannot hold; fewer, and demands it could hold are never met.
    """
    from ray._private.accelerators.tpu import get_num_tpu_visible_chips_per_host

    return [
        TpuNodeType(
            name=name,
            accelerator=worker.tpu.name,
            runtime_version=worker.tpu.runtime_version,
            chips_per_host=get_num_tpu_visible_chips_per_host(worker.tpu.name),
            min_workers=worker.min_workers,
            max_workers=worker.max_workers if worker.max_workers is not None else cluster.max_workers,
        )
        for name, worker in cluster.node_types().items()
    ]


class ConfigsResult(BaseModel):
    """What `update-configs` did (or, with `check`, would do). Paths are shown as `infra/<file>`."""

    check: bool
    written: list[str] = []
    removed: list[str] = []  # stale generated files deleted (write mode)
    unchanged: list[str] = []
    differing: list[str] = []  # check mode: changed, missing or stale files (each has a diff)
    missing: list[str] = []  # check mode: part of `differing`, not on disk
    stale: list[str] = []  # check mode: part of `differing`, generated for a cluster no longer there
    diffs: dict[str, str] = {}  # check mode: unified diff per differing file, committed -> generated

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """True when the files on disk are (now) what the template and the registry generate."""
        return not self.differing

    def summary(self) -> str:
        """One line per file that matters, then the diffs; for the CLI's text output."""
        lines = [f"wrote {p}" for p in self.written] + [f"removed stale {p}" for p in self.removed]
        for p in self.differing:
            why = "missing" if p in self.missing else "stale" if p in self.stale else "differs"
            lines.append(f"{p}: {why} (run `python -m ops update-configs`)")
        if not lines:
            lines.append(f"{len(self.unchanged)} cluster configs up to date")
        return "\n".join(lines + [self.diffs[p] for p in self.differing if p in self.diffs])


def render_all(registry: Registry, infra_dir: Path | None = None) -> dict[Path, str]:
    """The generated config text of every GCP cluster, keyed by `<infra_dir>/<cluster name>.yaml`.

    Deterministic: the same template and registry give byte-identical text. The template is read from
    `infra_dir` (default: the repository's `infra/`). Raises BadInput for registry values that cannot go
    into a config, OpsError when the template does not render or Ray rejects what it renders.
    """
    infra_dir = infra_dir or INFRA_DIR
    template = _load_template(infra_dir)
    out: dict[Path, str] = {}
    for name, cluster in registry.clusters.items():
        if cluster.driver != "gcp":
            continue
        path = infra_dir / f"{_file_stem(name)}.yaml"
        out[path] = render_cluster(registry, cluster, template)
    return out


def render_cluster(
    registry: Registry,
    cluster: Cluster,
    template: jinja2.Template | None = None,
    image: str | None = None,
) -> str:
    """One GCP cluster's config text (header included), checked as `ray up` would check it.

    `image` is the cluster image's full reference; by default the registry's (`image_tag`), which is
    what the committed files carry. A start passes the store's pin instead (ops/images.py
    `render_for_start`), so a push never changes what a running cluster's new workers pull."""
    image = image or f"{registry.image(cluster)}:{cluster.image_tag}"
    _check_values(cluster, image)
    template = template or _load_template(INFRA_DIR)
    context = {
        "cluster": cluster,
        "node_types": tpu_node_types(cluster),
        "image": image,
        "token_path": TOKEN_PATH,
        "token_dir": os.path.dirname(TOKEN_PATH),
        "secrets_dir": SECRETS_DIR,
    }
    try:
        body = template.render(**context)
    except jinja2.TemplateError as e:
        raise OpsError(
            f"{TEMPLATE_NAME}: cannot render cluster {cluster.name!r}: {e}", "fix the template"
        ) from None
    text = HEADER + body
    where = f"generated config of cluster {cluster.name!r}"
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise OpsError(f"{where}: not valid YAML: {e}", f"fix infra/{TEMPLATE_NAME}") from None
    try:
        validate_ray_config(config)
    except Exception as e:  # Ray raises jsonschema, Value, Runtime and Assertion errors alike
        msg = getattr(e, "message", None) or str(e) or type(e).__name__
        raise OpsError(f"{where}: Ray rejects it: {msg}", f"fix infra/{TEMPLATE_NAME}") from None
    return text


def validate_ray_config(config: Any) -> dict[str, Any]:
    """Check a cluster-launcher config as `ray up` does before it contacts the cloud; return it filled out.

    `ray up` (ray/autoscaler/_private/commands.py `_bootstrap_config`) merges the provider's defaults
    (`prepare_config`), lets the provider fill in the resources it knows (GCP: `TPU-<type>-head` on
    every TPU node type), then checks the result against ray/autoscaler/ray-schema.json plus its own
    rules (`validate_config`: head_node_type present, sum of min_workers <= max_workers, ...).
    """
    from ray.autoscaler._private.providers import _get_node_provider_cls
    from ray.autoscaler._private.util import prepare_config, validate_config

    if not isinstance(config, dict):
        raise ValueError("a cluster config must be a mapping")
    # Ray warns on every multi-host TPU type that autoscaling pods is experimental; the template says so.
    quiet = logging.getLogger("ray.autoscaler._private.gcp.config")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        prepared = prepare_config(copy.deepcopy(config))
        provider = _get_node_provider_cls(prepared["provider"])
        prepared = provider.fillout_available_node_types_resources(prepared)
        validate_config(prepared)
    finally:
        quiet.setLevel(level)
    return prepared


def update_configs(registry: Registry, check: bool, infra_dir: Path | None = None) -> ConfigsResult:
    """Regenerate `infra/<cluster>.yaml` for every GCP cluster, or with `check` only compare.

    Write mode writes only files whose content changes (atomically) and deletes stale generated files
    (ones that carry the generated header but belong to no GCP cluster any more). Check mode writes
    nothing and returns a unified diff for every changed, missing or stale file; differences are not
    errors here: `result.ok` is False and the caller decides (the CLI exits 1).
    """
    infra_dir = infra_dir or INFRA_DIR
    rendered = render_all(registry, infra_dir)
    result = ConfigsResult(check=check)

    for path, text in rendered.items():
        shown = _shown(infra_dir, path)
        current = path.read_text() if path.is_file() else None
        if current == text:
            result.unchanged.append(shown)
        elif check:
            result.differing.append(shown)
            if current is None:
                result.missing.append(shown)
            result.diffs[shown] = _diff(current, text, shown)
        else:
            _write_atomic(path, text)
            result.written.append(shown)

    for path in sorted(infra_dir.glob("*.yaml")):
        if path in rendered or not _is_generated(path):
            continue
        shown = _shown(infra_dir, path)
        if check:
            result.differing.append(shown)
            result.stale.append(shown)
            result.diffs[shown] = _diff(path.read_text(), None, shown)
        else:
            path.unlink()
            result.removed.append(shown)
    return result


def _load_template(infra_dir: Path) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(infra_dir)),
        undefined=jinja2.StrictUndefined,  # a misspelt field fails instead of rendering as ""
        keep_trailing_newline=True,
        autoescape=False,
    )
    try:
        return env.get_template(TEMPLATE_NAME)
    except jinja2.TemplateNotFound:
        raise OpsError(f"no cluster template at {infra_dir / TEMPLATE_NAME}") from None
    except jinja2.TemplateSyntaxError as e:
        raise OpsError(f"{infra_dir / TEMPLATE_NAME}, line {e.lineno}: {e.message}") from None


def _file_stem(name: str) -> str:
    if not _CLUSTER_NAME.match(name) or name in _RESERVED_NAMES:
        raise BadInput(
            f"cluster {name!r}: its name cannot be a config file name infra/{name}.yaml",
            "use lowercase letters, digits and '-', and not 'clusters' or 'cluster-template'",
        )
    return name


def _check_values(cluster: Cluster, image: str) -> None:
    """Refuse values that would need quoting in YAML or the shell: registry values are plain tokens."""
    if cluster.token_secret is None:
        raise BadInput(
            f"cluster {cluster.name!r}: field 'token_secret' is required for a GCP cluster",
            "name the Secret Manager secret that holds the cluster's Ray auth token",
        )
    values = [(f, getattr(cluster, f)) for f in _INTERPOLATED_FIELDS if getattr(cluster, f) is not None]
    values.append(("image", image))
    values += [("workload_secrets", name) for name in cluster.workload_secrets]
    if cluster.ssh_key is not None:
        for f in ("private_secret", "public_secret"):
            if getattr(cluster.ssh_key, f) is not None:
                values.append((f"ssh_key.{f}", getattr(cluster.ssh_key, f)))
    for field, value in values:
        if not _PLAIN.match(str(value)):
            raise BadInput(
                f"cluster {cluster.name!r}: field {field!r} has an unexpected value {value!r}",
                "use letters, digits and . _ : / @ - only",
            )


def _shown(infra_dir: Path, path: Path) -> str:
    return f"{infra_dir.name}/{path.name}"


def _is_generated(path: Path) -> bool:
    try:
        with path.open() as f:
            return f.readline().rstrip("\n") == GENERATED_MARKER
    except (OSError, UnicodeDecodeError):
        return False


def _diff(committed: str | None, generated: str | None, shown: str) -> str:
    """A unified diff from what is on disk to what the template generates (/dev/null for none)."""

    def lines(text: str | None) -> list[str]:
        out = (text or "").splitlines(keepends=True)
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n\\ No newline at end of file\n"
        return out

    return "".join(
        difflib.unified_diff(
            lines(committed),
            lines(generated),
            fromfile=f"a/{shown}" if committed is not None else "/dev/null",
            tofile=f"b/{shown}" if generated is not None else "/dev/null",
        )
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
