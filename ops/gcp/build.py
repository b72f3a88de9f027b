"""Cloud Build for ops: a Docker image built from a source tarball in a bucket and pushed under several
names at once (one build, every region's registry, GCP_API_FACTS.md 4.5), followed to its end, with the
log's tail on failure; against Google or the simulator.

The source goes the way `gcloud builds submit` sends it: `pack_source` tars a directory (less .git,
virtualenvs, caches and what its .dockerignore names) and `upload_source` puts it in a bucket through an
`Objects` (GCS, or the simulator's directory of buckets). The log is read from the build's logs bucket.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import grpc
from google.api_core import exceptions
from google.api_core.retry import Retry
from google.cloud.devtools import cloudbuild_v1 as cb
from google.protobuf import duration_pb2
from pydantic import BaseModel

from ops.errors import OpsError
from ops.gcp import common
from ops.gcp.objects import Objects

EDITOR = "roles/cloudbuild.builds.editor"
VIEWER = "roles/cloudbuild.builds.viewer"
DOCKER = "gcr.io/cloud-builders/docker"
ALWAYS_EXCLUDED = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "*.pyc",
    "node_modules",
    ".pytest_cache",
    ".ruff_cache",
)
TERMINAL = ("SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED")


class BuiltImage(BaseModel):
    name: str  # as listed in the build's images, with its tag
    digest: str  # sha256:...


class BuildInfo(BaseModel):
    id: str
    project: str
    status: str  # QUEUED | WORKING | SUCCESS | FAILURE | INTERNAL_ERROR | TIMEOUT | CANCELLED | EXPIRED
    log_url: str
    logs_bucket: str  # gs://bucket[/prefix]
    images: list[BuiltImage]
    failure: str = ""  # FailureInfo type: USER_BUILD_STEP, PUSH_FAILED, PUSH_IMAGE_NOT_FOUND, ...
    detail: str = ""  # status_detail / failure detail
    create_time: datetime | None = None
    start_time: datetime | None = None
    finish_time: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


class BuildFailed(OpsError):
    """A build that ended other than SUCCESS: `build` says how, `log_tail` its last lines."""

    def __init__(self, build: BuildInfo, log_tail: list[str]) -> None:
        kind = f" ({build.failure})" if build.failure else ""
        reason = f"the image build {build.id} ended {build.status}{kind}: {build.detail or 'no detail'}"
        tail = "\n".join(log_tail)
        super().__init__(
            reason, f"the log ends with:\n{tail}\nwhole log: {build.log_url}" if tail else build.log_url
        )
        self.build = build
        self.log_tail = log_tail


def builds_client(endpoint: str | None) -> tuple[cb.CloudBuildClient, grpc.Channel | None]:
    """The client for Google (`endpoint` None) or the simulator at host:port, with its channel."""
    if endpoint is None:
        return cb.CloudBuildClient(), None
    from google.cloud.devtools.cloudbuild_v1.services.cloud_build.transports import CloudBuildGrpcTransport

    channel = common.channel(endpoint)
    return cb.CloudBuildClient(transport=CloudBuildGrpcTransport(channel=channel)), channel


def read_ignore(directory: Path) -> list[str]:
    """The patterns of `directory`/.dockerignore (none when it has none)."""
    path = directory / ".dockerignore"
    if not path.is_file():
        return []
    return [
        ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether the path `rel` (relative, with /) is excluded by .dockerignore `patterns` (the last match
    wins; `!` re-includes)."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(rel, f"{pattern}/*"):
            verdict = not negate
    return verdict


def pack_source(directory: Path) -> bytes:
    """A .tar.gz of `directory`, the same bytes for the same files (sorted, no times or owners)."""
    root = Path(directory)
    patterns = read_ignore(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:

        def walk(path: Path) -> Iterator[Path]:
            for child in sorted(path.iterdir()):
                rel = child.relative_to(root).as_posix()
                if any(fnmatch.fnmatch(child.name, p) for p in ALWAYS_EXCLUDED) or ignored(rel, patterns):
                    continue
                if child.is_dir() and not child.is_symlink():
                    yield from walk(child)
                elif child.is_file():
                    yield child

        for path in walk(root):
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            data = path.read_bytes()
            info.size = len(data)
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class BuildApi:
    """Cloud Build in one project, through a client and an `Objects` (sources and logs) passed in."""

    def __init__(
        self,
        client: cb.CloudBuildClient,
        project: str,
        objects: Objects,
        *,
        retry: Retry | None = None,
        poll_s: float = 5.0,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.client = client
        self.project = project
        self.objects = objects
        self.retry = retry or common.retry()
        self.poll_s = poll_s
        self._channel = channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def upload_source(self, directory: Path, bucket: str, prefix: str = "source") -> str:
        """Pack `directory` and put it in `bucket` under a name from its content (an unchanged source is
        not uploaded twice); the object's name."""
        data = pack_source(directory)
        name = f"{prefix.strip('/')}/{hashlib.sha256(data).hexdigest()[:16]}.tgz"
        if self.objects.read(bucket, name) is None:
            self.objects.write(bucket, name, data)
        return name

    def docker_build(
        self,
        bucket: str,
        source_object: str,
        images: list[str],
        dockerfile: str = "Dockerfile",
        build_args: dict[str, str] | None = None,
        timeout_s: int = 3600,
        logs_bucket: str = "",
    ) -> BuildInfo:
        """Start one `docker build` of the source with every name in `images` as a tag, pushing them all
        (`images`, so the build fails when one cannot be pushed). Returns the QUEUED build; `wait` for it."""
        args = ["build", *[a for image in images for a in ("-t", image)], "-f", dockerfile]
        for key, value in (build_args or {}).items():
            args += ["--build-arg", f"{key}={value}"]
        build = cb.Build(
            source=cb.Source(storage_source=cb.StorageSource(bucket=bucket, object_=source_object)),
            steps=[cb.BuildStep(name=DOCKER, args=[*args, "."])],
            images=images,
            timeout=duration_pb2.Duration(seconds=timeout_s),
            logs_bucket=logs_bucket,
        )
        try:
            op = self.client.create_build(project_id=self.project, build=build, retry=self.retry)
        except Exception as e:
            raise common.api_error(e, "start an image build", EDITOR, self.project) from None
        return _info(op.metadata.build)

    def get(self, build_id: str) -> BuildInfo:
        try:
            return _info(self.client.get_build(project_id=self.project, id=build_id, retry=self.retry))
        except exceptions.NotFound:
            raise OpsError(f"no build {build_id} in project {self.project}") from None
        except Exception as e:
            raise common.api_error(e, f"read build {build_id}", VIEWER, self.project) from None

    def wait(
        self, build_id: str, timeout_s: float, progress: Callable[[BuildInfo], None] | None = None
    ) -> BuildInfo:
        """Poll until the build ends; `progress` on every status change. BuildFailed (with the log's tail)
        unless it succeeded; OpsError after `timeout_s` (the build goes on: `cancel` stops it)."""
        deadline = time.monotonic() + timeout_s
        last = ""
        pause = min(1.0, self.poll_s)
        while True:
            info = self.get(build_id)
            if info.status != last:
                last = info.status
                if progress is not None:
                    progress(info)
            if info.status == "SUCCESS":
                return info
            if info.done:
                raise BuildFailed(info, self.log_tail(info))
            if time.monotonic() >= deadline:
                raise OpsError(
                    f"build {build_id} still {info.status} after {timeout_s:g} s",
                    f"follow it at {info.log_url}, or cancel it",
                )
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))  # the API has no events
            pause = min(pause * 1.5, self.poll_s)

    def log_tail(self, info: BuildInfo, lines: int = 20) -> list[str]:
        """The last `lines` lines of the build's log ([] when it cannot be read)."""
        bucket, _, prefix = info.logs_bucket.removeprefix("gs://").partition("/")
        name = f"{prefix.rstrip('/')}/log-{info.id}.txt".lstrip("/")
        try:
            data = self.objects.read(bucket, name)
        except Exception:
            return []
        return [] if data is None else data.decode(errors="replace").splitlines()[-lines:]

    def cancel(self, build_id: str) -> BuildInfo:
        try:
            return _info(self.client.cancel_build(project_id=self.project, id=build_id, retry=self.retry))
        except exceptions.NotFound:
            raise OpsError(f"no build {build_id} in project {self.project}") from None
        except Exception as e:
            raise common.api_error(e, f"cancel build {build_id}", EDITOR, self.project) from None


def _info(b: cb.Build) -> BuildInfo:
    return BuildInfo(
        id=b.id,
        project=b.project_id,
        status=cb.Build.Status(b.status).name,
        log_url=b.log_url,
        logs_bucket=b.logs_bucket,
        images=[BuiltImage(name=i.name, digest=i.digest) for i in b.results.images],
        failure=cb.Build.FailureInfo.FailureType(b.failure_info.type_).name if b.failure_info.type_ else "",
        detail=b.failure_info.detail or b.status_detail,
        create_time=b.create_time or None,
        start_time=b.start_time or None,
        finish_time=b.finish_time or None,
    )
