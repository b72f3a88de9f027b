"""The cluster registry: `infra/clusters.yaml`, validated by pydantic, the one place cluster facts live."""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ops.errors import BadInput
from ops.tpu_types import GENERATIONS, TpuType, parse_tpu_type

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REGISTRY = REPO_ROOT / "infra" / "clusters.yaml"


def clusterbot_home() -> Path:
    """Where this machine keeps clusterbot's own state (the local cluster, the default store)."""
    return Path(os.environ.get("CLUSTERBOT_HOME", "~/.clusterbot")).expanduser()


def _expand(path: str) -> str:
    os.environ.setdefault("CLUSTERBOT_HOME", str(clusterbot_home()))
    return os.path.expanduser(os.path.expandvars(path))


class TokenSource(BaseModel):
    """Where this machine reads a cluster's Ray auth token: an env var or a file (never the registry)."""

    model_config = ConfigDict(extra="forbid")
    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> TokenSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self

    def path(self) -> Path | None:
        """The token file with `~` and `$VARS` expanded, or None for an env var source."""
        return None if self.file is None else Path(_expand(self.file))

    def read(self) -> str | None:
        """The token, or None when it is not available on this machine."""
        path = self.path()
        if path is None:
            return os.environ.get(self.env or "") or None
        return path.read_text().strip() or None if path.is_file() else None


# A Secret Manager secret id (GCP_API_FACTS 3.1) that is also an environment variable name: workload
# secrets reach jobs under their own name.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


class SshKeySource(BaseModel):
    """The cluster's one SSH key pair, for user `ray` on its VMs: `file` is where this machine reads the
    private half that `ray` uses for the head (the dashboard tunnel, `ray up`, `ray down`); the two
    secrets hold both halves in Secret Manager, the pair's home, so that every deploy of the bot uses the
    same pair instead of making its own. Every node of the cluster installs the public half from
    `public_secret` at boot (infra/cluster-template.yaml): with a key given, Ray registers none itself."""

    model_config = ConfigDict(extra="forbid")
    file: str
    private_secret: str | None = None
    public_secret: str | None = None

    @field_validator("private_secret", "public_secret")
    @classmethod
    def _secret_id(cls, secret: str | None) -> str | None:
        if secret is not None and not _SECRET_ID.match(secret):
            raise ValueError(f"{secret!r} is not a Secret Manager secret id (letters, digits, _ and -)")
        return secret

    def path(self) -> Path:
        """The key file with `~` and `$VARS` expanded."""
        return Path(_expand(self.file))


class LocalPorts(BaseModel):
    """Ports of the local cluster's head; every head on one machine needs its own (FINDINGS)."""

    model_config = ConfigDict(extra="forbid")
    gcs: int = 6379
    dashboard: int = 8265
    # Below Linux's ephemeral range (32768-60999), which any outgoing connection may take (FINDINGS),
    # and clear of the GCP clusters' tunnel ports (8266-8272) and the worker range.
    dashboard_agent_listen: int = 11365
    dashboard_agent_grpc: int = 11366
    metrics_export: int = 11367
    runtime_env_agent: int = 11368
    ray_client_server: int = 10001
    min_worker: int = 20000
    max_worker: int = 20999


class HealthThresholds(BaseModel):
    """When a cluster's health check calls it stuck or churning (ops/health.py); defaults suit a TPU
    cluster whose slices take minutes to provision."""

    model_config = ConfigDict(extra="forbid")
    # Head only, or workers below min, for longer than this while demand waits or launches fail: stuck.
    stuck_after_min: float = Field(default=30.0, gt=0)
    # A worker that dies within this of joining is churn; `churn_deaths` of them in `churn_lookback_min`
    # is churning (preemption churn: scaling up is useless for now).
    churn_within_min: float = Field(default=10.0, gt=0)
    churn_deaths: int = Field(default=3, ge=1)
    churn_lookback_min: float = Field(default=60.0, gt=0)
    # A source (the dashboard, the cloud) not read within this: the verdict is `unknown`, never a wait.
    read_timeout_s: float = Field(default=20.0, gt=0)


class WorkerType(BaseModel):
    """One TPU type Ray's autoscaler may launch for a cluster. One launch is one whole slice (every host
    of a multi-host type), so `min_workers` and `max_workers` count slices. In the registry a bare type
    name (`v6e-8`) is short for `{tpu_type: v6e-8}`."""

    model_config = ConfigDict(extra="forbid")
    tpu_type: str
    min_workers: int = Field(default=0, ge=0)  # kept warm: launched at start and never scaled below
    max_workers: int | None = Field(default=None, ge=0)  # None: the cluster's max_workers

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        return {"tpu_type": data} if isinstance(data, str) else data

    @field_validator("tpu_type")
    @classmethod
    def _known_type(cls, tpu_type: str) -> str:
        return parse_tpu_type(tpu_type).name  # one spelling (v5e-4 -> v5litepod-4); ValueError says why

    @property
    def tpu(self) -> TpuType:
        return parse_tpu_type(self.tpu_type)


class Cluster(BaseModel):
    """One shared Ray cluster. `name` is what people type; `ray_cluster_name` must never change."""

    model_config = ConfigDict(extra="forbid")
    name: str
    ray_cluster_name: str
    driver: Literal["gcp", "local"] = "gcp"
    project: str
    region: str
    zone: str
    bucket: str | None = None
    tpu_generation: Literal[GENERATIONS]  # type: ignore[valid-type]
    # The default worker: a single-host type, Ray's node type `tpu_worker` (add-worker, the local cluster).
    worker_tpu_type: str
    # Every TPU type the autoscaler offers, worker_tpu_type among them, each with its own warm pool; when
    # not given, worker_tpu_type alone with the cluster's min_workers.
    worker_types: list[WorkerType] = Field(default_factory=list)
    # Slices kept warm in all: give it for the cluster only without worker_types (then it is
    # worker_tpu_type's); with worker_types it is their sum, filled in here.
    min_workers: int | None = Field(default=None, ge=0, validate_default=True)
    # The most workers (slices) the autoscaler runs at once, of all types; each type's default cap.
    max_workers: int = Field(ge=0)
    head_machine_type: str
    token_secret: str | None = None
    # Secret Manager secrets every node fetches at boot and every job gets as environment variables of
    # the same name (Marin: HF_TOKEN, OPENAI_API_KEY); their values live only there and on the nodes.
    workload_secrets: list[str] = Field(default_factory=list)
    dashboard_url: str
    token: TokenSource | None = None
    protected: bool = False
    # TPU types the cluster's reservation is for: `add-worker TYPE` without a cluster goes here.
    reservations: list[str] = Field(default_factory=list)
    image_tag: str = "latest"
    local_ports: LocalPorts | None = None
    # How this machine reaches a GCP cluster's head (ops/drivers/gcp.py): through a `ray dashboard` SSH
    # tunnel on `dashboard_url`'s local port, or at the head's internal address (from a VM in the
    # project's network). GCP clusters only; "tunnel" when not given.
    reach: Literal["tunnel", "internal"] | None = None
    ssh_key: SshKeySource | None = None
    health: HealthThresholds = Field(default_factory=HealthThresholds)

    # Cross-field checks are field validators (fields validate in declaration order, and `info.data`
    # holds the earlier ones that passed), so an error's location names the offending field.
    @field_validator("zone")
    @classmethod
    def _zone_in_region(cls, zone: str, info: ValidationInfo) -> str:
        region = info.data.get("region")
        if info.data.get("driver") == "gcp" and region is not None and not zone.startswith(f"{region}-"):
            raise ValueError(f"zone {zone} is not in region {region}")
        return zone

    @field_validator("worker_tpu_type")
    @classmethod
    def _tpu_type_of_generation(cls, worker_tpu_type: str, info: ValidationInfo) -> str:
        tpu = parse_tpu_type(worker_tpu_type)
        generation = info.data.get("tpu_generation")
        if generation is not None and tpu.generation != generation:
            raise ValueError(
                f"worker_tpu_type {worker_tpu_type} is {tpu.generation}, but tpu_generation is {generation}"
            )
        return worker_tpu_type

    @field_validator("worker_types")
    @classmethod
    def _types_of_the_cluster(cls, types: list[WorkerType], info: ValidationInfo) -> list[WorkerType]:
        generation, default = info.data.get("tpu_generation"), info.data.get("worker_tpu_type")
        names = [t.tpu_type for t in types]
        if len(set(names)) != len(names):
            raise ValueError(f"a TPU type is given twice: {', '.join(names)}")
        for t in types:
            if generation is not None and t.tpu.generation != generation:
                raise ValueError(f"{t.tpu_type} is {t.tpu.generation}, but tpu_generation is {generation}")
        if types and default is not None and parse_tpu_type(default).name not in names:
            raise ValueError(f"worker_tpu_type {default} must be one of them")
        return types

    @field_validator("min_workers")
    @classmethod
    def _min_of_the_types(cls, min_workers: int | None, info: ValidationInfo) -> int:
        types = info.data.get("worker_types")
        if types:
            total = sum(t.min_workers for t in types)
            # Given too, it must agree (as in a dumped Cluster read back).
            if min_workers is not None and min_workers != total:
                raise ValueError(
                    f"{min_workers} is not the worker types' {total}: with worker_types, give "
                    "min_workers per worker type, not for the cluster"
                )
            return total
        if min_workers is None and "worker_types" in info.data:
            raise ValueError("Field required (or give worker_types, each with its min_workers)")
        return min_workers  # type: ignore[return-value]  # None only when worker_types failed already

    @field_validator("workload_secrets")
    @classmethod
    def _secret_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a secret id that is also an environment variable name")
        if len(set(names)) != len(names):
            raise ValueError("a secret is given twice")
        return names

    @field_validator("reservations")
    @classmethod
    def _reserved_types_exist(cls, reservations: list[str]) -> list[str]:
        for name in reservations:
            parse_tpu_type(name)  # a ValueError names what is wrong with it
        return reservations

    @field_validator("max_workers")
    @classmethod
    def _min_not_above_max(cls, max_workers: int, info: ValidationInfo) -> int:
        min_workers = info.data.get("min_workers")
        if min_workers is not None and min_workers > max_workers:
            raise ValueError(f"min_workers {min_workers} exceeds max_workers {max_workers}")
        for t in info.data.get("worker_types") or []:
            if t.max_workers is not None and t.max_workers > max_workers:
                raise ValueError(
                    f"worker type {t.tpu_type}'s max_workers {t.max_workers} exceeds it ({max_workers})"
                )
        return max_workers

    @model_validator(mode="after")
    def _defaults(self) -> Cluster:
        if not self.worker_types:
            self.worker_types = [WorkerType(tpu_type=self.worker_tpu_type, min_workers=self.min_workers or 0)]
        for t in self.worker_types:
            if t.max_workers is None:
                t.max_workers = self.max_workers
        if self.driver == "local" and self.local_ports is None:
            self.local_ports = LocalPorts()
        if self.driver != "gcp":
            if self.reach is not None or self.ssh_key is not None:
                raise ValueError("fields 'reach' and 'ssh_key' are for GCP clusters: set them to null")
            return self
        if self.reach is None:
            self.reach = "tunnel"
        if self.reach == "tunnel":
            url = urlsplit(self.dashboard_url)
            if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
                raise ValueError(
                    f"field 'dashboard_url': {self.dashboard_url} is not a local port "
                    "(http://127.0.0.1:PORT), which a tunnel needs"
                )
        return self

    @property
    def tunnel_port(self) -> int | None:
        """The local port the dashboard tunnel listens on (reach "tunnel"), else None."""
        return urlsplit(self.dashboard_url).port if self.reach == "tunnel" else None

    @cached_property
    def worker_tpu(self) -> TpuType:
        return parse_tpu_type(self.worker_tpu_type)

    def node_types(self) -> dict[str, WorkerType]:
        """Ray's node type name for each worker type, the default worker first: `tpu_worker` (the name
        the VMs' ray-user-node-type label carries, GCP_API_FACTS 2.1), then `tpu_slice_<type>` as
        Marin names them (tpu_slice_v6e_8)."""
        default = self.worker_tpu.name
        out = {"tpu_worker": next(t for t in self.worker_types if t.tpu_type == default)}
        for t in self.worker_types:
            if t.tpu_type != default:
                out[f"tpu_slice_{t.tpu_type.replace('-', '_')}"] = t
        return out

    def min_workers_by_type(self) -> dict[str, int]:
        """Warm slices per TPU type name (v6e-128), as health and status count alive workers."""
        return {t.tpu_type: t.min_workers for t in self.worker_types}

    @property
    def gcs_address(self) -> str | None:
        """The GCS address when this machine can reach it (only the local cluster for now)."""
        return f"127.0.0.1:{self.local_ports.gcs}" if self.local_ports else None

    def read_token(self) -> str | None:
        return self.token.read() if self.token else None


class Registry(BaseModel):
    """All clusters, keyed by short name, plus the image they run."""

    model_config = ConfigDict(extra="forbid")
    image_repository: str
    image_name: str
    # The cluster image's Dockerfile, relative to the build context (the repository root): the one in
    # docker/ is an example; a team points at its own. build-image builds it.
    dockerfile: str = "docker/cluster/Dockerfile"
    clusters: dict[str, Cluster]

    @model_validator(mode="after")
    def _distinct_ray_names(self) -> Registry:
        # Ray finds a cluster's VMs by this name: two entries sharing it would manage the same VMs.
        seen: dict[str, str] = {}
        for name, cluster in self.clusters.items():
            if cluster.ray_cluster_name in seen:
                raise ValueError(
                    f"cluster {name!r}, field 'ray_cluster_name': {cluster.ray_cluster_name} "
                    f"is already cluster {seen[cluster.ray_cluster_name]!r}'s"
                )
            seen[cluster.ray_cluster_name] = name
        return self

    def get(self, name: str) -> Cluster:
        """The cluster called `name`; BadInput lists the valid names otherwise."""
        try:
            return self.clusters[name]
        except KeyError:
            raise BadInput(
                f"unknown cluster {name!r}", f"valid clusters: {', '.join(self.clusters)}"
            ) from None

    def image(self, cluster: Cluster) -> str:
        """The cluster image in the cluster's regional Artifact Registry, without tag."""
        return f"{cluster.region}-docker.pkg.dev/{cluster.project}/{self.image_repository}/{self.image_name}"


def registry_path() -> Path:
    return Path(os.environ.get("CLUSTERBOT_REGISTRY", DEFAULT_REGISTRY))


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error, not "the last one wins"
    (a copied cluster block whose name was not changed would silently replace the original)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in keys:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            keys.add(key)
        return super().construct_mapping(node, deep)


def load_registry(path: Path | None = None) -> Registry:
    """Read and validate the registry; a malformed one is one BadInput naming file, cluster and field."""
    path = path or registry_path()
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader
    except OSError as e:
        raise BadInput(f"cannot read the cluster registry {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("clusters"), dict):
        raise BadInput(f"{path}: expected a mapping with a 'clusters' mapping")
    defaults = raw.pop("defaults", None) or {}
    if not isinstance(defaults, dict):
        raise BadInput(f"{path}: 'defaults' must be a mapping of cluster fields")
    clusters = {}
    for name, fields in raw["clusters"].items():
        if not isinstance(fields, dict):
            raise BadInput(f"{path}: cluster {name!r}: expected a mapping of fields")
        clusters[name] = {**defaults, **fields, "name": name}
    raw["clusters"] = clusters
    try:
        return Registry.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err["loc"]]
        if len(loc) >= 2 and loc[0] == "clusters":
            where = f"cluster {loc[1]!r}" + (f", field {'.'.join(loc[2:])!r}" if loc[2:] else "")
        elif loc:
            where = f"field {'.'.join(loc)!r}"
        else:  # a check across clusters: its message says where
            where = ""
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise BadInput(f"{path}: {where + ': ' if where else ''}{msg}{more}") from None
