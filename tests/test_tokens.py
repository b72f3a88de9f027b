"""The Ray token on the session's local cluster: its head runs with the version pinned for it in the
simulated Secret Manager; `rotate-token` rolls a new one out by a restart (jobs kept, the old token
refused, the old version disabled), resumes from a kill at each of its steps, and runs through the
engine with the recorder as chat; the token shows nowhere (output, store, journal, logs, chat)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.adapters.recorder import ManualClock, Recorder
from bot.protocol.model import State
from ops.context import Context
from ops.errors import OpsError
from ops.locks import current_lock
from ops.ray_api import RayApi, Reach
from ops.registry import Cluster, clusterbot_home, load_registry
from ops.store import open_store
from ops.tokens import read_pin
from tests.localray import Env, wait_for
from tests.test_bot_restart import ALICE, BOB, WINDOWS, make_engine, until
from tests.test_restart import check_survived, stage_jobs


def _ctx(ops_env: Env) -> Context:
    return Context(open_store(), load_registry(ops_env.registry))


def live(ops_env: Env, cluster: Cluster) -> tuple[str, str]:
    """(pinned version, its token), read as the CLI reads them."""
    ctx = _ctx(ops_env)
    try:
        token = ctx.token(cluster)
        return read_pin(ctx.store, cluster).version, token
    finally:
        ctx.close()


def reach(cluster: Cluster, token: str) -> Reach:
    return RayApi(cluster, token=lambda: token).probe(timeout=5)[0]


def version_state(ops_env: Env, cluster: Cluster, version: str) -> str:
    ctx = _ctx(ops_env)
    try:
        return ctx.secrets(cluster).version(cluster.token_secret, version).state
    finally:
        ctx.close()


def files_holding(token: str, *roots: Path) -> list[str]:
    """Every file under `roots` whose bytes contain `token`."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and token.encode() in path.read_bytes():
                found.append(str(path))
    return found


def check_never_shown(ops_env: Env, cluster: Cluster, *tokens: str, texts: str = "") -> None:
    """No token in the texts given (CLI output, chat), the store (records, journal, pins, backups) or
    the local cluster's logs (head, simulator, VMs)."""
    state = clusterbot_home() / "local" / cluster.name
    logs = [p for p in state.rglob("*.log")]
    for token in tokens:
        assert token not in texts
        assert files_holding(token, Path(open_store().url.removeprefix("file://")), *logs) == []


def check_rotated(ops_env: Env, cluster: Cluster, old: tuple[str, str]) -> tuple[str, str]:
    new = live(ops_env, cluster)
    assert new[0] != old[0] and new[1] != old[1]
    assert reach(cluster, new[1]) == Reach.OK
    assert reach(cluster, old[1]) == Reach.REFUSED
    assert version_state(ops_env, cluster, old[0]) == "DISABLED"
    assert RayApi(cluster).reachable()  # this machine's copy (the registry's token file) follows the pin
    return new


def test_rotate_token_keeps_every_job_and_refuses_the_old_token(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    old = live(ops_env, cluster)
    assert reach(cluster, old[1]) == Reach.OK  # the head runs with the pinned version
    ids = stage_jobs(cluster, tmp_path)

    t = time.monotonic()
    r = ops_env.ops("rotate-token", "--cluster", "local", "--as", "alice", "--yes")
    rotation_s = time.monotonic() - t

    assert r.code == 0, r
    assert "ops token --cluster local" in r.out and "is live" in r.out
    new = check_rotated(ops_env, cluster, old)
    check_survived(cluster, ids)
    assert current_lock(open_store(), "local") is None
    check_never_shown(ops_env, cluster, old[1], new[1], texts=r.out + r.err)

    # `ops token` writes it where Ray's CLI reads it; `--stdout` is for scripts.
    copy = tmp_path / "ray_token"
    got = ops_env.ops("token", "--cluster", "local", "--json", extra_env={"RAY_AUTH_TOKEN_PATH": str(copy)})
    assert got.code == 0, got and new[1] not in got.out + got.err
    assert got.json()["version"] == new[0]
    printed = ops_env.ops("token", "--cluster", "local", "--stdout")
    assert printed.code == 0 and printed.out.strip() == new[1]

    # What a rotation adds over a plain restart of the same cluster with the same jobs.
    t = time.monotonic()
    plain = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes")
    restart_s = time.monotonic() - t
    assert plain.code == 0, plain
    print(f"\nrotation {rotation_s:.1f}s, plain restart {restart_s:.1f}s: +{rotation_s - restart_s:.1f}s")


FAULTS = ["after:jobs_stopped", "token:live", "after:cluster_started", "resubmit:2", "token:verified"]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_rotation_killed_at_any_step_is_resumed(
    ops_env: Env, cluster: Cluster, tmp_path: Path, fault: str
) -> None:
    old = live(ops_env, cluster)
    ids = stage_jobs(cluster, tmp_path)

    killed = ops_env.ops("rotate-token", "--cluster", "local", "--as", "alice", "--yes",
                         extra_env={"CLUSTERBOT_FAULT": fault})  # fmt: skip
    assert killed.code == -9, killed
    wait_for(lambda: current_lock(open_store(), "local").expired(), 15, "the dead rotation's lease to expire")
    resumed = ops_env.ops("rotate-token", "--cluster", "local", "--as", "bob", "--resume", "--json")

    assert resumed.code == 0, resumed
    result = resumed.json()
    assert result["step"] == "done" and result["token"]["verified"] and result["token"]["old_disabled"]
    new = check_rotated(ops_env, cluster, old)
    check_survived(cluster, ids)
    check_never_shown(
        ops_env, cluster, old[1], new[1], texts=killed.out + killed.err + resumed.out + resumed.err
    )


def test_a_pin_to_a_token_the_head_does_not_run_is_refused_and_stops_nothing(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    from ops.tokens import write_pin

    version, _ = live(ops_env, cluster)
    ctx = _ctx(ops_env)
    wrong = ctx.secrets(cluster).add_version(cluster.token_secret, "a-token-no-head-runs-with").version
    write_pin(ctx.store, cluster, wrong, "test")
    try:
        r = ops_env.ops("restart", "--cluster", "local", "--as", "alice", "--yes")
    finally:
        write_pin(ctx.store, cluster, version, "test")
        ctx.secrets(cluster).disable(cluster.token_secret, wrong)
        ctx.close()
    assert r.code == 2, r
    assert "refused our token" in r.err and "Secret Manager" in r.err and "a-token-no-head" not in r.err
    assert current_lock(open_store(), "local") is None


async def test_rotate_token_in_chat_asks_bob_and_reports_the_new_version(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    old = live(ops_env, cluster)
    api = RayApi(cluster)
    bobs = api.submit(entrypoint="sleep 900", metadata={"user": "bob"})
    wait_for(lambda: api.status(bobs) == "RUNNING", 60, "bob's job to run")

    clock = ManualClock()
    engine = make_engine(ops_env, clock)
    chat: Recorder = engine.chat  # type: ignore[assignment]
    await engine.start()
    try:
        r = await engine.request(ALICE, "rotate-token", "local")
        assert r.ok, r.text
        (op_id,) = [o.op_id for o in engine.ops.values() if o.open]
        announcement = chat.new_posts()[0]
        assert "rotate the Ray token of local" in announcement.text and BOB.id in announcement.mentions
        await engine.act(ALICE, op_id, "confirm")
        assert engine.ops[op_id].state != State.GRACE  # bob's job: his word is needed
        await engine.act(BOB, op_id, "ok")
        assert engine.ops[op_id].state == State.GRACE
        clock.advance(WINDOWS.grace_s)
        await engine.tick()
        await until(lambda: engine.ops[op_id].state in (State.DONE, State.FAILED), timeout=240)
        await engine.wait_executing(30)  # its report is posted after its state is saved
    finally:
        await engine.close()
    assert engine.ops[op_id].state == State.DONE, engine.ops[op_id].error
    report = chat.new_posts()[-1]
    assert "is live" in report.text and "ops token --cluster local" in report.text
    assert BOB.id in report.mentions
    new = check_rotated(ops_env, cluster, old)
    every = "\n".join(m.text for _, _, m in chat.log)
    check_never_shown(ops_env, cluster, old[1], new[1], texts=every)
    await asyncio.sleep(0)


def test_a_store_without_a_pin_adopts_the_newest_enabled_version_not_a_disabled_one(tmp_path: Path) -> None:
    """A second store (another machine's bot, a fresh terminal) meets a secret whose newest version was
    disabled (a rotation's old token, a wrong one): `latest` names it, and it cannot be read."""
    from ops.registry import DEFAULT_REGISTRY
    from ops.sim.server import SimServer
    from ops.store import LocalStore
    from ops.tokens import ensure_pin

    registry = load_registry(DEFAULT_REGISTRY)
    central = registry.get("us-central2")
    with SimServer(secrets={"hai-gcp-models": {"RAY_AUTH_TOKEN": "tok-v1"}}) as sim:
        ctx = Context(LocalStore(tmp_path / "store"), registry, cloud_endpoint=lambda _: sim.address)
        try:
            api = ctx.secrets(central)
            wrong = api.add_version("RAY_AUTH_TOKEN", "tok-wrong").version
            api.disable("RAY_AUTH_TOKEN", wrong)
            assert api.version("RAY_AUTH_TOKEN", "latest").version == wrong
            assert ensure_pin(ctx, central).version == "1" and ctx.token(central) == "tok-v1"
            api.disable("RAY_AUTH_TOKEN", "1")
            fresh = Context(LocalStore(tmp_path / "store2"), registry, cloud_endpoint=lambda _: sim.address)
            with pytest.raises(OpsError, match="has no enabled version"):
                ensure_pin(fresh, central)
            fresh.close()
        finally:
            ctx.close()


# -- GCP clusters: the pin reaches `ray up`, and a version no cluster pins is the only one disabled --------
def test_each_gcp_cluster_starts_with_its_pinned_version_and_a_pinned_one_stays_enabled(
    tmp_path: Path,
) -> None:
    from ops.configs import update_configs
    from ops.drivers.gcp import GcpDriver, RunResult
    from ops.registry import DEFAULT_REGISTRY
    from ops.sim.server import SimServer
    from ops.store import LocalStore
    from ops.tokens import TokenRotation, ensure_pin, retire, write_pin

    registry = load_registry(DEFAULT_REGISTRY)
    for c in registry.clusters.values():
        if c.driver == "gcp":
            c.ssh_key = None
    update_configs(registry, check=False, infra_dir=_template_copy(tmp_path))
    seen: dict[str, str] = {}

    def runner(argv, *, timeout, cwd):  # noqa: ANN001, ANN202 - Ray's CLI: keep what `ray up` was given
        seen[argv[1]] = Path(argv[-1]).read_text()
        return RunResult(0, "")

    def driver(c: Cluster) -> GcpDriver:
        return GcpDriver(c, runner=runner, config_dir=tmp_path / "infra", state_dir=tmp_path / "gcp")

    with SimServer(secrets={"hai-gcp-models": {"RAY_AUTH_TOKEN": "tok-v1"}}) as sim:
        ctx = Context(LocalStore(tmp_path / "store"), registry, driver_factory=driver,
                      cloud_endpoint=lambda _: sim.address)  # fmt: skip
        central, east = registry.get("us-central2"), registry.get("us-east5")
        assert ensure_pin(ctx, central).version == "1" and ensure_pin(ctx, east).version == "1"
        assert ctx.token(central) == "tok-v1"
        v2 = ctx.secrets(east).add_version("RAY_AUTH_TOKEN", "tok-v2").version  # us-east5's rotation
        write_pin(ctx.store, east, v2, "test")

        ctx.driver(central).start()
        assert "versions access 1 --secret=RAY_AUTH_TOKEN" in seen["up"]
        ctx.driver(east).start()
        assert "versions access 2 --secret=RAY_AUTH_TOKEN" in seen["up"]
        assert "versions access latest --secret=RAY_AUTH_TOKEN" not in seen["up"]
        assert ctx.token(east) == "tok-v2" and ctx.token(central) == "tok-v1"

        rotation = TokenRotation(secret="RAY_AUTH_TOKEN", old_version="1", new_version=v2, live=v2)
        done = retire(ctx, east, rotation)
        assert not done.old_disabled and "us-central2" in done.old_kept_for
        assert ctx.secrets(east).version("RAY_AUTH_TOKEN", "1").state == "ENABLED"
        ctx.close()


def _template_copy(tmp_path: Path) -> Path:
    import shutil

    from ops.configs import INFRA_DIR, TEMPLATE_NAME

    infra = tmp_path / "infra"
    infra.mkdir()
    shutil.copy(INFRA_DIR / TEMPLATE_NAME, infra / TEMPLATE_NAME)
    return infra
