"""The simulator's Secret Manager, Cloud Build and Artifact Registry through the real google-cloud clients
over gRPC: each state transition (secret versions, `latest`, builds QUEUED -> WORKING -> SUCCESS /
FAILURE / CANCELLED), what a real build refuses (Dockerfile and context, images not built, missing
repositories), pushes listed by Artifact Registry, cleanup policies, each fault, and the process mode."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import google_crc32c
import grpc
import pytest
from google.api_core import exceptions
from google.cloud import artifactregistry_v1 as ar
from google.cloud import secretmanager_v1 as sm
from google.cloud.artifactregistry_v1.services.artifact_registry.transports import (
    ArtifactRegistryGrpcTransport,
)
from google.cloud.devtools import cloudbuild_v1 as cb
from google.cloud.devtools.cloudbuild_v1.services.cloud_build.transports import CloudBuildGrpcTransport
from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
    SecretManagerServiceGrpcTransport,
)
from google.protobuf import duration_pb2, field_mask_pb2

from ops.gcp.objects import gcs_objects_at
from ops.sim import FaultKind, Latency, SimServer
from ops.sim.control import SimControl
from tests.gcs_emulator import GcsEmulator

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "proj"
SECRET = f"projects/{PROJECT}/secrets/ray-token"
REGION = "us-central2"
REPO = f"projects/{PROJECT}/locations/{REGION}/repositories/marin"
IMAGE = f"{REGION}-docker.pkg.dev/{PROJECT}/marin/cluster"
FAST = Latency(build_queue_s=0.05, build_s=0.05)
State = sm.SecretVersion.State
Status = cb.Build.Status
DOCKERFILE = (
    "# syntax=docker/dockerfile:1\nARG BASE=rayproject/ray:2.60.0-py311\nFROM $BASE\n"
    "COPY requirements.txt /tmp/\nRUN pip install -r /tmp/requirements.txt \\\n    && echo done\n"
    "WORKDIR /home/ray\n"
)


class Clients:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.sm = sm.SecretManagerServiceClient(
            transport=SecretManagerServiceGrpcTransport(channel=self.channel)
        )
        self.cb = cb.CloudBuildClient(transport=CloudBuildGrpcTransport(channel=self.channel))
        self.ar = ar.ArtifactRegistryClient(transport=ArtifactRegistryGrpcTransport(channel=self.channel))


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimServer]:
    with SimServer(latency=FAST, buckets_dir=tmp_path / "buckets") as server:
        yield server


@pytest.fixture
def c(sim: SimServer) -> Iterator[Clients]:
    clients = Clients(sim.address)
    yield clients
    clients.channel.close()


def add(c: Clients, data: bytes, secret: str = SECRET) -> sm.SecretVersion:
    payload = sm.SecretPayload(data=data, data_crc32c=google_crc32c.value(data))
    return c.sm.add_secret_version(parent=secret, payload=payload)


def make_secret(c: Clients, secret_id: str = "ray-token") -> None:
    c.sm.create_secret(
        parent=f"projects/{PROJECT}", secret_id=secret_id, secret=sm.Secret(replication={"automatic": {}})
    )


# ---- Secret Manager -------------------------------------------------------------------------------
def test_versions_and_what_latest_resolves_to(c: Clients) -> None:
    make_secret(c)
    with pytest.raises(exceptions.NotFound, match="not found or has no versions"):
        c.sm.access_secret_version(name=f"{SECRET}/versions/latest", retry=None)
    v1 = add(c, b"token-one")
    v2 = add(c, b"token-two")
    assert (v1.name, v2.name) == (f"{SECRET}/versions/1", f"{SECRET}/versions/2")
    assert v2.state == State.ENABLED and v2.client_specified_payload_checksum
    got = c.sm.access_secret_version(name=f"{SECRET}/versions/latest")
    assert got.name == f"{SECRET}/versions/2" and got.payload.data == b"token-two"
    assert got.payload.data_crc32c == google_crc32c.value(b"token-two")
    assert c.sm.access_secret_version(name=f"{SECRET}/versions/1").payload.data == b"token-one"

    # The newest disabled: `latest` does not fall back to version 1 (GCP_API_FACTS.md 3.3).
    disabled = c.sm.disable_secret_version(name=f"{SECRET}/versions/2")
    assert disabled.state == State.DISABLED
    with pytest.raises(exceptions.FailedPrecondition, match=r"versions/2\] is in DISABLED state"):
        c.sm.access_secret_version(name=f"{SECRET}/versions/latest", retry=None)
    assert c.sm.access_secret_version(name=f"{SECRET}/versions/1").payload.data == b"token-one"
    c.sm.enable_secret_version(name=f"{SECRET}/versions/2")
    assert c.sm.access_secret_version(name=f"{SECRET}/versions/latest").payload.data == b"token-two"

    destroyed = c.sm.destroy_secret_version(name=f"{SECRET}/versions/1")
    assert destroyed.state == State.DESTROYED and destroyed.destroy_time
    with pytest.raises(exceptions.FailedPrecondition, match="DESTROYED"):
        c.sm.access_secret_version(name=f"{SECRET}/versions/1", retry=None)
    with pytest.raises(exceptions.FailedPrecondition, match="DESTROYED"):
        c.sm.enable_secret_version(name=f"{SECRET}/versions/1")
    listed = list(c.sm.list_secret_versions(parent=SECRET))
    assert [(v.name.rsplit("/", 1)[-1], v.state) for v in listed] == [
        ("2", State.ENABLED),
        ("1", State.DESTROYED),
    ]
    enabled = list(c.sm.list_secret_versions(request={"parent": SECRET, "filter": "state:ENABLED"}))
    assert [v.name for v in enabled] == [f"{SECRET}/versions/2"]
    with pytest.raises(exceptions.NotFound):
        c.sm.get_secret_version(name=f"{SECRET}/versions/9")


def test_secret_checks_the_service_makes(c: Clients) -> None:
    with pytest.raises(exceptions.InvalidArgument, match="replication"):
        c.sm.create_secret(parent=f"projects/{PROJECT}", secret_id="x", secret=sm.Secret())
    with pytest.raises(exceptions.InvalidArgument, match="secret id"):
        make_secret(c, "bad/id")
    make_secret(c)
    with pytest.raises(exceptions.AlreadyExists):
        make_secret(c)
    with pytest.raises(exceptions.InvalidArgument, match="Checksum mismatch"):
        c.sm.add_secret_version(parent=SECRET, payload=sm.SecretPayload(data=b"abc", data_crc32c=1))
    unchecked = c.sm.add_secret_version(parent=SECRET, payload=sm.SecretPayload(data=b"abc"))
    assert not unchecked.client_specified_payload_checksum
    assert c.sm.access_secret_version(name=unchecked.name).payload.data_crc32c == google_crc32c.value(b"abc")
    with pytest.raises(exceptions.FailedPrecondition, match="etag"):
        c.sm.disable_secret_version(request={"name": unchecked.name, "etag": '"stale"'})
    etag = c.sm.get_secret_version(name=unchecked.name).etag
    assert c.sm.disable_secret_version(request={"name": unchecked.name, "etag": etag}).state == State.DISABLED
    assert [s.name for s in c.sm.list_secrets(parent=f"projects/{PROJECT}")] == [SECRET]
    c.sm.delete_secret(name=SECRET)
    with pytest.raises(exceptions.NotFound):
        c.sm.get_secret(name=SECRET)


def test_secret_faults_permission_denied_and_503(sim: SimServer, c: Clients) -> None:
    make_secret(c)
    add(c, b"v1")
    sim.fault("permission_denied", method="AccessSecretVersion")
    with pytest.raises(exceptions.PermissionDenied, match="secretmanager.versions.access"):
        c.sm.access_secret_version(name=f"{SECRET}/versions/latest", retry=None)
    sim.fault("unavailable", method="AccessSecretVersion", times=2)
    with pytest.raises(exceptions.ServiceUnavailable):
        c.sm.access_secret_version(name=f"{SECRET}/versions/latest", retry=None)
    # The client's own default retry for access (GCP_API_FACTS.md 0.3) rides over the second 503.
    assert c.sm.access_secret_version(name=f"{SECRET}/versions/latest").payload.data == b"v1"


def test_seeded_secrets_and_persistence(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with SimServer(state_path=state, secrets={PROJECT: {"ray-token": "tok-1"}}) as server:
        c = Clients(server.address)
        assert c.sm.access_secret_version(name=f"{SECRET}/versions/latest").payload.data == b"tok-1"
        c.channel.close()
    assert oct((tmp_path / "secrets.json").stat().st_mode & 0o777) == "0o600"
    # The same value again adds nothing; a new one is version 2; both survive a restart.
    with SimServer(state_path=state, secrets={PROJECT: {"ray-token": "tok-1"}}) as server:
        assert server.secrets.summary() == {SECRET: {"1": "ENABLED"}}
        server.secrets.seed(PROJECT, {"ray-token": "tok-2"})
    with SimServer(state_path=state) as server:
        c = Clients(server.address)
        assert c.sm.access_secret_version(name=f"{SECRET}/versions/latest").payload.data == b"tok-2"
        assert c.sm.access_secret_version(name=f"{SECRET}/versions/1").payload.data == b"tok-1"
        c.channel.close()


# ---- Artifact Registry ----------------------------------------------------------------------------
def make_repo(c: Clients, location: str = REGION, repo_id: str = "marin") -> ar.Repository:
    op = c.ar.create_repository(
        parent=f"projects/{PROJECT}/locations/{location}",
        repository_id=repo_id,
        repository=ar.Repository(format_=ar.Repository.Format.DOCKER, description="cluster images"),
    )
    return op.result(timeout=10)


def test_repositories_and_cleanup_policies(sim: SimServer, c: Clients) -> None:
    repo = make_repo(c)
    assert repo.name == REPO and repo.registry_uri == f"{REGION}-docker.pkg.dev/{PROJECT}/marin"
    with pytest.raises(exceptions.AlreadyExists):
        make_repo(c)
    make_repo(c, "europe-west4")
    assert [r.name for r in c.ar.list_repositories(parent=f"projects/{PROJECT}/locations/{REGION}")] == [REPO]
    policies = {
        "delete-old": ar.CleanupPolicy(
            id="delete-old",
            action=ar.CleanupPolicy.Action.DELETE,
            condition=ar.CleanupPolicyCondition(
                tag_state=ar.CleanupPolicyCondition.TagState.ANY,
                older_than=duration_pb2.Duration(seconds=30 * 86400),
            ),
        ),
        "keep-2": ar.CleanupPolicy(
            id="keep-2",
            action=ar.CleanupPolicy.Action.KEEP,
            most_recent_versions=ar.CleanupPolicyMostRecentVersions(keep_count=2),
        ),
        "keep-pinned": ar.CleanupPolicy(
            id="keep-pinned",
            action=ar.CleanupPolicy.Action.KEEP,
            condition=ar.CleanupPolicyCondition(tag_prefixes=["pinned"]),
        ),
    }
    mask = field_mask_pb2.FieldMask(paths=["cleanup_policies", "cleanup_policy_dry_run"])
    updated = c.ar.update_repository(
        repository=ar.Repository(name=REPO, cleanup_policies=policies, cleanup_policy_dry_run=True),
        update_mask=mask,
    )
    assert set(updated.cleanup_policies) == set(policies) and updated.cleanup_policy_dry_run
    assert c.ar.get_repository(name=REPO).cleanup_policies["keep-2"].most_recent_versions.keep_count == 2
    with pytest.raises(exceptions.InvalidArgument, match="KEEP"):
        bad = {
            "x": ar.CleanupPolicy(
                id="x",
                action=ar.CleanupPolicy.Action.DELETE,
                most_recent_versions=ar.CleanupPolicyMostRecentVersions(keep_count=1),
            )
        }
        c.ar.update_repository(repository=ar.Repository(name=REPO, cleanup_policies=bad), update_mask=mask)
    with pytest.raises(exceptions.InvalidArgument, match="update_mask"):
        c.ar.update_repository(repository=ar.Repository(name=REPO), update_mask={"paths": ["format"]})

    # Five pushes 40 days apart: the old ones go, except the two newest and the pinned one. Dry run first.
    for i, tag in enumerate(["pinned-a", "t1", "t2", "t3", "t4"]):
        sim.artifacts.push(f"{IMAGE}:{tag}", f"sha256:{i:064x}", 100)
    package = sim.artifacts._packages[REPO]["cluster"]
    for i, version in enumerate(package.versions.values()):
        version.created = datetime.now(UTC) - timedelta(days=40 * (5 - i))
    dry = sim.artifacts.run_cleanup()
    assert {k: sorted(v) for k, v in dry.items()} == {REPO: [f"cluster@sha256:{i:064x}" for i in (1, 2)]}
    assert len(list(c.ar.list_docker_images(parent=REPO))) == 5
    c.ar.update_repository(
        repository=ar.Repository(name=REPO, cleanup_policies=policies, cleanup_policy_dry_run=False),
        update_mask=mask,
    )
    sim.artifacts.run_cleanup()
    left = {tuple(i.tags) for i in c.ar.list_docker_images(parent=REPO)}
    assert left == {("pinned-a",), ("t3",), ("t4",)}

    op = c.ar.delete_repository(name=f"projects/{PROJECT}/locations/europe-west4/repositories/marin")
    op.result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        c.ar.get_repository(name=f"projects/{PROJECT}/locations/europe-west4/repositories/marin")


def test_registry_lists_images_tags_versions_and_faults(sim: SimServer, c: Clients) -> None:
    make_repo(c)
    sim.artifacts.push(f"{IMAGE}:latest", "sha256:" + "a" * 64, 10)
    sim.artifacts.push(f"{IMAGE}:abc1234", "sha256:" + "a" * 64, 10)
    sim.artifacts.push(f"{IMAGE}:latest", "sha256:" + "b" * 64, 10)  # `latest` moves to the new image
    images = {i.uri.rsplit("@", 1)[-1][7:8]: list(i.tags) for i in c.ar.list_docker_images(parent=REPO)}
    assert images == {"a": ["abc1234"], "b": ["latest"]}
    package = f"{REPO}/packages/cluster"
    assert [p.name for p in c.ar.list_packages(parent=REPO)] == [package]
    tags = {t.name.rsplit("/", 1)[-1]: t.version.rsplit("/", 1)[-1] for t in c.ar.list_tags(parent=package)}
    assert tags == {"abc1234": "sha256:" + "a" * 64, "latest": "sha256:" + "b" * 64}
    versions = list(c.ar.list_versions(request={"parent": package, "view": ar.VersionView.FULL}))
    assert [v.name.rsplit("/", 1)[-1] for v in versions] == ["sha256:" + "b" * 64, "sha256:" + "a" * 64]
    assert [t.name.rsplit("/", 1)[-1] for t in versions[0].related_tags] == ["latest"]
    with pytest.raises(exceptions.FailedPrecondition, match="tagged"):
        c.ar.delete_version(name=versions[1].name).result(timeout=10)
    c.ar.delete_tag(name=f"{package}/tags/abc1234")
    c.ar.delete_version(name=versions[1].name).result(timeout=10)
    assert [list(i.tags) for i in c.ar.list_docker_images(parent=REPO)] == [["latest"]]
    sim.fault("permission_denied", method="ListDockerImages")
    with pytest.raises(exceptions.PermissionDenied, match="artifactregistry.dockerimages.list"):
        list(c.ar.list_docker_images(parent=REPO))
    sim.fault("unavailable", method="GetRepository")
    with pytest.raises(exceptions.ServiceUnavailable):
        c.ar.get_repository(name=REPO)
    assert c.ar.get_repository(name=REPO).name == REPO


# ---- Cloud Build ----------------------------------------------------------------------------------
def tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


SOURCE = {"docker/cluster/Dockerfile": DOCKERFILE, "requirements.txt": "jax\n"}


def docker_build(
    images: list[str], dockerfile: str = "docker/cluster/Dockerfile", bucket: str = "src"
) -> cb.Build:
    args = ["build", *[a for i in images for a in ("-t", i)], "-f", dockerfile, "."]
    return cb.Build(
        source=cb.Source(storage_source=cb.StorageSource(bucket=bucket, object_="source.tgz")),
        steps=[cb.BuildStep(name="gcr.io/cloud-builders/docker", args=args)],
        images=images,
    )


def run(c: Clients, build: cb.Build) -> tuple[cb.Build, Exception | None]:
    """Create and wait through the LRO; the final build and the exception the result raised, if any."""
    op = c.cb.create_build(project_id=PROJECT, build=build)
    first = op.metadata.build
    assert first.status == Status.QUEUED and first.log_url and first.id
    try:
        op.result(timeout=20)
        error = None
    except exceptions.GoogleAPICallError as e:
        error = e
    return c.cb.get_build(project_id=PROJECT, id=first.id), error


def log_of(sim: SimServer, build: cb.Build) -> str:
    bucket = build.logs_bucket.removeprefix("gs://")
    data = sim.objects.read(bucket, f"log-{build.id}.txt")
    assert data is not None
    return data.decode()


def test_a_build_pushes_to_every_region_and_the_registry_lists_it(sim: SimServer, c: Clients) -> None:
    make_repo(c)
    make_repo(c, "europe-west4")
    sim.objects.write("src", "source.tgz", tarball(SOURCE))
    images = [
        f"{IMAGE}:latest",
        f"{IMAGE}:abc1234",
        f"europe-west4-docker.pkg.dev/{PROJECT}/marin/cluster:abc1234",
    ]
    seen: list[int] = []
    op = c.cb.create_build(project_id=PROJECT, build=docker_build(images))
    build_id = op.metadata.build.id
    assert op.operation.name.startswith(f"operations/build/{PROJECT}/")
    while not op.done(retry=None):
        seen.append(c.cb.get_build(project_id=PROJECT, id=build_id).status)
        time.sleep(0.01)
    done = op.result(timeout=10)
    assert done.status == Status.SUCCESS and Status.SUCCESS not in seen[:1]
    assert seen[0] in (Status.QUEUED, Status.WORKING)
    assert {i.name for i in done.results.images} == set(images)
    assert len({i.digest for i in done.results.images}) == 1  # one image, three names
    digest = done.results.images[0].digest
    listed = {tuple(sorted(i.tags)): i.uri.rsplit("@", 1)[-1] for i in c.ar.list_docker_images(parent=REPO)}
    assert listed == {("abc1234", "latest"): digest}
    eu = list(c.ar.list_docker_images(parent=f"projects/{PROJECT}/locations/europe-west4/repositories/marin"))
    assert [list(i.tags) for i in eu] == [["abc1234"]]
    text = log_of(sim, done)
    assert "FETCHSOURCE" in text and "Step 2/5 : FROM $BASE" in text and text.rstrip().endswith("DONE")
    assert c.cb.list_builds(project_id=PROJECT).builds[0].id == build_id


@pytest.mark.parametrize(
    "files, dockerfile, images, failure, message",
    [
        ({"Dockerfile": "FROM x\n"}, "docker/cluster/Dockerfile", None, "USER_BUILD_STEP", "lstat"),
        ({"Dockerfile": "RUN echo hi\nFROM x\n"}, "Dockerfile", None, "USER_BUILD_STEP", "no build stage"),
        (
            {"Dockerfile": "FROM x\nFETCH y\n"},
            "Dockerfile",
            None,
            "USER_BUILD_STEP",
            "unknown instruction: FETCH",
        ),
        ({"Dockerfile": "FROM x\nCOPY missing.txt /\n"}, "Dockerfile", None, "USER_BUILD_STEP", "not found"),
        ({"Dockerfile": "FROM x\nCOPY ../etc/passwd /\n"}, "Dockerfile", None, "USER_BUILD_STEP", "outside"),
        ({"Dockerfile": "FROM x\n"}, "Dockerfile", [f"{IMAGE}:other"], "PUSH_IMAGE_NOT_FOUND", "other"),
        (
            {"Dockerfile": "FROM x\n"},
            "Dockerfile",
            [f"us-west4-docker.pkg.dev/{PROJECT}/marin/cluster:latest"],
            "PUSH_FAILED",
            "not found",
        ),
    ],
)
def test_what_a_real_build_refuses(
    sim: SimServer,
    c: Clients,
    files: dict[str, str],
    dockerfile: str,
    images: list[str] | None,
    failure: str,
    message: str,
) -> None:
    make_repo(c)
    sim.objects.write("src", "source.tgz", tarball(files))
    build = docker_build([f"{IMAGE}:latest"], dockerfile)
    if images is not None:
        build.steps[0].args = ["build", *[a for i in images for a in ("-t", i.replace(":other", ":x"))], "."]
        if failure == "PUSH_FAILED":
            build.steps[0].args = ["build", "-t", images[0], "."]
        build.images = images
    done, error = run(c, build)
    assert isinstance(error, exceptions.Unknown) and "Build failed" in str(error)
    assert done.status == Status.FAILURE and done.failure_info.type_.name == failure
    assert message in log_of(sim, done) + done.status_detail
    assert list(c.ar.list_docker_images(parent=REPO)) == []


def test_build_source_missing_cancel_and_bad_requests(sim: SimServer, c: Clients) -> None:
    done, _ = run(c, docker_build([f"{IMAGE}:latest"], bucket="nowhere"))
    assert done.failure_info.type_ == cb.Build.FailureInfo.FailureType.FETCH_SOURCE_FAILED
    with pytest.raises(exceptions.InvalidArgument, match="at least one step"):
        c.cb.create_build(project_id=PROJECT, build=cb.Build())
    with pytest.raises(exceptions.InvalidArgument, match="_UNUSED"):
        c.cb.create_build(
            project_id=PROJECT,
            build=cb.Build(
                steps=[cb.BuildStep(name="docker", args=["version"])], substitutions={"_UNUSED": "x"}
            ),
        )
    sim.state.latency = Latency(build_queue_s=30)
    op = c.cb.create_build(project_id=PROJECT, build=docker_build([f"{IMAGE}:latest"]))
    cancelled = c.cb.cancel_build(project_id=PROJECT, id=op.metadata.build.id)
    assert cancelled.status == Status.CANCELLED
    with pytest.raises(exceptions.Cancelled):
        op.result(timeout=10)


def test_build_faults_failure_with_log_tail_permission_and_503(sim: SimServer, c: Clients) -> None:
    make_repo(c)
    sim.objects.write("src", "source.tgz", tarball(SOURCE))
    sim.fault("build_failure", message="Collecting jax\nERROR: No matching distribution found for jax==99")
    done, error = run(c, docker_build([f"{IMAGE}:latest"]))
    assert error is not None and done.status == Status.FAILURE
    assert done.failure_info.type_ == cb.Build.FailureInfo.FailureType.USER_BUILD_STEP
    tail = log_of(sim, done).splitlines()[-3:]
    assert tail[:2] == [
        "Step #0: Collecting jax",
        "Step #0: ERROR: No matching distribution found for jax==99",
    ]
    assert tail[-1].startswith('ERROR: build step 0 "gcr.io/cloud-builders/docker" failed')
    sim.fault("permission_denied", method="CreateBuild")
    with pytest.raises(exceptions.PermissionDenied, match="cloudbuild.builds.create"):
        c.cb.create_build(project_id=PROJECT, build=docker_build([f"{IMAGE}:latest"]))
    sim.fault("unavailable", method="CreateBuild")
    with pytest.raises(exceptions.ServiceUnavailable):
        c.cb.create_build(project_id=PROJECT, build=docker_build([f"{IMAGE}:latest"]))
    done, error = run(c, docker_build([f"{IMAGE}:latest"]))
    assert error is None and done.status == Status.SUCCESS


def test_build_source_from_fake_gcs_server(tmp_path: Path) -> None:
    with GcsEmulator() as gcs:
        gcs.create_bucket("src")
        objects = gcs_objects_at(gcs.url)
        objects.write("src", "source.tgz", tarball(SOURCE))
        with SimServer(latency=FAST, objects=objects) as server:
            c = Clients(server.address)
            make_repo(c)
            gcs.create_bucket(f"{PROJECT}.cloudbuild-logs.googleusercontent.com")
            done, error = run(c, docker_build([f"{IMAGE}:latest"]))
            assert error is None and done.status == Status.SUCCESS
            assert b"DONE" in (
                objects.read(f"{PROJECT}.cloudbuild-logs.googleusercontent.com", f"log-{done.id}.txt") or b""
            )
            c.channel.close()


def test_process_mode_serves_every_service_and_its_control(tmp_path: Path) -> None:
    state_dir = tmp_path / "sim"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.sim", f"--state-dir={state_dir}", "--queue-s=0.05", "--provision-s=0.05"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not (state_dir / "sim.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the simulator did not start"
            time.sleep(0.05)
        info = json.loads((state_dir / "sim.json").read_text())
        assert info["buckets_dir"] == str(state_dir / "buckets")
        control = SimControl(info["control_url"])
        control.seed_secrets(PROJECT, {"ray-token": "tok"})
        c = Clients(info["address"])
        assert c.sm.access_secret_version(name=f"{SECRET}/versions/latest").payload.data == b"tok"
        make_repo(c)
        control.add_fault(FaultKind.PERMISSION_DENIED, method="GetRepository")
        with pytest.raises(exceptions.PermissionDenied):
            c.ar.get_repository(name=REPO)
        state = control.state()
        assert state["secrets"] == {SECRET: {"1": "ENABLED"}} and REPO in state["images"]
        assert control.run_cleanup() == {}
        c.channel.close()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()
    assert (state_dir / "secrets.json").exists() and (state_dir / "artifacts.json").exists()
