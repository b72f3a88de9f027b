"""A simulated Artifact Registry v1 (`google.devtools.artifactregistry.v1.ArtifactRegistry`) for Docker
repositories: repositories per location (create and delete as LROs, update synchronous, GCP_API_FACTS.md
5.1), the images pushed into them (docker images, packages, versions, tags), and cleanup policies (5.2)
that `run_cleanup` applies when asked (Google runs them about daily).

Images arrive only through `push` (the simulated Cloud Build's pushes), never through this API, as on
GCP. Names: a package is the image path (`/` escaped as `%2F`), a version its digest (`sha256:...`), a
docker image `<package>@<digest>`. Simulator choices: a push to a missing or non-Docker repository fails;
`update_mask` `cleanup_policies` replaces the whole map (per-key paths are refused).
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import grpc
from google.cloud import artifactregistry_v1 as ar
from google.protobuf import empty_pb2, timestamp_pb2

from ops.sim.faults import Faults
from ops.sim.lro import Operations
from ops.sim.rpc import LRO, Methods, page, resource_of, service_handler
from ops.sim.state import SimError

SERVICE = "google.devtools.artifactregistry.v1.ArtifactRegistry"
MAX_POLICIES = 10
_PARENT_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
_REPO_RE = re.compile(r"^(projects/([^/]+)/locations/([^/]+))/repositories/([^/]+)$")
_REPO_ID_RE = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_URI_RE = re.compile(r"^([a-z0-9-]+)-docker\.pkg\.dev/([^/]+)/([^/]+)/([^:@]+)(?::([\w][\w.-]{0,127}))?$")
PERMISSIONS = {
    "CreateRepository": "artifactregistry.repositories.create",
    "GetRepository": "artifactregistry.repositories.get",
    "ListRepositories": "artifactregistry.repositories.list",
    "UpdateRepository": "artifactregistry.repositories.update",
    "DeleteRepository": "artifactregistry.repositories.delete",
    "ListDockerImages": "artifactregistry.dockerimages.list",
    "GetDockerImage": "artifactregistry.dockerimages.get",
    "ListPackages": "artifactregistry.packages.list",
    "ListVersions": "artifactregistry.versions.list",
    "GetVersion": "artifactregistry.versions.get",
    "DeleteVersion": "artifactregistry.versions.delete",
    "ListTags": "artifactregistry.tags.list",
    "DeleteTag": "artifactregistry.tags.delete",
}
Action = ar.CleanupPolicy.Action
TagState = ar.CleanupPolicyCondition.TagState


@dataclass
class _Version:
    digest: str
    size: int
    created: datetime


@dataclass
class _Package:
    versions: dict[str, _Version] = field(default_factory=dict)  # digest -> version
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest


def _ts(when: datetime | None = None) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    if when is None:
        ts.GetCurrentTime()
    else:
        ts.FromDatetime(when)
    return ts


def _copy(msg: Any) -> Any:
    return type(msg).deserialize(type(msg).serialize(msg))


class PushError(Exception):
    """A push the registry refuses; Cloud Build reports it as PUSH_FAILED with this text."""


class ArtifactState:
    def __init__(self, ops: Operations, path: Path | None = None) -> None:
        self.ops = ops
        self._path = path
        self._lock = threading.Lock()
        self._repos: dict[str, ar.Repository] = {}
        self._packages: dict[str, dict[str, _Package]] = {}  # repo name -> image path -> package
        if path is not None and path.exists():
            self._load(path)

    # ---- repositories -------------------------------------------------------------------------
    def create_repository(self, parent: str, repo_id: str, repo: ar.Repository) -> str:
        """CreateRepository: the LRO is done in its reply (nothing to wait for in a simulator)."""
        m = _PARENT_RE.match(parent)
        if not m:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
        if not _REPO_ID_RE.match(repo_id or ""):
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid repository id {repo_id!r}: lowercase letters, digits and hyphens, at most 63",
            )
        if repo.format_ == ar.Repository.Format.FORMAT_UNSPECIFIED:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "Repository format must be specified")
        self._check_policies(repo)
        name = f"{parent}/repositories/{repo_id}"
        with self._lock:
            if name in self._repos:
                raise SimError(grpc.StatusCode.ALREADY_EXISTS, f"the repository already exists: {name}")
            stored = _copy(repo)
            stored.name = name
            stored.create_time = stored.update_time = _ts()
            if stored.format_ == ar.Repository.Format.DOCKER:
                stored.registry_uri = f"{m.group(2)}-docker.pkg.dev/{m.group(1)}/{repo_id}"
            if stored.mode == ar.Repository.Mode.MODE_UNSPECIFIED:
                stored.mode = ar.Repository.Mode.STANDARD_REPOSITORY
            self._repos[name] = stored
            self._packages[name] = {}
            self._save()
            op = self.ops.begin(f"{parent}/operations/{uuid.uuid4()}", ar.OperationMetadata())
            self.ops.finish(op, stored)
            return op

    def get_repository(self, name: str) -> ar.Repository:
        with self._lock:
            return _copy(self._repo(name))

    def list_repositories(self, parent: str) -> list[ar.Repository]:
        if not _PARENT_RE.match(parent):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
        with self._lock:
            return [_copy(r) for n, r in sorted(self._repos.items()) if n.startswith(f"{parent}/")]

    def update_repository(self, repo: ar.Repository, paths: list[str]) -> ar.Repository:
        """Synchronous; a mask path names a whole field (the cleanup map is replaced, not merged)."""
        allowed = {"cleanup_policies", "cleanup_policy_dry_run", "labels", "description"}
        wrong = [p for p in paths if p not in allowed]
        if not paths or wrong:
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid update_mask {paths}: updatable fields here are {', '.join(sorted(allowed))}",
            )
        self._check_policies(repo)
        with self._lock:
            stored = self._repo(repo.name)
            for path in paths:
                if path == "cleanup_policies":
                    stored.cleanup_policies = {k: _copy(v) for k, v in repo.cleanup_policies.items()}
                elif path == "labels":
                    stored.labels = dict(repo.labels)
                else:
                    setattr(stored, path, getattr(repo, path))
            stored.update_time = _ts()
            self._save()
            return _copy(stored)

    def delete_repository(self, name: str) -> str:
        with self._lock:
            self._repo(name)
            del self._repos[name]
            self._packages.pop(name, None)
            self._save()
            op = self.ops.begin(
                f"{name.split('/repositories/')[0]}/operations/{uuid.uuid4()}", ar.OperationMetadata()
            )
            self.ops.finish(op, None)
            return op

    # ---- pushes (Cloud Build's, not an RPC) ---------------------------------------------------
    def push(self, uri: str, digest: str, size: int) -> str:
        """Record image `uri` (`{loc}-docker.pkg.dev/{project}/{repo}/{image}:{tag}`) at `digest`; the tag
        moves to it. Returns the package's name; PushError when the registry would refuse."""
        m = _URI_RE.match(uri)
        if not m:
            raise PushError(f"invalid reference format: {uri} is not an Artifact Registry Docker image")
        location, project, repo_id, image, tag = m.groups()
        repo_name = f"projects/{project}/locations/{location}/repositories/{repo_id}"
        with self._lock:
            repo = self._repos.get(repo_name)
            if repo is None:
                raise PushError(f'name unknown: Repository "{repo_id}" not found in {project} ({location})')
            if repo.format_ != ar.Repository.Format.DOCKER:
                raise PushError(f"repository {repo_name} is not a Docker repository")
            package = self._packages[repo_name].setdefault(image, _Package())
            if tag and repo.docker_config.immutable_tags and package.tags.get(tag, digest) != digest:
                raise PushError(f"tag {tag} of {image} is immutable in {repo_name}")
            if digest not in package.versions:
                package.versions[digest] = _Version(digest=digest, size=size, created=datetime.now(UTC))
            if tag:
                package.tags[tag] = digest
            self._save()
            return f"{repo_name}/packages/{quote(image, safe='')}"

    # ---- images, packages, versions, tags -----------------------------------------------------
    def docker_images(self, parent: str) -> list[ar.DockerImage]:
        with self._lock:
            repo = self._repo(parent)
            images = []
            for image, package in sorted(self._packages[parent].items()):
                for v in sorted(package.versions.values(), key=lambda v: v.created, reverse=True):
                    images.append(self._docker_image(repo, image, package, v))
            return images

    def docker_image(self, name: str) -> ar.DockerImage:
        parent, _, rest = name.partition("/dockerImages/")
        image, _, digest = unquote(rest).partition("@")
        with self._lock:
            repo = self._repo(parent)
            package = self._packages[parent].get(image)
            if package is None or digest not in package.versions:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
            return self._docker_image(repo, image, package, package.versions[digest])

    def packages(self, parent: str) -> list[ar.Package]:
        with self._lock:
            self._repo(parent)
            out = []
            for image, package in sorted(self._packages[parent].items()):
                times = [v.created for v in package.versions.values()] or [datetime.now(UTC)]
                out.append(
                    ar.Package(
                        name=f"{parent}/packages/{quote(image, safe='')}",
                        display_name=image,
                        create_time=_ts(min(times)),
                        update_time=_ts(max(times)),
                    )
                )
            return out

    def versions(self, parent: str) -> list[ar.Version]:
        """A package's versions, newest first, each with its tags (`related_tags`, the FULL view)."""
        with self._lock:
            _, image, package = self._package(parent)
            return [
                self._version_msg(parent, package, v)
                for v in sorted(package.versions.values(), key=lambda v: v.created, reverse=True)
            ]

    def version(self, name: str) -> ar.Version:
        parent, _, digest = name.partition("/versions/")
        with self._lock:
            _, _, package = self._package(parent)
            if digest not in package.versions:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
            return self._version_msg(parent, package, package.versions[digest])

    def delete_version(self, name: str, force: bool) -> str:
        """DeleteVersion (an LRO, done at once); a tagged version needs `force`, as on GCP."""
        parent, _, digest = name.partition("/versions/")
        with self._lock:
            repo_name, image, package = self._package(parent)
            if digest not in package.versions:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
            tags = [t for t, d in package.tags.items() if d == digest]
            if tags and not force:
                raise SimError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"version {digest} of {image} is tagged ({', '.join(tags)}): delete with force",
                )
            self._drop_version(repo_name, image, digest)
            self._save()
            op = self.ops.begin(
                f"{repo_name.split('/repositories/')[0]}/operations/{uuid.uuid4()}", ar.OperationMetadata()
            )
            self.ops.finish(op, None)
            return op

    def tags(self, parent: str) -> list[ar.Tag]:
        with self._lock:
            _, _, package = self._package(parent)
            return [
                ar.Tag(name=f"{parent}/tags/{t}", version=f"{parent}/versions/{d}")
                for t, d in sorted(package.tags.items())
            ]

    def delete_tag(self, name: str) -> None:
        parent, _, tag = name.partition("/tags/")
        with self._lock:
            _, _, package = self._package(parent)
            if package.tags.pop(tag, None) is None:
                raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
            self._save()

    # ---- cleanup policies ---------------------------------------------------------------------
    def run_cleanup(self, now: datetime | None = None) -> dict[str, list[str]]:
        """Apply every repository's cleanup policies now, as Google's background job does: a version
        that some DELETE policy matches and no KEEP policy keeps is deleted, unless the repository is in
        dry-run. Returns {repository: [image@digest deleted (or that would be, in dry run)]}."""
        now = now or datetime.now(UTC)
        report: dict[str, list[str]] = {}
        with self._lock:
            for repo_name, repo in self._repos.items():
                policies = list(repo.cleanup_policies.values())
                if not policies:
                    continue
                doomed = []
                for image, package in self._packages[repo_name].items():
                    newest = sorted(package.versions.values(), key=lambda v: v.created, reverse=True)
                    for rank, v in enumerate(newest):
                        tags = [t for t, d in package.tags.items() if d == v.digest]
                        hits = {p.action for p in policies if _matches(p, image, v, tags, rank, now)}
                        if Action.DELETE in hits and Action.KEEP not in hits:
                            doomed.append((image, v.digest))
                report[repo_name] = [f"{image}@{digest}" for image, digest in doomed]
                if not repo.cleanup_policy_dry_run:
                    for image, digest in doomed:
                        self._drop_version(repo_name, image, digest)
            self._save()
        return report

    def summary(self) -> dict:
        with self._lock:
            return {
                name: {image: dict(p.tags) for image, p in self._packages[name].items()}
                for name in self._repos
            }

    # ---- helpers (under the lock) -------------------------------------------------------------
    def _check_policies(self, repo: ar.Repository) -> None:
        if len(repo.cleanup_policies) > MAX_POLICIES:
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT, f"At most {MAX_POLICIES} cleanup policies per repository"
            )
        for key, policy in repo.cleanup_policies.items():
            which = ar.CleanupPolicy.pb(policy).WhichOneof("condition_type")
            if policy.action == Action.ACTION_UNSPECIFIED or which is None:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"cleanup policy {key!r} needs an action and a condition",
                )
            if which == "most_recent_versions" and policy.action != Action.KEEP:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"cleanup policy {key!r}: most_recent_versions is for KEEP policies only",
                )

    def _repo(self, name: str) -> ar.Repository:
        if not _REPO_RE.match(name):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid repository name: {name!r}")
        repo = self._repos.get(name)
        if repo is None:
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
        return repo

    def _package(self, name: str) -> tuple[str, str, _Package]:
        repo_name, _, escaped = name.partition("/packages/")
        self._repo(repo_name)
        image = unquote(escaped)
        package = self._packages[repo_name].get(image)
        if package is None:
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Requested entity was not found: {name}")
        return repo_name, image, package

    def _drop_version(self, repo_name: str, image: str, digest: str) -> None:
        package = self._packages[repo_name][image]
        package.versions.pop(digest, None)
        package.tags = {t: d for t, d in package.tags.items() if d != digest}
        if not package.versions:
            del self._packages[repo_name][image]

    def _docker_image(
        self, repo: ar.Repository, image: str, package: _Package, v: _Version
    ) -> ar.DockerImage:
        escaped = quote(image, safe="")
        return ar.DockerImage(
            name=f"{repo.name}/dockerImages/{escaped}@{v.digest}",
            uri=f"{repo.registry_uri}/{image}@{v.digest}",
            tags=sorted(t for t, d in package.tags.items() if d == v.digest),
            image_size_bytes=v.size,
            upload_time=_ts(v.created),
            build_time=_ts(v.created),
            update_time=_ts(v.created),
            media_type="application/vnd.docker.distribution.manifest.v2+json",
        )

    def _version_msg(self, parent: str, package: _Package, v: _Version) -> ar.Version:
        return ar.Version(
            name=f"{parent}/versions/{v.digest}",
            create_time=_ts(v.created),
            update_time=_ts(v.created),
            related_tags=[
                ar.Tag(name=f"{parent}/tags/{t}", version=f"{parent}/versions/{v.digest}")
                for t, d in sorted(package.tags.items())
                if d == v.digest
            ],
        )

    # ---- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        if self._path is None:
            return
        data = {
            "repositories": {n: json.loads(ar.Repository.to_json(r)) for n, r in self._repos.items()},
            "packages": {
                repo: {
                    image: {
                        "tags": p.tags,
                        "versions": [[v.digest, v.size, v.created.isoformat()] for v in p.versions.values()],
                    }
                    for image, p in packages.items()
                }
                for repo, packages in self._packages.items()
            },
        }
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self._path)

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self._repos = {n: ar.Repository.from_json(json.dumps(r)) for n, r in data["repositories"].items()}
        self._packages = {
            repo: {
                image: _Package(
                    versions={d: _Version(d, s, datetime.fromisoformat(c)) for d, s, c in p["versions"]},
                    tags=dict(p["tags"]),
                )
                for image, p in packages.items()
            }
            for repo, packages in data["packages"].items()
        }


def _matches(
    policy: ar.CleanupPolicy, image: str, v: _Version, tags: list[str], rank: int, now: datetime
) -> bool:
    """Whether `policy` applies to version `v` of `image` (rank 0 = the newest): every set condition holds,
    a prefix list matches on any prefix (GCP_API_FACTS.md 5.2)."""
    if ar.CleanupPolicy.pb(policy).WhichOneof("condition_type") == "most_recent_versions":
        keep = policy.most_recent_versions
        prefixes = list(keep.package_name_prefixes)
        if prefixes and not any(image.startswith(p) for p in prefixes):
            return False
        return rank < keep.keep_count if "keep_count" in keep else True
    c = policy.condition
    state = c.tag_state if "tag_state" in c else TagState.ANY
    if state == TagState.TAGGED and not tags or state == TagState.UNTAGGED and tags:
        return False
    if c.tag_prefixes and not any(t.startswith(p) for t in tags for p in c.tag_prefixes):
        return False
    if c.version_name_prefixes and not any(v.digest.startswith(p) for p in c.version_name_prefixes):
        return False
    if c.package_name_prefixes and not any(image.startswith(p) for p in c.package_name_prefixes):
        return False
    age = now - v.created
    if "older_than" in c and age < timedelta(seconds=c.older_than.total_seconds()):
        return False
    return not ("newer_than" in c and age > timedelta(seconds=c.newer_than.total_seconds()))


def artifacts_handler(state: ArtifactState, faults: Faults) -> grpc.GenericRpcHandler:
    """The Artifact Registry v1 service (repositories and Docker images) over `state`."""

    def op(name: str) -> Any:
        found = state.ops.get(name)
        assert found is not None
        return found

    def listed(items: list[Any], r: Any, response: Any, field: str) -> Any:
        found, token = page(items, r.page_size, r.page_token)
        return response(**{field: found, "next_page_token": token})

    def delete_tag(r: ar.DeleteTagRequest) -> empty_pb2.Empty:
        state.delete_tag(r.name)
        return empty_pb2.Empty()

    methods: Methods = {
        "CreateRepository": (
            ar.CreateRepositoryRequest,
            LRO,
            lambda r: op(state.create_repository(r.parent, r.repository_id, r.repository)),
        ),
        "GetRepository": (ar.GetRepositoryRequest, ar.Repository, lambda r: state.get_repository(r.name)),
        "ListRepositories": (
            ar.ListRepositoriesRequest,
            ar.ListRepositoriesResponse,
            lambda r: listed(
                state.list_repositories(r.parent), r, ar.ListRepositoriesResponse, "repositories"
            ),
        ),
        "UpdateRepository": (
            ar.UpdateRepositoryRequest,
            ar.Repository,
            lambda r: state.update_repository(r.repository, list(r.update_mask.paths)),
        ),
        "DeleteRepository": (ar.DeleteRepositoryRequest, LRO, lambda r: op(state.delete_repository(r.name))),
        "ListDockerImages": (
            ar.ListDockerImagesRequest,
            ar.ListDockerImagesResponse,
            lambda r: listed(state.docker_images(r.parent), r, ar.ListDockerImagesResponse, "docker_images"),
        ),
        "GetDockerImage": (ar.GetDockerImageRequest, ar.DockerImage, lambda r: state.docker_image(r.name)),
        "ListPackages": (
            ar.ListPackagesRequest,
            ar.ListPackagesResponse,
            lambda r: listed(state.packages(r.parent), r, ar.ListPackagesResponse, "packages"),
        ),
        "ListVersions": (
            ar.ListVersionsRequest,
            ar.ListVersionsResponse,
            lambda r: listed(state.versions(r.parent), r, ar.ListVersionsResponse, "versions"),
        ),
        "GetVersion": (ar.GetVersionRequest, ar.Version, lambda r: state.version(r.name)),
        "DeleteVersion": (
            ar.DeleteVersionRequest,
            LRO,
            lambda r: op(state.delete_version(r.name, r.force)),
        ),
        "ListTags": (
            ar.ListTagsRequest,
            ar.ListTagsResponse,
            lambda r: listed(state.tags(r.parent), r, ar.ListTagsResponse, "tags"),
        ),
        "DeleteTag": (ar.DeleteTagRequest, empty_pb2.Empty, delete_tag),
    }
    return service_handler(SERVICE, methods, faults, PERMISSIONS, resource_of)
