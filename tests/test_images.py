"""build-image and set-registry-cleanup (ops/images.py) through the real Cloud Build and Artifact Registry
clients against the simulator, on the repository's own registry (seven GCP clusters in six regions):
one build pushed to every region under its tags and pinned in the store; a failed build reports its
log's tail and pins nothing; a 503 is retried; permission denied names the role; the next start renders
the pinned image while the committed configs stay the registry's; cleanup never deletes a pinned or
running tag; and /build-image through the engine with its progress and report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from bot.adapters.recorder import Recorder
from bot.config import BotConfig, Rights, Windows
from bot.operations import build_image as build_image_op
from bot.protocol.engine import Engine
from bot.protocol.model import State, User
from ops.cli import Out
from ops.cli_images import add_commands
from ops.configs import INFRA_DIR, update_configs
from ops.context import Context
from ops.drivers.gcp import GcpDriver, RunResult
from ops.errors import BadInput, OpsError, Refused
from ops.gcp import common
from ops.gcp.artifacts import CleanupRule
from ops.gcp.build import BuildFailed
from ops.images import (
    DELETE_OLD,
    KEEP_NEWEST,
    KEEP_PINNED,
    REVISION_ENV,
    Settings,
    behind,
    build_image,
    git_revision,
    pins,
    render_for_start,
    set_registry_cleanup,
    started,
)
from ops.registry import Cluster, Registry, load_registry
from ops.sim import Latency, SimServer
from ops.store import LocalStore

REGIONS = ["europe-west4", "us-central1", "us-central2", "us-east1", "us-east5", "us-west4"]
GCP_CLUSTERS = ["us-central2", "us-west4", "eu-west4", "us-east5", "us-east1", "us-central1", "big-run"]
REPO, IMAGE = "marin", "marin_cluster"
NOW = datetime(2026, 11, 23, 10, 15, 0, tzinfo=UTC)
FAST_RETRY = common.retry(deadline_s=5, initial_s=0.01, maximum_s=0.05)
DOCKERFILE = "\n".join(
    [
        "FROM rayproject/ray:2.60.0-py311",
        "COPY requirements.txt /tmp/",
        "RUN pip install -r /tmp/requirements.txt",
        "",
    ]
)
ALICE = User(id="alice", name="alice")


class SimCloud:
    """Where a cluster's Google APIs answer (the simulator) and its buckets live: all a driver tells the
    Context for builds; build-image starts and stops nothing."""

    def __init__(self, cluster: Cluster, sim: SimServer, sim_dir: Path) -> None:
        self.cluster, self.sim, self.sim_dir = cluster, sim, sim_dir

    def tpu_endpoint(self) -> str:
        return self.sim.address

    def close(self) -> None:
        pass


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimServer]:
    with SimServer(latency=Latency(build_queue_s=0.02, build_s=0.02), buckets_dir=tmp_path / "buckets") as s:
        yield s


@pytest.fixture
def registry() -> Registry:
    return load_registry(INFRA_DIR / "clusters.yaml")


@pytest.fixture
def ctx(sim: SimServer, registry: Registry, tmp_path: Path) -> Iterator[Context]:
    sim_dir = tmp_path / "sim"
    sim_dir.mkdir()
    (sim_dir / "sim.json").write_text(json.dumps({"buckets_dir": str(sim.buckets_dir)}))
    context = Context(
        LocalStore(tmp_path / "store"), registry, driver_factory=lambda c: SimCloud(c, sim, sim_dir)
    )
    for cluster in registry.clusters.values():  # short polls and retries: the simulator answers at once
        builds, artifacts = context.builds(cluster), context.artifacts(cluster)
        builds.poll_s, builds.retry, artifacts.retry = 0.02, FAST_RETRY, FAST_RETRY
    yield context
    context.close()


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    root = tmp_path / "src"
    (root / "docker" / "cluster").mkdir(parents=True)
    (root / "docker" / "cluster" / "Dockerfile").write_text(DOCKERFILE)
    (root / "requirements.txt").write_text("jax\n")
    monkeypatch.setenv(REVISION_ENV, "abc1234")  # as the bot's image bakes it in
    return Settings(context=root)


def tags(ctx: Context, region: str) -> dict[str, str]:
    return ctx.artifacts(ctx.cluster("us-central2")).tags(region, REPO, IMAGE)


# ---- build-image -----------------------------------------------------------------------------------
def test_bob_builds_once_for_every_region_and_the_tag_is_pinned(
    ctx: Context, sim: SimServer, settings: Settings
) -> None:
    sim.state.latency = Latency(build_queue_s=0.02, build_s=1.0)  # long enough for a poll to see it work
    sim.fault("unavailable", method="CreateBuild")  # a 503 starting the build: retried
    sim.fault("unavailable", method="GetBuild", times=2)  # and while following it
    lines: list[str] = []
    result = build_image(ctx, "bob", progress=lines.append, settings=settings, now=NOW)
    pin_tag = "abc1234-20261123-101500"
    assert result.tags == ["latest", "abc1234", "20261123", pin_tag] and len(result.builds) == 1
    assert sorted(k.split("/")[1] for k in result.pins) == REGIONS
    digest = result.pins["hai-gcp-models/us-central2"].digest
    assert digest.startswith("sha256:")
    for region in REGIONS:  # one build: the same digest under every tag in every region
        assert tags(ctx, region) == {t: digest for t in result.tags}
    stored = pins(ctx).regions
    assert stored == result.pins and stored["hai-gcp-models/us-east5"].by == "bob"
    assert stored["hai-gcp-models/us-east5"].ref == (
        f"us-east5-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:{pin_tag}@{digest}"
    )
    assert any(line.endswith("QUEUED in hai-gcp-models") for line in lines)
    assert any(line.endswith(" WORKING") for line in lines) and any(
        line.endswith(" SUCCESS") for line in lines
    )
    assert lines[-1] == f"pinned {pin_tag} for {', '.join(REGIONS)}"
    assert sorted(result.to_restart) == sorted(GCP_CLUSTERS)  # nothing restarted; all take it next time
    assert "nothing was restarted" in result.summary() and "us-east5 (/restart us-east5)" in result.summary()


def test_the_next_start_renders_the_pin_and_the_committed_configs_stay_the_registrys(
    ctx: Context, registry: Registry, settings: Settings
) -> None:
    cluster = ctx.cluster("us-central2")
    committed = (INFRA_DIR / "us-central2.yaml").read_text()
    assert render_for_start(ctx, cluster) == committed  # no pin yet: the registry's `latest`
    assert started(ctx, "us-central2").tag == "latest"
    result = build_image(ctx, "bob", regions=["us-central2"], settings=settings, now=NOW)
    pin = result.pins["hai-gcp-models/us-central2"]
    assert behind(ctx, ["us-central2", "big-run"]) == ["us-central2", "big-run"]
    text = render_for_start(ctx, cluster)
    assert text is not None and yaml.safe_load(text)["docker"]["image"] == pin.ref
    assert [a for a, b in zip(committed.splitlines(), text.splitlines(), strict=True) if a != b] == [
        '  image: "us-central2-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:latest"'
    ]
    assert started(ctx, "us-central2").digest == pin.digest and behind(ctx, ["us-central2"]) == []
    # Another region was not built: its clusters start as before.
    east = ctx.cluster("us-east5")
    assert yaml.safe_load(render_for_start(ctx, east) or "")["docker"]["image"].endswith(":latest")
    # The local cluster has no generated config; its start is recorded all the same.
    assert render_for_start(ctx, ctx.cluster("local")) is None and started(ctx, "local") is not None
    assert update_configs(registry, check=True).ok  # what update-configs --check compares is unchanged


def test_a_failed_build_reports_its_log_tail_and_pins_nothing(
    ctx: Context, sim: SimServer, settings: Settings
) -> None:
    sim.fault(
        "build_failure", message="Collecting jax==99\nERROR: No matching distribution found for jax==99"
    )
    with pytest.raises(BuildFailed) as failed:
        build_image(ctx, "bob", settings=settings, now=NOW)
    assert "No matching distribution found for jax==99" in failed.value.hint
    assert pins(ctx).regions == {} and tags(ctx, "us-east5") == {}
    sim.fault("permission_denied", method="CreateBuild")
    with pytest.raises(Refused) as denied:
        build_image(ctx, "bob", settings=settings, now=NOW)
    assert "roles/cloudbuild.builds.editor" in denied.value.hint and pins(ctx).regions == {}
    with pytest.raises(BadInput, match="no cluster is in region mars") as bad:
        build_image(ctx, "bob", regions=["mars"], settings=settings)
    assert "us-east5" in bad.value.hint


def test_the_revision_comes_from_git_when_nothing_is_baked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REVISION_ENV, raising=False)
    with pytest.raises(OpsError, match="git revision .* is unknown"):
        git_revision(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "Dockerfile").write_text(DOCKERFILE)

    def git(*args: str) -> str:
        argv = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(
            argv, cwd=repo, check=True, capture_output=True, text=True, timeout=20
        ).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "image")
    sha = git("rev-parse", "--short", "HEAD")
    assert git_revision(repo) == sha
    (repo / "Dockerfile").write_text(DOCKERFILE + "RUN true\n")
    assert git_revision(repo) == f"{sha}-dirty"
    monkeypatch.setenv(REVISION_ENV, "not a sha")
    with pytest.raises(BadInput):
        git_revision(repo)


# ---- cleanup ---------------------------------------------------------------------------------------
def test_cleanup_never_deletes_a_pinned_or_running_tag(
    ctx: Context, sim: SimServer, settings: Settings
) -> None:
    settings = settings.model_copy(update={"keep_count": 2})
    art = ctx.artifacts(ctx.cluster("us-central2"))
    art.ensure_repository("us-central2", REPO)
    team = CleanupRule(id="team-keep-releases", action="KEEP", tag_prefixes=["release-"])
    art.set_cleanup("us-central2", REPO, [team])
    builds = [
        build_image(ctx, "bob", regions=["us-central2"], settings=settings, now=NOW + timedelta(hours=i))
        for i in range(2)
    ]
    first = builds[0].pins["hai-gcp-models/us-central2"]
    render_for_start(ctx, ctx.cluster("us-central2"))  # us-central2 now runs the second build
    render_for_start(ctx, ctx.cluster("big-run"))
    # big-run is restarted no more: it keeps running the second build while two more are pushed.
    result = set_registry_cleanup(ctx, regions=["us-central2"], settings=settings)
    [repo] = result.repositories
    second_tag = "abc1234-20261123-111500"
    assert repo.kept_tags == [second_tag] and repo.others == ["team-keep-releases"]
    for i in (2, 3):
        build_image(ctx, "bob", regions=["us-central2"], settings=settings, now=NOW + timedelta(hours=i))
    rules = {r.id: r for r in art.get_repository("us-central2", REPO).cleanup}
    assert set(rules) == {"team-keep-releases", KEEP_PINNED, KEEP_NEWEST, DELETE_OLD}
    newest_tag = "abc1234-20261123-131500"
    assert rules[KEEP_PINNED].tag_prefixes == [second_tag, newest_tag]  # refreshed by the builds
    assert rules[KEEP_NEWEST].keep_count == 2 and rules[DELETE_OLD].older_than_s == 30 * 86400
    assert rules[DELETE_OLD].tag_state == "ANY" and rules["team-keep-releases"] == team
    before = art.images("us-central2", REPO, IMAGE)
    assert len(before) == 4
    deleted = sim.artifacts.run_cleanup(now=datetime.now(UTC) + timedelta(days=40))
    [gone] = next(iter(deleted.values()))
    assert gone == f"{IMAGE}@{first.digest}"  # neither pinned, running, nor among the newest 2
    left = {t for i in art.images("us-central2", REPO, IMAGE) for t in i.tags}
    assert {second_tag, newest_tag, "abc1234-20261123-121500", "latest"} <= left
    assert first.tag not in left


def test_cleanup_dry_run_and_permission(ctx: Context, sim: SimServer, settings: Settings) -> None:
    result = set_registry_cleanup(ctx, regions=["us-east5", "eu-west4".replace("eu", "europe")], dry_run=True)
    assert [r.region for r in result.repositories] == ["europe-west4", "us-east5"]
    assert all(r.dry_run and r.kept_tags == [] for r in result.repositories)
    repo = ctx.artifacts(ctx.cluster("us-east5")).get_repository("us-east5", REPO)
    assert (
        repo is not None
        and repo.cleanup_dry_run
        and {r.id for r in repo.cleanup} == {KEEP_NEWEST, DELETE_OLD}
    )
    sim.fault("permission_denied", method="UpdateRepository")
    with pytest.raises(Refused) as denied:
        set_registry_cleanup(ctx, regions=["us-east5"])
    assert "roles/artifactregistry.repoAdmin" in denied.value.hint


# ---- the CLI commands --------------------------------------------------------------------------------
def run_cli(ctx: Context, argv: list[str]) -> tuple[int, dict]:
    """The commands as `ops/cli.py` registers them (`add_commands(add)`), with this test's context."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, fn, help):  # noqa: ANN001, ANN202, A002 - the shape of ops/cli.py's add
        p = sub.add_parser(name, help=help)
        p.add_argument("--json", action="store_true")
        p.set_defaults(fn=fn, caller="carol")
        return p

    add_commands(add)
    args = parser.parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = args.fn(ctx, args, Out(args.json))
    return code, json.loads(stdout.getvalue())


def test_cli_build_image_and_set_registry_cleanup(
    ctx: Context, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ops.cli_images

    monkeypatch.setattr(ops.cli_images, "Settings", lambda **kw: settings.model_copy(update=kw))
    code, out = run_cli(ctx, ["build-image", "--regions", "us-east5,us-east1", "--json"])
    assert code == 0 and sorted(out["pins"]) == ["hai-gcp-models/us-east1", "hai-gcp-models/us-east5"]
    assert out["by"] == "carol" and out["to_restart"] == ["us-east1", "us-east5"]
    code, out = run_cli(ctx, ["set-registry-cleanup", "--regions", "us-east5", "--json"])
    [repo] = out["repositories"]
    assert code == 0 and repo["kept_tags"] == [pins(ctx).regions["hai-gcp-models/us-east5"].tag]


# ---- /build-image through the engine ------------------------------------------------------------------
async def until(predicate, timeout: float = 20.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await asyncio.sleep(0.02)


def engine_for(ctx: Context, chat: Recorder, settings: Settings) -> Engine:
    config = BotConfig(rights=Rights(admin_roles=["infra-admin"]), windows=Windows(tick_s=0.05))
    return Engine(ctx, config, chat, {"build-image": build_image_op.spec(settings)})


async def test_alice_builds_the_image_from_chat_with_progress_and_a_report(
    ctx: Context, settings: Settings
) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat, settings)
    r = await engine.request(ALICE, "build-image", "us-east5", {})
    assert not r.ok and "takes no cluster" in r.text
    r = await engine.request(ALICE, "build-image", None, {"regions": "mars"})
    assert not r.ok and "no cluster is in region mars" in r.text and chat.log == []
    r = await engine.request(ALICE, "build-image", None, {"regions": "us-central2, us-east5"})
    assert r.ok, r.text
    await until(lambda: len(chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    announcement, report = chat.new_posts()
    assert announcement.text.startswith("**alice** asks to **build-image**")
    assert "us-central2 (us-central2, big-run), us-east5 (us-east5)" in announcement.text
    assert "restarts nothing" in announcement.text and announcement.buttons == []
    assert op.state == State.DONE, op.error
    shown = chat.text(op.message_id)  # progress edited into the one announcement
    assert " QUEUED in hai-gcp-models" in shown and " SUCCESS" in shown and "pinned abc1234-" in shown
    assert report.text.startswith(f"build-image is done (`{op.op_id}`), asked by alice")
    assert "takes it at its next restart: us-central2 (/restart us-central2), big-run" in report.text
    assert pins(ctx).regions["hai-gcp-models/us-east5"].op == op.op_id
    # A Restart button per cluster behind: a click requests that restart (this engine offers none).
    buttons = [(b.action, b.arg) for b in report.buttons]
    assert buttons[:2] == [("restart", "us-central2"), ("restart", "big-run")]
    assert report.op_id == f"next:{op.op_id}"
    r = await engine.act(ALICE, report.op_id, "restart", "us-central2")
    assert not r.ok and r.text == "no operation 'restart'"


async def test_a_failed_build_from_chat_reports_the_log_tail(
    ctx: Context, sim: SimServer, settings: Settings
) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat, settings)
    sim.fault("build_failure", message="ERROR: No matching distribution found for jax==99")
    r = await engine.request(ALICE, "build-image", None, {"regions": "us-east5"})
    assert r.ok, r.text
    await until(lambda: len(chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    report = chat.new_posts()[-1]
    assert op.state == State.FAILED and report.mentions == ["alice"]
    assert "build-image FAILED" in report.text and "ended FAILURE (USER_BUILD_STEP)" in report.text
    assert "No matching distribution found for jax==99" in report.text
    assert "nothing was pinned" in report.text and pins(ctx).regions == {}


def test_a_build_image_run_again_follows_its_build_instead_of_starting_another(
    ctx: Context, sim: SimServer, settings: Settings
) -> None:
    class Died(Exception):
        pass

    def die_once_started(line: str) -> None:
        if " QUEUED in " in line:  # the bot goes down right after Cloud Build took the build
            raise Died

    with pytest.raises(Died):
        build_image(ctx, "bob", regions=["us-east5"], op="build-image-1", progress=die_once_started,
                    settings=settings, now=NOW)  # fmt: skip
    assert pins(ctx).regions == {} and len(sim.builds.summary()) == 1
    lines: list[str] = []
    result = build_image(ctx, "bob", regions=["us-east5"], op="build-image-1", progress=lines.append,
                         settings=settings, now=NOW + timedelta(minutes=5))  # fmt: skip
    [build_id] = sim.builds.summary()
    assert result.builds == [build_id] and f"following build {build_id}, started before" in lines
    assert result.pins["hai-gcp-models/us-east5"].tag == "abc1234-20261123-101500"  # the first run's tags


def test_the_build_image_command_takes_regions_and_no_cluster() -> None:
    from bot.adapters.cogs.images import Images

    command = Images.build_image
    assert command.name == "build-image" and [p.name for p in command.parameters] == ["regions"]
    assert command.parameters[0].required is False and "comma-separated" in command.parameters[0].description


def test_ray_up_of_a_gcp_cluster_runs_the_pinned_image(
    ctx: Context, sim: SimServer, registry: Registry, settings: Settings, tmp_path: Path
) -> None:
    """The driver's start (a restart's, `local up`'s) goes through `render_for_start`: `ray up` gets a
    private copy of the config naming the pinned image, never the committed `:latest`."""
    result = build_image(ctx, "bob", regions=["us-central2"], settings=settings, now=NOW)
    pin = result.pins["hai-gcp-models/us-central2"]
    central = ctx.cluster("us-central2").model_copy(update={"ssh_key": None})
    sim.secrets.seed("hai-gcp-models", {"RAY_AUTH_TOKEN": "tok-v1"})  # the token's pinned version
    given: dict[str, str] = {}

    def runner(argv, *, timeout, cwd):  # noqa: ANN001, ANN202 - Ray's CLI: keep what `ray up` was given
        given[argv[1]] = Path(argv[-1]).read_text()
        return RunResult(0, "")

    def driver(c: Cluster) -> GcpDriver:
        return GcpDriver(c, runner=runner, config_dir=INFRA_DIR, state_dir=tmp_path / "gcp")

    gcp = Context(ctx.store, registry, cloud_endpoint=lambda _: sim.address, driver_factory=driver)
    try:
        gcp.driver(central).start()
    finally:
        gcp.close()
    up = yaml.safe_load(given["up"])
    assert up["docker"]["image"] == pin.ref
    assert "versions access 1 --secret=RAY_AUTH_TOKEN" in given["up"]  # and the pinned token, as before
    assert started(ctx, "us-central2").tag == pin.tag


def test_the_dockerfile_is_the_one_the_registry_names(
    ctx: Context, registry: Registry, settings: Settings
) -> None:
    registry.dockerfile = "teams/ours.Dockerfile"
    with pytest.raises(BuildFailed, match="teams/ours.Dockerfile"):
        build_image(ctx, "bob", regions=["us-east5"], settings=settings, now=NOW)
    (settings.context / "teams").mkdir()
    (settings.context / "teams" / "ours.Dockerfile").write_text(DOCKERFILE)
    result = build_image(ctx, "bob", regions=["us-east5"], settings=settings, now=NOW + timedelta(minutes=1))
    assert "hai-gcp-models/us-east5" in result.pins
