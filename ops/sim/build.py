"""A simulated Cloud Build v1 (`google.devtools.cloudbuild.v1.CloudBuild`): CreateBuild as an LRO whose
metadata carries the build, builds QUEUED -> WORKING -> SUCCESS / FAILURE (or CANCELLED) with a log
written to the logs bucket (`<logs_bucket>/log-<id>.txt`, GCP_API_FACTS.md 4).

No Docker runs here. A build takes its source the way Cloud Build does, a tarball in a bucket
(`Objects`: fake-gcs-server in tests, a directory by default), runs its `gcr.io/cloud-builders/docker`
steps by checking what Docker would refuse (ops.sim.dockerfile) and giving each built image a digest,
and pushes `images` (and `docker push` steps) into the simulated Artifact Registry itself, as the real
builder's pushes bypass the Artifact Registry API. A listed image no step built fails PUSH_IMAGE_NOT_FOUND,
a push to a missing repository PUSH_FAILED; other builders cannot run here and fail their step.
A failed build's operation ends with UNKNOWN "Build failed; check build logs for details" (the facts'
expectation, unconfirmed); a cancelled one with CANCELLED.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import tarfile
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.cloud.devtools import cloudbuild_v1 as cb
from google.protobuf import duration_pb2, timestamp_pb2

from ops.gcp.objects import Objects
from ops.sim import dockerfile
from ops.sim.artifacts import ArtifactState, PushError
from ops.sim.clock import Clock
from ops.sim.faults import FaultKind, Faults
from ops.sim.lro import Operations
from ops.sim.rpc import LRO, Methods, page, resource_of, service_handler
from ops.sim.state import Latency, SimError

log = logging.getLogger(__name__)
SERVICE = "google.devtools.cloudbuild.v1.CloudBuild"
Status = cb.Build.Status
FailureType = cb.Build.FailureInfo.FailureType
TERMINAL = (
    Status.SUCCESS,
    Status.FAILURE,
    Status.INTERNAL_ERROR,
    Status.TIMEOUT,
    Status.CANCELLED,
    Status.EXPIRED,
)
FAILED_MESSAGE = "Build failed; check build logs for details"
BUILTINS = ("PROJECT_ID", "BUILD_ID", "LOCATION", "PROJECT_NUMBER")
_PARENT_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
_NAME_RE = re.compile(r"^projects/([^/]+)/locations/([^/]+)/builds/([^/]+)$")
_USER_KEY_RE = re.compile(r"^_[A-Z0-9_]+$")
_VAR_RE = re.compile(r"\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_DOCKER_RE = re.compile(r"^(gcr\.io/cloud-builders/docker|docker)(:[\w.-]+)?$")
PERMISSIONS = {
    "CreateBuild": "cloudbuild.builds.create",
    "GetBuild": "cloudbuild.builds.get",
    "ListBuilds": "cloudbuild.builds.list",
    "CancelBuild": "cloudbuild.builds.update",
}
_VALUE_FLAGS = {
    "-t", "--tag", "-f", "--file", "--build-arg", "--target", "--cache-from", "--label", "--platform",
    "--network", "--progress", "--secret", "--ssh", "--iidfile", "--add-host", "--shm-size",
}  # fmt: skip
_BOOL_FLAGS = {"--pull", "--no-cache", "-q", "--quiet", "--rm", "--force-rm", "--squash", "--compress"}
_REF_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?$"
)


def _ts() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def _copy(msg: Any) -> Any:
    return type(msg).deserialize(type(msg).serialize(msg))


def with_tag(ref: str) -> str:
    """`name` -> `name:latest` (Docker's default tag)."""
    return ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"


class StepFailed(Exception):
    def __init__(self, message: str, failure: FailureType = FailureType.USER_BUILD_STEP) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass
class _Run:
    """A build in flight: its operation, its log, and the failure a fault planned for it."""

    op: str
    location: str
    subs: dict[str, str] = field(default_factory=dict)  # user substitutions and the built-in values
    log: list[str] = field(default_factory=list)
    planned_failure: str | None = None


class BuildState:
    def __init__(
        self,
        ops: Operations,
        artifacts: ArtifactState,
        objects: Objects,
        clock: Clock,
        faults: Faults,
        latency: Callable[[], Latency],
        path: Path | None = None,
    ) -> None:
        """`latency` gives the current step delays (the control endpoint may change them)."""
        self.ops, self.artifacts, self.objects, self.clock = ops, artifacts, objects, clock
        self.faults = faults
        self.latency = latency
        self._path = path
        self._lock = threading.Lock()
        self._builds: dict[str, cb.Build] = {}  # id -> build
        self._runs: dict[str, _Run] = {}
        self._done = threading.Condition(self._lock)
        if path is not None and path.exists():
            self._load(path)

    # ---- RPCs ---------------------------------------------------------------------------------
    def create(self, project_id: str, parent: str, build: cb.Build) -> str:
        location = "global"
        if parent:
            m = _PARENT_RE.match(parent)
            if not m:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
            project_id, location = project_id or m.group(1), m.group(2)
        if not project_id:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "project_id is required")
        if not build.steps:
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT, "invalid build: build must have at least one step"
            )
        source = build.source.storage_source
        if cb.Source.pb(build.source).WhichOneof("source") not in (None, "storage_source"):
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT, "the simulator takes storage_source sources only"
            )
        if cb.Build.pb(build).HasField("source") and not (source.bucket and source.object_):
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT, "invalid build: storage_source needs bucket and object"
            )
        build_id = str(uuid.uuid4())
        subs = self._substitutions(build, project_id, build_id, location)
        stored = _copy(build)
        stored.id = build_id
        stored.project_id = project_id
        stored.name = f"projects/{project_id}/locations/{location}/builds/{build_id}"
        stored.status = Status.QUEUED
        stored.create_time = _ts()
        if not cb.Build.pb(build).HasField("timeout"):
            stored.timeout = duration_pb2.Duration(seconds=3600)
        if not stored.logs_bucket:
            stored.logs_bucket = f"gs://{project_id}.cloudbuild-logs.googleusercontent.com"
        region = "" if location == "global" else f";region={location}"
        stored.log_url = (
            f"https://console.cloud.google.com/cloud-build/builds{region}/{build_id}?project={project_id}"
        )
        fault = self.faults.take(FaultKind.BUILD_FAILURE)
        encoded = base64.b64encode(build_id.encode()).decode()
        op_name = (
            f"operations/build/{project_id}/{encoded}"
            if location == "global"
            else f"projects/{project_id}/locations/{location}/operations/build/{encoded}"
        )
        with self._lock:
            self._builds[build_id] = stored
            run = self._runs[build_id] = _Run(op=op_name, location=location, subs=subs)
            if fault is not None:
                run.planned_failure = fault.message or (
                    "The command '/bin/sh -c pip install --no-cache-dir -r requirements.txt' returned a "
                    "non-zero code: 1"
                )
            self.ops.begin(op_name, cb.BuildOperationMetadata(build=stored))
            self._save()
        self.clock.call_later(self.latency().build_queue_s, lambda: self._start(build_id))
        return op_name

    def get(self, project_id: str, build_id: str, name: str = "") -> cb.Build:
        if name:
            m = _NAME_RE.match(name)
            if not m:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid build name: {name!r}")
            project_id, build_id = m.group(1), m.group(3)
        with self._lock:
            build = self._builds.get(build_id)
            if build is None or build.project_id != project_id:
                raise SimError(grpc.StatusCode.NOT_FOUND, f'Build "{build_id}" not found')
            return _copy(build)

    def list(self, project_id: str, parent: str = "") -> list[cb.Build]:
        """Newest first, as Cloud Build lists them."""
        location = None
        if parent:
            m = _PARENT_RE.match(parent)
            if not m:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
            project_id, location = m.group(1), m.group(2)
        with self._lock:
            found = [
                _copy(b)
                for b in self._builds.values()
                if b.project_id == project_id and (location is None or self._location(b) == location)
            ]
        return sorted(found, key=lambda b: b.create_time, reverse=True)

    def cancel(self, project_id: str, build_id: str, name: str = "") -> cb.Build:
        build = self.get(project_id, build_id, name)
        with self._lock:
            stored = self._builds[build.id]
            if stored.status in (Status.QUEUED, Status.WORKING, Status.PENDING):
                run = self._runs.get(build.id)
                if run is not None:
                    run.log.append("Build was cancelled.")
                self._end(stored, Status.CANCELLED, "Build was cancelled")
            return _copy(stored)

    def wait(self, build_id: str, timeout_s: float) -> cb.Build:
        """Block until the build is terminal (for tests and tools; clients poll instead)."""
        with self._done:
            self._done.wait_for(lambda: self._builds[build_id].status in TERMINAL, timeout_s)
            return _copy(self._builds[build_id])

    def summary(self) -> dict:
        with self._lock:
            return {i: Status(b.status).name for i, b in self._builds.items()}

    # ---- the run (clock thread) ---------------------------------------------------------------
    def _start(self, build_id: str) -> None:
        with self._lock:
            build = self._builds[build_id]
            if build.status != Status.QUEUED:
                return
            build.status = Status.WORKING
            build.start_time = _ts()
            run = self._runs[build_id]
            run.log.append(f'starting build "{build_id}"')
            self._publish(build)
        self.clock.call_later(self.latency().build_s, lambda: self._run(build_id))

    def _run(self, build_id: str) -> None:
        with self._lock:
            build = _copy(self._builds[build_id])
            run = self._runs[build_id]
            if build.status != Status.WORKING:
                return
        out: list[str] = []
        results = cb.Results()
        status, failure, detail = Status.SUCCESS, FailureType.FAILURE_TYPE_UNSPECIFIED, ""
        try:
            with tempfile.TemporaryDirectory(prefix="cb-sim-") as tmp:
                workspace = Path(tmp)
                self._fetch(build, workspace, out)
                built = self._steps(build, run.subs, workspace, out, run.planned_failure)
                results.images = self._push_images(build, run.subs, built, out)
            out.append("DONE")
        except StepFailed as e:
            status, failure, detail = Status.FAILURE, e.failure, str(e)
            out.append(f"ERROR: {e}")
        except Exception as e:  # a bug of ours: the build ends, the simulator goes on
            log.exception("cloud-build-sim: build %s crashed", build_id)
            status, detail = Status.INTERNAL_ERROR, f"internal error: {e}"
            out.append(f"ERROR: {detail}")
        with self._lock:
            stored = self._builds[build_id]
            if stored.status != Status.WORKING:
                return  # cancelled meanwhile
            run.log.extend(out)
            stored.results = results
            if failure != FailureType.FAILURE_TYPE_UNSPECIFIED:
                stored.failure_info = cb.Build.FailureInfo(type_=failure, detail=detail)
            self._end(stored, status, detail)

    def _end(self, build: cb.Build, status: Status, detail: str) -> None:
        """Terminal status, the log written, the operation done (under the lock)."""
        build.status = status
        build.status_detail = detail
        build.finish_time = _ts()
        run = self._runs[build.id]
        self._publish(build)
        if status == Status.SUCCESS:
            self.ops.finish(run.op, build)
        elif status == Status.CANCELLED:
            self.ops.fail(run.op, grpc.StatusCode.CANCELLED, "Build was cancelled")
        else:
            self.ops.fail(run.op, grpc.StatusCode.UNKNOWN, FAILED_MESSAGE)
        self._done.notify_all()

    def _publish(self, build: cb.Build) -> None:
        """The operation's metadata and the log object follow the build (under the lock)."""
        run = self._runs[build.id]
        self.ops.set_metadata(run.op, cb.BuildOperationMetadata(build=build))
        bucket, _, prefix = build.logs_bucket.removeprefix("gs://").partition("/")
        obj = f"{prefix.rstrip('/')}/log-{build.id}.txt".lstrip("/")
        try:
            self.objects.write(bucket, obj, ("\n".join(run.log) + "\n").encode())
        except Exception:
            log.exception("cloud-build-sim: cannot write the log of %s to %s", build.id, build.logs_bucket)
        self._save()

    def _fetch(self, build: cb.Build, workspace: Path, out: list[str]) -> None:
        if not cb.Build.pb(build).HasField("source"):
            return
        src = build.source.storage_source
        url = f"gs://{src.bucket}/{src.object_}"
        out += ["", "FETCHSOURCE", f"Fetching storage object: {url}"]
        try:
            data = self.objects.read(src.bucket, src.object_)
        except Exception as e:
            raise StepFailed(f"failed to fetch {url}: {e}", FailureType.FETCH_SOURCE_FAILED) from None
        if data is None:
            raise StepFailed(
                f"could not fetch source: storage object {url} not found", FailureType.FETCH_SOURCE_FAILED
            )
        try:
            if src.object_.endswith(".zip"):
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for member in z.namelist():
                        if member.startswith("/") or ".." in Path(member).parts:
                            raise StepFailed(
                                f"unsafe path in source: {member}", FailureType.FETCH_SOURCE_FAILED
                            )
                    z.extractall(workspace)
            else:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
                    t.extractall(workspace, filter="data")
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
            raise StepFailed(f"cannot unpack {url}: {e}", FailureType.FETCH_SOURCE_FAILED) from None
        files = sum(1 for p in workspace.rglob("*") if p.is_file())
        out.append(f"Extracted {files} files from {url}")

    def _steps(
        self, build: cb.Build, subs: dict[str, str], workspace: Path, out: list[str], planned: str | None
    ) -> dict[str, str]:
        """Run the steps; the images they built (reference -> digest)."""
        built: dict[str, str] = {}
        out += ["", "BUILD"]
        for index, step in enumerate(build.steps):
            out.append(f"Starting Step #{index}")
            where = f'build step {index} "{step.name}" failed'
            if planned is not None:
                out += [f"Step #{index}: {line}" for line in planned.splitlines()]
                raise StepFailed(f"{where}: step exited with non-zero status: 1")
            if not _DOCKER_RE.match(step.name) or step.entrypoint or step.script:
                out.append(f"Step #{index}: the simulator runs only docker build / tag / push steps")
                raise StepFailed(f"{where}: the simulator cannot run {step.name} {step.entrypoint}".rstrip())
            args = [substitute(a, subs) for a in step.args]
            cwd = (workspace / substitute(step.dir_, subs)).resolve()
            try:
                self._docker(args, cwd, workspace, built, build, out, index)
            except dockerfile.DockerfileError as e:
                out.append(f"Step #{index}: ERROR: {e}")
                raise StepFailed(f"{where}: step exited with non-zero status: 1") from None
            out.append(f"Finished Step #{index}")
        return built

    def _docker(
        self,
        args: list[str],
        cwd: Path,
        workspace: Path,
        built: dict[str, str],
        build: cb.Build,
        out: list[str],
        index: int,
    ) -> None:
        say = out.append
        if not args:
            raise dockerfile.DockerfileError('docker: "docker" requires a command')
        command, rest = args[0], args[1:]
        if command == "build":
            tags, file_, target, positional = [], "", "", []
            i = 0
            while i < len(rest):
                arg = rest[i]
                flag, eq, value = arg.partition("=")
                if flag in _VALUE_FLAGS:
                    if not eq:
                        i += 1
                        if i >= len(rest):
                            raise dockerfile.DockerfileError(f"flag needs an argument: {flag}")
                        value = rest[i]
                    if flag in ("-t", "--tag"):
                        if not _REF_RE.match(value):
                            raise dockerfile.DockerfileError(
                                f'invalid argument "{value}" for "-t, --tag" flag: invalid reference format'
                            )
                        tags.append(with_tag(value))
                    elif flag in ("-f", "--file"):
                        file_ = value
                    elif flag == "--target":
                        target = value
                elif arg in _BOOL_FLAGS:
                    pass
                elif arg.startswith("-") and arg != "-":
                    raise dockerfile.DockerfileError(f"unknown flag: {flag}")
                else:
                    positional.append(arg)
                i += 1
            if len(positional) != 1:
                raise dockerfile.DockerfileError('"docker build" requires exactly 1 argument.')
            context = (cwd / positional[0]).resolve()
            if not context.is_relative_to(workspace.resolve()):
                raise dockerfile.DockerfileError(
                    f"unable to prepare context: {positional[0]} is outside /workspace"
                )
            path = (cwd / file_).resolve() if file_ else context / "Dockerfile"
            df = dockerfile.check(path, context, target)
            digest = "sha256:" + _digest(build.id, path, context)
            for n, ins in enumerate(df.instructions, 1):
                say(f"Step #{index}: Step {n}/{len(df.instructions)} : {ins.keyword} {ins.args[:200]}")
            say(f"Step #{index}: Successfully built {digest[7:19]}")
            for tag in tags:
                built[tag] = digest
                say(f"Step #{index}: Successfully tagged {tag}")
        elif command == "tag":
            if len(rest) != 2:
                raise dockerfile.DockerfileError('"docker tag" requires exactly 2 arguments.')
            src, dst = with_tag(rest[0]), with_tag(rest[1])
            if src not in built:
                raise dockerfile.DockerfileError(f"No such image: {rest[0]}")
            built[dst] = built[src]
        elif command == "push":
            refs = [r for r in rest if not r.startswith("-")]
            if len(refs) != 1:
                raise dockerfile.DockerfileError('"docker push" requires exactly 1 argument.')
            ref = with_tag(refs[0])
            if ref not in built:
                raise dockerfile.DockerfileError(f"An image does not exist locally with the tag: {refs[0]}")
            try:
                self.artifacts.push(ref, built[ref], _size(workspace))
            except PushError as e:
                raise dockerfile.DockerfileError(str(e)) from None
            say(f"Step #{index}: {ref.rsplit(':', 1)[-1]}: digest: {built[ref]}")
        else:
            raise dockerfile.DockerfileError(f"the simulator cannot run `docker {command}`")

    def _push_images(
        self, build: cb.Build, subs: dict[str, str], built: dict[str, str], out: list[str]
    ) -> list[cb.BuiltImage]:
        images = [substitute(i, subs) for i in build.images]
        if not images:
            return []
        out += ["", "PUSH"]
        for image in images:
            if with_tag(image) not in built:
                raise StepFailed(
                    f"failed to find one or more images after execution of build steps: [{image}]",
                    FailureType.PUSH_IMAGE_NOT_FOUND,
                )
        pushed = []
        for image in images:
            ref, digest = with_tag(image), built[with_tag(image)]
            out.append(f"Pushing {image}")
            try:
                package = self.artifacts.push(ref, digest, 0)
            except PushError as e:
                raise StepFailed(f"failed to push {image}: {e}", FailureType.PUSH_FAILED) from None
            out.append(f"{ref.rsplit(':', 1)[-1]}: digest: {digest} size: 2841")
            pushed.append(cb.BuiltImage(name=image, digest=digest, artifact_registry_package=package))
        return pushed

    # ---- helpers ------------------------------------------------------------------------------
    def _substitutions(
        self, build: cb.Build, project_id: str, build_id: str, location: str
    ) -> dict[str, str]:
        """User substitutions checked as Cloud Build does in MUST_MATCH mode (the default)."""
        user = dict(build.substitutions)
        for key in user:
            if not _USER_KEY_RE.match(key) and key not in BUILTINS:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'invalid build: key in the substitution data "{key}" is not a valid user-defined '
                    "substitution: it must start with _ and use uppercase letters, digits and _",
                )
        values = {"PROJECT_ID": project_id, "BUILD_ID": build_id, "LOCATION": location, **user}
        texts = [*build.images] + [t for s in build.steps for t in (*s.args, s.dir_, *s.env)]
        used = {m.group(2) or m.group(3) for t in texts for m in _VAR_RE.finditer(t)} - {None}
        loose = build.options.substitution_option == cb.BuildOptions.SubstitutionOption.ALLOW_LOOSE
        if not loose:
            unknown = sorted(v for v in used if v not in values and not v.startswith("_"))
            missing = sorted(v for v in used if v.startswith("_") and v not in values)
            unused = sorted(k for k in user if k not in used)
            if unknown or missing:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'invalid build: key in the template "{(unknown or missing)[0]}" is not matched in the '
                    "substitution data",
                )
            if unused:
                raise SimError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f'invalid build: key "{unused[0]}" in the substitution data is not matched in the '
                    "template",
                )
        return values

    @staticmethod
    def _location(build: cb.Build) -> str:
        m = _NAME_RE.match(build.name)
        return m.group(2) if m else "global"

    # ---- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        if self._path is None:
            return
        data = {i: json.loads(cb.Build.to_json(b)) for i, b in self._builds.items()}
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._path)

    def _load(self, path: Path) -> None:
        """Builds from before a restart; one that was running is INTERNAL_ERROR (its worker is gone)."""
        for build_id, raw in json.loads(path.read_text()).items():
            build = cb.Build.from_json(json.dumps(raw))
            if build.status not in TERMINAL:
                build.status = Status.INTERNAL_ERROR
                build.status_detail = "the simulator restarted while the build ran"
            self._builds[build_id] = build


def substitute(text: str, values: dict[str, str]) -> str:
    """`$VAR` and `${VAR}` replaced (an unknown one left as it is, ALLOW_LOOSE's rule); `$$` is `$`."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        key = m.group(2) or m.group(3)
        return values.get(key, m.group(0))

    return _VAR_RE.sub(one, text)


def _digest(build_id: str, dockerfile_path: Path, context: Path) -> str:
    """A new image per build (real builds are not reproducible), the same for all of one build's tags."""
    h = hashlib.sha256(build_id.encode())
    h.update(dockerfile_path.read_bytes())
    for p in sorted(context.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(context).as_posix().encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _size(workspace: Path) -> int:
    return sum(p.stat().st_size for p in workspace.rglob("*") if p.is_file())


def build_handler(state: BuildState, faults: Faults) -> grpc.GenericRpcHandler:
    """The Cloud Build v1 service (builds only) over `state`."""

    def operation(name: str) -> Any:
        op = state.ops.get(name)
        assert op is not None
        return op

    def list_builds(r: cb.ListBuildsRequest) -> cb.ListBuildsResponse:
        found, token = page(state.list(r.project_id, r.parent), r.page_size, r.page_token)
        return cb.ListBuildsResponse(builds=found, next_page_token=token)

    methods: Methods = {
        "CreateBuild": (
            cb.CreateBuildRequest,
            LRO,
            lambda r: operation(state.create(r.project_id, r.parent, r.build)),
        ),
        "GetBuild": (cb.GetBuildRequest, cb.Build, lambda r: state.get(r.project_id, r.id, r.name)),
        "ListBuilds": (cb.ListBuildsRequest, cb.ListBuildsResponse, list_builds),
        "CancelBuild": (cb.CancelBuildRequest, cb.Build, lambda r: state.cancel(r.project_id, r.id, r.name)),
    }
    return service_handler(SERVICE, methods, faults, PERMISSIONS, resource_of)
