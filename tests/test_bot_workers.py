"""/add-worker and /clean-preempted through the real engine with the recorder chat, on the TPU simulator:
request -> announcement (who adds what and why) -> execution -> report, no consent; bad types answered
to the requester alone; refused while a restart holds the cluster; a stock-out reported with what is
left in the cloud."""

# ruff: noqa: F811  (the fixtures ctx and sim come from test_workers)
from __future__ import annotations

import asyncio

import pytest

from bot.adapters.discord_bot import ClusterBot
from bot.adapters.recorder import Recorder
from bot.config import BotConfig, Rights, Windows
from bot.config import Settings as BotSettings
from bot.operations import add_worker, registered
from bot.protocol.engine import Engine
from bot.protocol.model import State, User
from ops.context import Context
from ops.errors import BadInput
from ops.locks import acquire, current_lock
from ops.sim import FaultKind, SimServer
from ops.workers import Settings, ledger
from tests.fakes.discord_api import ADMINISTRATOR, FakeDiscord, FakeInteraction, run_bot
from tests.test_workers import ZONE, ctx, sim  # noqa: F401 - the same simulator and context

ALICE = User(id="alice", name="alice")
FAST = Windows(confirm_s=5, consent_s=3, grace_s=0.3, tick_s=0.05)


def engine_for(ctx: Context, chat: Recorder) -> Engine:
    specs = registered(worker_settings=Settings(timeout_s=10, lease_s=30))
    config = BotConfig(rights=Rights(admin_roles=["infra-admin"]), windows=FAST)
    return Engine(ctx, config, chat, specs)


async def until(predicate, timeout: float = 15.0) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for the engine")
        await asyncio.sleep(0.02)


async def test_alice_adds_a_reserved_v4_8_from_chat_and_it_is_announced_and_reported(ctx: Context) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat)
    cluster = await asyncio.to_thread(add_worker.infer_cluster, engine, "v4-8")  # `/add-worker v4-8 reserved`
    assert cluster == "local"
    params = {"tpu_type": "v4-8", "capacity": "reserved", "reason": "eval sweep", "for_hours": "6"}
    r = await engine.request(ALICE, "add-worker", cluster, params)
    assert r.ok and "add-worker v4-8 (reserved) to local announced in #infra" in r.text, r.text
    await until(lambda: len(chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    announcement, report = chat.new_posts()
    assert announcement.text.startswith("**alice** asks to **add-worker v4-8 (reserved) to local**")
    assert "why: eval sweep" in announcement.text and "needed for 6 h" in announcement.text
    assert announcement.buttons == [] and announcement.mentions == []  # announced, no consent
    assert op.state == State.DONE, op.error
    assert report.text.startswith(
        f"add-worker v4-8 (reserved) to local is done (`{op.op_id}`), asked by alice"
    )
    assert "1 of 1 v4-8 (reserved) ready on local" in report.text
    assert "READY" in chat.text(op.message_id)  # progress edited into the announcement
    [record] = ledger(ctx, "local")
    assert (record.added_by, record.reason, record.request_key) == ("alice", "eval sweep", op.op_id)
    assert current_lock(ctx.store, "local") is None


async def test_a_type_the_zone_does_not_offer_is_answered_to_alice_alone(ctx: Context) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat)
    r = await engine.request(ALICE, "add-worker", "sim-b", {"tpu_type": "v6e-8", "capacity": "spot"})
    assert not r.ok and "local-sim-b offers no v6e-8" in r.text and "v5litepod-4" in r.text
    r = await engine.request(ALICE, "add-worker", "local", {"tpu_type": "v4-8", "capacity": "cheap"})
    assert not r.ok and "capacity" in r.text
    try:
        add_worker.infer_cluster(engine, "v5litepod-4")
        raise AssertionError("two clusters offer v5litepod-4")
    except BadInput as e:
        assert "sim-b, sim-a2" in str(e)  # the chat offers these to pick from
    assert chat.log == [] and not engine.ops and current_lock(ctx.store, "local") is None


async def test_refused_while_a_restart_holds_the_cluster(ctx: Context) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat)
    lease = acquire(ctx.store, "local", "local-restart-1", "restart", "carol", 30)
    try:
        r = await engine.request(ALICE, "add-worker", "local", {"tpu_type": "v4-8", "capacity": "reserved"})
        assert not r.ok and r.text.startswith("local is busy: restart local-restart-1 by carol")
    finally:
        lease.release()
    assert chat.log == []


async def test_a_stock_out_is_reported_with_what_is_left(ctx: Context, sim: SimServer) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat)
    sim.fault(FaultKind.STOCK_OUT, zone=ZONE)
    r = await engine.request(ALICE, "add-worker", "local", {"tpu_type": "v6e-8", "capacity": "spot"})
    assert r.ok, r.text
    await until(lambda: len(chat.new_posts()) == 2)
    (op,) = engine.ops.values()
    report = chat.new_posts()[-1]
    assert op.state == State.FAILED and report.mentions == ["alice"]
    assert "add-worker v6e-8 (spot) to local FAILED" in report.text
    assert "(stock-out)" in report.text and "Nothing is left in the cloud." in report.text
    assert "python -m ops workers --cluster local" in report.text
    assert current_lock(ctx.store, "local") is None and ledger(ctx, "local") == []


async def test_bob_cleans_preempted_vms_from_chat(ctx: Context, sim: SimServer) -> None:
    chat = Recorder()
    engine = engine_for(ctx, chat)
    r = await engine.request(ALICE, "add-worker", "local", {"tpu_type": "v4-8", "capacity": "spot"})
    assert r.ok
    await until(lambda: len(chat.new_posts()) == 2)
    [record] = ledger(ctx, "local")
    sim.state.preempt(record.qr_id)
    bob = User(id="bob", name="bob")
    r = await engine.request(bob, "clean-preempted", "local", {})
    assert r.ok, r.text
    await until(lambda: len(chat.new_posts()) == 4)
    announcement, report = chat.new_posts()[2:]
    assert "asks to **clean-preempted local**" in announcement.text
    assert "1 preempted or terminated TPU VM(s)" in announcement.text
    assert f"{record.qr_id} (node, v4-8, clusterbot, PREEMPTED): deleted" in report.text
    assert ctx.tpu(ctx.cluster("local")).list_nodes(ZONE) == []


# -- through the real discord.py client against the fake Discord ----------------------------------------
PEOPLE = ("alice", "bob", "root")


async def answer(inter: FakeInteraction) -> tuple[str, bool]:
    first = await inter.response()
    assert first.latency < 3.0
    if first.type == 4:
        return first.content or "", first.ephemeral
    msg = await inter.wait_original()
    return msg.content, msg.ephemeral


async def slash(fake: FakeDiscord, user: str, name: str, **options: object) -> tuple[str, bool]:
    return await answer(await fake.slash(user, name, options=options, channel="infra"))


@pytest.mark.timeout(60)
async def test_alice_types_add_worker_v4_8_reserved_in_discord(ctx: Context) -> None:
    async with FakeDiscord(users=PEOPLE, roles={"infra-admin": ADMINISTRATOR}) as fake:
        settings = BotSettings(
            discord_token=fake.token,
            guild_id=fake.guild.id,
            infra_channel_id=fake.guild.channel("infra").id,
            config=BotConfig(
                rights=Rights(admin_roles=[str(fake.guild.role("infra-admin").id)]), windows=FAST
            ),
            config_path=None,
        )
        specs = registered(worker_settings=Settings(timeout_s=10, lease_s=30))
        bot = ClusterBot(settings, ctx=ctx, specs=specs, connector=fake.connector(), guild_ready_timeout=0.05)
        async with run_bot(bot, fake):
            # The cluster option offers the clusters that can take the type typed so far.
            v5e = {"tpu_type": "v5litepod-4", "capacity": "spot"}
            offered = await fake.autocomplete("alice", "add-worker", "cluster", "", options=v5e)
            assert [c["value"] for c in offered] == ["sim-b", "sim-a2"]
            text, private = await slash(fake, "alice", "add-worker", **v5e)
            assert private and "2 clusters could take v5litepod-4: sim-b, sim-a2" in text

            text, private = await slash(fake, "alice", "add-worker", tpu_type="v4-8", capacity="reserved")
            assert private and "add-worker v4-8 (reserved) to local announced in #infra" in text, text
            report = await fake.wait_for_message(lambda m: "is done" in m.content, 20, channel="infra")
            assert "1 of 1 v4-8 (reserved) ready on local" in report.content
            [announcement] = [m for m in fake.messages("infra") if "asks to" in m.content]
            assert "**alice** asks to **add-worker v4-8 (reserved) to local**" in announcement.content

            [record] = ledger(ctx, "local")
            text, private = await slash(fake, "bob", "workers", cluster="local")
            assert not private and record.qr_id in text and "ACTIVE/READY" in text
        assert fake.unknown_routes == []
