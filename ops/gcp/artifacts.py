"""Artifact Registry for ops: the Docker repositories that hold the cluster image in each region, the
images and tags pushed there (by Cloud Build, never through this API), and their cleanup policies
(GCP_API_FACTS.md 5), against Google or the simulator.

Cleanup policies are given as `CleanupRule`s and replace the repository's whole set (the API's map
replaced through the update mask): the caller states everything it wants, every time.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal
from urllib.parse import unquote

import grpc
from google.api_core import exceptions
from google.api_core.retry import Retry
from google.cloud import artifactregistry_v1 as ar
from google.protobuf import duration_pb2, field_mask_pb2
from pydantic import BaseModel, Field

from ops.errors import OpsError
from ops.gcp import common

READER = "roles/artifactregistry.reader"
ADMIN = "roles/artifactregistry.repoAdmin"
CREATE = "roles/artifactregistry.admin"


class CleanupRule(BaseModel):
    """One cleanup policy: either a condition (tag state, prefixes, age) or, for KEEP only, the newest
    `keep_count` versions (of the packages named by `package_prefixes`, or all)."""

    id: str
    action: Literal["DELETE", "KEEP"]
    tag_state: Literal["TAGGED", "UNTAGGED", "ANY"] | None = None
    tag_prefixes: list[str] = Field(default_factory=list)
    package_prefixes: list[str] = Field(default_factory=list)
    older_than_s: int | None = None
    newer_than_s: int | None = None
    keep_count: int | None = None  # most recent versions (KEEP only; excludes the condition fields)


class RepositoryInfo(BaseModel):
    name: str  # projects/P/locations/L/repositories/R
    location: str
    repo_id: str
    format: str  # DOCKER...
    registry_uri: str  # L-docker.pkg.dev/P/R
    cleanup: list[CleanupRule]
    cleanup_dry_run: bool


class ImageInfo(BaseModel):
    image: str  # the path inside the repository, e.g. "cluster"
    uri: str  # L-docker.pkg.dev/P/R/cluster@sha256:...
    digest: str  # sha256:...
    tags: list[str]
    upload_time: datetime | None = None
    size_bytes: int = 0


def artifacts_client(endpoint: str | None) -> tuple[ar.ArtifactRegistryClient, grpc.Channel | None]:
    """The client for Google (`endpoint` None) or the simulator at host:port, with its channel."""
    if endpoint is None:
        return ar.ArtifactRegistryClient(), None
    from google.cloud.artifactregistry_v1.services.artifact_registry.transports import (
        ArtifactRegistryGrpcTransport,
    )

    channel = common.channel(endpoint)
    return ar.ArtifactRegistryClient(transport=ArtifactRegistryGrpcTransport(channel=channel)), channel


class ArtifactsApi:
    """Artifact Registry in one project, through a client passed in."""

    def __init__(
        self,
        client: ar.ArtifactRegistryClient,
        project: str,
        *,
        retry: Retry | None = None,
        op_timeout_s: float = 300.0,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.client = client
        self.project = project
        self.retry = retry or common.retry()
        self.op_timeout_s = op_timeout_s
        self._channel = channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def repository_name(self, location: str, repo_id: str) -> str:
        return f"projects/{self.project}/locations/{location}/repositories/{repo_id}"

    # ---- repositories -------------------------------------------------------------------------
    def ensure_repository(self, location: str, repo_id: str, description: str = "") -> RepositoryInfo:
        """The Docker repository, created if absent (idempotent)."""
        existing = self.get_repository(location, repo_id)
        if existing is not None:
            return existing
        try:
            op = self.client.create_repository(
                parent=f"projects/{self.project}/locations/{location}",
                repository_id=repo_id,
                repository=ar.Repository(format_=ar.Repository.Format.DOCKER, description=description),
                retry=self.retry,
            )
            return _repo_info(op.result(timeout=self.op_timeout_s, retry=self.retry))
        except exceptions.AlreadyExists:
            found = self.get_repository(location, repo_id)
            if found is None:
                raise OpsError(f"repository {repo_id} in {location} exists and does not") from None
            return found
        except Exception as e:
            raise common.api_error(
                e, f"create repository {repo_id} in {location}", CREATE, self.project
            ) from None

    def get_repository(self, location: str, repo_id: str) -> RepositoryInfo | None:
        try:
            return _repo_info(
                self.client.get_repository(name=self.repository_name(location, repo_id), retry=self.retry)
            )
        except exceptions.NotFound:
            return None
        except Exception as e:
            raise common.api_error(
                e, f"read repository {repo_id} in {location}", READER, self.project
            ) from None

    def set_cleanup(
        self, location: str, repo_id: str, rules: list[CleanupRule], dry_run: bool = False
    ) -> RepositoryInfo:
        """Replace the repository's cleanup policies with `rules` (at most 10)."""
        repo = ar.Repository(
            name=self.repository_name(location, repo_id),
            cleanup_policies={r.id: _policy(r) for r in rules},
            cleanup_policy_dry_run=dry_run,
        )
        mask = field_mask_pb2.FieldMask(paths=["cleanup_policies", "cleanup_policy_dry_run"])
        try:
            return _repo_info(
                self.client.update_repository(repository=repo, update_mask=mask, retry=self.retry)
            )
        except exceptions.NotFound:
            raise OpsError(f"no repository {repo_id} in {location} (project {self.project})") from None
        except Exception as e:
            raise common.api_error(
                e, f"set the cleanup policies of {repo_id} in {location}", ADMIN, self.project
            ) from None

    # ---- images -------------------------------------------------------------------------------
    def images(self, location: str, repo_id: str, image: str | None = None) -> list[ImageInfo]:
        """The repository's Docker images (one per digest), of `image` only when given."""
        try:
            found = [
                _image_info(i)
                for i in self.client.list_docker_images(
                    parent=self.repository_name(location, repo_id), retry=self.retry
                )
            ]
        except exceptions.NotFound:
            raise OpsError(f"no repository {repo_id} in {location} (project {self.project})") from None
        except Exception as e:
            raise common.api_error(
                e, f"list the images in {repo_id} in {location}", READER, self.project
            ) from None
        return [i for i in found if image is None or i.image == image]

    def tags(self, location: str, repo_id: str, image: str) -> dict[str, str]:
        """{tag: digest} of one image; {} when it was never pushed."""
        return {t: i.digest for i in self.images(location, repo_id, image) for t in i.tags}


def _policy(rule: CleanupRule) -> ar.CleanupPolicy:
    action = ar.CleanupPolicy.Action[rule.action]
    if rule.keep_count is not None:
        return ar.CleanupPolicy(
            id=rule.id,
            action=action,
            most_recent_versions=ar.CleanupPolicyMostRecentVersions(
                keep_count=rule.keep_count, package_name_prefixes=rule.package_prefixes
            ),
        )
    condition = ar.CleanupPolicyCondition(
        tag_prefixes=rule.tag_prefixes, package_name_prefixes=rule.package_prefixes
    )
    if rule.tag_state is not None:
        condition.tag_state = ar.CleanupPolicyCondition.TagState[rule.tag_state]
    if rule.older_than_s is not None:
        condition.older_than = duration_pb2.Duration(seconds=rule.older_than_s)
    if rule.newer_than_s is not None:
        condition.newer_than = duration_pb2.Duration(seconds=rule.newer_than_s)
    return ar.CleanupPolicy(id=rule.id, action=action, condition=condition)


def _seconds(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds())


def _rule(key: str, p: ar.CleanupPolicy) -> CleanupRule:
    action = ar.CleanupPolicy.Action(p.action).name
    if ar.CleanupPolicy.pb(p).WhichOneof("condition_type") == "most_recent_versions":
        keep = p.most_recent_versions
        return CleanupRule(
            id=p.id or key,
            action=action,
            keep_count=keep.keep_count if "keep_count" in keep else None,
            package_prefixes=list(keep.package_name_prefixes),
        )
    c = p.condition
    return CleanupRule(
        id=p.id or key,
        action=action,
        tag_state=ar.CleanupPolicyCondition.TagState(c.tag_state).name if "tag_state" in c else None,
        tag_prefixes=list(c.tag_prefixes),
        package_prefixes=list(c.package_name_prefixes),
        older_than_s=_seconds(c.older_than) if "older_than" in c else None,
        newer_than_s=_seconds(c.newer_than) if "newer_than" in c else None,
    )


def _repo_info(r: ar.Repository) -> RepositoryInfo:
    parts = r.name.split("/")
    return RepositoryInfo(
        name=r.name,
        location=parts[3],
        repo_id=parts[5],
        format=ar.Repository.Format(r.format_).name,
        registry_uri=r.registry_uri,
        cleanup=[_rule(k, p) for k, p in sorted(r.cleanup_policies.items())],
        cleanup_dry_run=r.cleanup_policy_dry_run,
    )


def _image_info(i: ar.DockerImage) -> ImageInfo:
    escaped, _, digest = i.name.partition("/dockerImages/")[2].partition("@")
    return ImageInfo(
        image=unquote(escaped),
        uri=i.uri,
        digest=digest,
        tags=sorted(i.tags),
        upload_time=i.upload_time or None,
        size_bytes=i.image_size_bytes,
    )
