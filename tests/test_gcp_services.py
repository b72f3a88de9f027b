"""ops.gcp's Secret Manager, Cloud Build and Artifact Registry clients against the simulator through the
real google-cloud clients: typed results, transient errors (503) retried, permission denied reported with
the role to grant, a failed build reported with its log's tail, no secret value in any error or log, and
the Context handing them out for the local cluster through its driver and its simulator process."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretBytes

from ops.context import Context
from ops.errors import OpsError, Refused
from ops.gcp import common
from ops.gcp.artifacts import ArtifactsApi, CleanupRule, artifacts_client
from ops.gcp.build import BuildApi, BuildFailed, builds_client, pack_source
from ops.gcp.objects import DirObjects
from ops.gcp.secrets import ACCESSOR, SecretsApi, secrets_client
from ops.registry import Cluster
from ops.sim import Latency, SimServer

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "proj"
TOKEN = "tok-5f3a9c1e-never-print-me"
REGIONS = ("us-central2", "europe-west4")
FAST_RETRY = common.retry(deadline_s=1.5, initial_s=0.01, maximum_s=0.05)
DOCKERFILE = "\n".join(
    [
        "FROM rayproject/ray:2.60.0-py311",
        "COPY requirements.txt /tmp/",
        "RUN pip install -r /tmp/requirements.txt",
    ]
)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimServer]:
    with SimServer(latency=Latency(build_queue_s=0.02, build_s=0.02), buckets_dir=tmp_path / "buckets") as s:
        yield s


@pytest.fixture
def secrets(sim: SimServer) -> Iterator[SecretsApi]:
    client, channel = secrets_client(sim.address)
    api = SecretsApi(client, PROJECT, retry=FAST_RETRY, channel=channel)
    yield api
    api.close()


@pytest.fixture
def artifacts(sim: SimServer) -> Iterator[ArtifactsApi]:
    client, channel = artifacts_client(sim.address)
    api = ArtifactsApi(client, PROJECT, retry=FAST_RETRY, channel=channel)
    yield api
    api.close()


@pytest.fixture
def builds(sim: SimServer) -> Iterator[BuildApi]:
    client, channel = builds_client(sim.address)
    api = BuildApi(client, PROJECT, sim.objects, retry=FAST_RETRY, poll_s=0.02, channel=channel)
    yield api
    api.close()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "docker" / "cluster").mkdir(parents=True)
    (root / "docker" / "cluster" / "Dockerfile").write_text(DOCKERFILE)
    (root / "requirements.txt").write_text("jax\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "notes.txt").write_text("private\n")
    (root / ".dockerignore").write_text("notes.txt\n")
    return root


# ---- Secret Manager -------------------------------------------------------------------------------
def test_alice_stores_a_token_and_reads_each_version(secrets: SecretsApi) -> None:
    assert secrets.create("ray-token") is True
    assert secrets.create("ray-token") is False  # idempotent
    v1 = secrets.add_version("ray-token", TOKEN)
    v2 = secrets.add_version("ray-token", SecretBytes(b"second"))
    assert (v1.version, v2.version, v2.state) == ("1", "2", "ENABLED")
    value = secrets.access("ray-token")
    assert value.get_secret_value() == b"second" and "second" not in repr(value)
    assert secrets.access("ray-token", 1).get_secret_value() == TOKEN.encode()
    assert secrets.version("ray-token").version == "2"  # `latest` resolved to its number
    secrets.disable("ray-token", 2)
    with pytest.raises(Refused, match="version latest is disabled"):
        secrets.access("ray-token")
    assert secrets.access("ray-token", 1).get_secret_value() == TOKEN.encode()
    secrets.enable("ray-token", 2)
    assert secrets.destroy("ray-token", 1).state == "DESTROYED"
    with pytest.raises(Refused, match="destroyed"):
        secrets.access("ray-token", 1)
    assert [(v.version, v.state) for v in secrets.versions("ray-token")] == [
        ("2", "ENABLED"),
        ("1", "DESTROYED"),
    ]
    assert secrets.versions("nope") == [] and secrets.version("nope") is None and not secrets.exists("nope")
    with pytest.raises(OpsError, match="does not exist"):
        secrets.add_version("nope", "x")


def test_secret_503_is_retried_and_permission_denied_names_the_role(
    sim: SimServer, secrets: SecretsApi
) -> None:
    secrets.create("ray-token")
    secrets.add_version("ray-token", TOKEN)
    sim.fault("unavailable", method="AccessSecretVersion", times=3)
    assert secrets.access("ray-token").get_secret_value() == TOKEN.encode()
    sim.fault("permission_denied", method="AccessSecretVersion")
    with pytest.raises(Refused) as denied:
        secrets.access("ray-token")
    assert "no permission to read secret ray-token" in denied.value.reason and ACCESSOR in denied.value.hint
    sim.fault("unavailable", method="AddSecretVersion", times=None)
    with pytest.raises(OpsError, match="kept failing transiently"):
        secrets.add_version("ray-token", TOKEN)


def test_a_secret_value_reaches_no_error_and_no_log(
    sim: SimServer, secrets: SecretsApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets.create("ray-token")
    seen: list[str] = []
    attempts = [
        lambda: secrets.add_version("ray-token", TOKEN),
        lambda: secrets.access("ray-token"),
        lambda: secrets.add_version("missing", TOKEN),
        lambda: secrets.access("ray-token", 7),
    ]
    for kind in ("permission_denied", "unavailable", None):
        for attempt in attempts:
            if kind is not None:
                sim.fault(kind, times=None)
            try:
                seen.append(repr(attempt()))
            except OpsError as e:
                seen += [str(e), repr(e), e.reason, e.hint]
            sim.state.faults.clear()
    secrets.disable("ray-token", 1)
    for attempt in attempts[1:]:
        try:
            seen.append(repr(attempt()))
        except OpsError as e:
            seen += [str(e), e.hint]
    text = "\n".join(seen) + caplog.text
    assert "no permission" in text and "kept failing" in text and "disabled" in text
    assert TOKEN not in text and TOKEN[:12] not in text


# ---- Artifact Registry and Cloud Build ------------------------------------------------------------
def test_pack_source_leaves_out_git_and_dockerignored_files(source: Path) -> None:
    import io
    import tarfile

    data = pack_source(source)
    assert data == pack_source(source)  # the same files, the same bytes
    names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert sorted(names) == [".dockerignore", "docker/cluster/Dockerfile", "requirements.txt"]


def test_bob_builds_the_image_for_every_region(
    artifacts: ArtifactsApi, builds: BuildApi, source: Path, sim: SimServer
) -> None:
    for region in REGIONS:
        repo = artifacts.ensure_repository(region, "marin", "cluster images")
        assert repo.registry_uri == f"{region}-docker.pkg.dev/{PROJECT}/marin" and repo.format == "DOCKER"
    assert artifacts.ensure_repository(REGIONS[0], "marin").name == repo.name.replace(REGIONS[1], REGIONS[0])
    obj = builds.upload_source(source, "clusterbot-builds")
    assert builds.upload_source(source, "clusterbot-builds") == obj  # unchanged source: the same object
    images = [
        f"{r}-docker.pkg.dev/{PROJECT}/marin/cluster:{t}" for r in REGIONS for t in ("latest", "abc1234")
    ]
    started = builds.docker_build("clusterbot-builds", obj, images, dockerfile="docker/cluster/Dockerfile")
    assert started.status == "QUEUED" and started.log_url
    sim.fault("unavailable", method="GetBuild", times=2)  # polls ride over 503s
    statuses: list[str] = []
    done = builds.wait(started.id, timeout_s=20, progress=lambda b: statuses.append(b.status))
    assert done.status == "SUCCESS" and statuses[-1] == "SUCCESS" and done.finish_time is not None
    assert sorted(i.name for i in done.images) == sorted(images)
    digest = done.images[0].digest
    for region in REGIONS:
        assert artifacts.tags(region, "marin", "cluster") == {"latest": digest, "abc1234": digest}
        [image] = artifacts.images(region, "marin")
        assert image.image == "cluster" and image.digest == digest and image.tags == ["abc1234", "latest"]
    assert builds.log_tail(done, 1) == ["DONE"]


def test_cleanup_rules_round_trip_and_faults(sim: SimServer, artifacts: ArtifactsApi) -> None:
    artifacts.ensure_repository(REGIONS[0], "marin")
    rules = [
        CleanupRule(id="delete-old", action="DELETE", tag_state="ANY", older_than_s=30 * 86400),
        CleanupRule(id="keep-newest", action="KEEP", keep_count=16),
        CleanupRule(id="keep-pinned", action="KEEP", tag_prefixes=["abc1234", "def5678"]),
    ]
    sim.fault("unavailable", method="UpdateRepository")
    repo = artifacts.set_cleanup(REGIONS[0], "marin", rules)
    assert sorted(repo.cleanup, key=lambda r: r.id) == sorted(rules, key=lambda r: r.id)
    assert artifacts.get_repository(REGIONS[0], "marin").cleanup == repo.cleanup
    assert artifacts.get_repository(REGIONS[1], "marin") is None
    sim.fault("permission_denied", method="UpdateRepository")
    with pytest.raises(Refused, match="no permission to set the cleanup policies") as denied:
        artifacts.set_cleanup(REGIONS[0], "marin", rules)
    assert "roles/artifactregistry.repoAdmin" in denied.value.hint
    with pytest.raises(OpsError, match="no repository marin in europe-west4"):
        artifacts.images(REGIONS[1], "marin")


def test_a_failed_build_reports_its_log_tail_and_permission(
    sim: SimServer, artifacts: ArtifactsApi, builds: BuildApi, source: Path
) -> None:
    artifacts.ensure_repository(REGIONS[0], "marin")
    obj = builds.upload_source(source, "clusterbot-builds")
    image = f"{REGIONS[0]}-docker.pkg.dev/{PROJECT}/marin/cluster:latest"
    sim.fault(
        "build_failure", message="Collecting jax==99\nERROR: No matching distribution found for jax==99"
    )
    started = builds.docker_build("clusterbot-builds", obj, [image], dockerfile="docker/cluster/Dockerfile")
    with pytest.raises(BuildFailed) as failed:
        builds.wait(started.id, timeout_s=20)
    assert failed.value.build.status == "FAILURE" and failed.value.build.failure == "USER_BUILD_STEP"
    assert "Step #0: ERROR: No matching distribution found for jax==99" in failed.value.log_tail
    assert "No matching distribution" in failed.value.hint and started.log_url in failed.value.hint
    # A Dockerfile the build cannot find fails the same way, with Docker's words in the tail.
    started = builds.docker_build("clusterbot-builds", obj, [image], dockerfile="Dockerfile.missing")
    with pytest.raises(BuildFailed) as failed:
        builds.wait(started.id, timeout_s=20)
    assert any("no such file or directory" in line for line in failed.value.log_tail)
    assert artifacts.tags(REGIONS[0], "marin", "cluster") == {}
    sim.fault("permission_denied", method="CreateBuild")
    with pytest.raises(Refused) as denied:
        builds.docker_build("clusterbot-builds", obj, [image])
    assert "roles/cloudbuild.builds.editor" in denied.value.hint
    sim.fault("unavailable", method="CreateBuild")  # a 503 before success: retried
    assert builds.docker_build("clusterbot-builds", obj, [image], dockerfile="docker/cluster/Dockerfile").id


# ---- the Context, for the local cluster ----------------------------------------------------------
def test_context_hands_out_the_local_clusters_simulated_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CLUSTERBOT_HOME", str(home))
    cluster = Cluster(
        name="local",
        ray_cluster_name="clusterbot-local-test",
        driver="local",
        project="local",
        region="local-sim",
        zone="local-sim-a",
        tpu_generation="v4",
        worker_tpu_type="v4-8",
        min_workers=0,
        max_workers=1,
        head_machine_type="this machine",
        dashboard_url="http://127.0.0.1:8265",
    )
    ctx = Context(store=object(), registry=object())  # type: ignore[arg-type]
    sim_dir = ctx.driver(cluster).sim_dir  # type: ignore[attr-defined]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.sim", f"--state-dir={sim_dir}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not (sim_dir / "sim.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the simulator did not start"
            time.sleep(0.05)
        secrets = ctx.secrets(cluster)
        assert ctx.secrets(cluster) is secrets
        secrets.create("ray-token")
        secrets.add_version("ray-token", TOKEN)
        assert secrets.access("ray-token").get_secret_value() == TOKEN.encode()
        builds = ctx.builds(cluster)
        info = json.loads((sim_dir / "sim.json").read_text())
        assert isinstance(builds.objects, DirObjects) and builds.objects.root == Path(info["buckets_dir"])
        ctx.artifacts(cluster).ensure_repository("local-sim", "clusterbot")
        obj = builds.upload_source(source, "local-builds")
        image = "local-sim-docker.pkg.dev/local/clusterbot/cluster:latest"
        builds.poll_s = 0.1
        started = builds.docker_build("local-builds", obj, [image], dockerfile="docker/cluster/Dockerfile")
        assert builds.wait(started.id, timeout_s=30).status == "SUCCESS"
        assert list(ctx.artifacts(cluster).tags("local-sim", "clusterbot", "cluster")) == ["latest"]
    finally:
        ctx.close()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
