"""The health alerts in #infra through the real discord.py client against the fake Discord, on the
engine's injected clock: a cluster whose head is not running (`head-down` on every check, no Ray
needed) fires once after three checks, is silenced from its button and said again when the silence and
the 4 h repeat are over; a restarted bot re-posts nothing; the daily summary carries the chart of a
seeded day; a worker past its --for time is told to whoever added it; the Restart button starts the
protocol. The local cluster's own stuck/recover/Clean path is in tests/test_alerts_local.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.adapters.discord_bot import ClusterBot
from bot.adapters.recorder import ManualClock, Recorder
from bot.alerts.model import AlertSettings
from bot.alerts.monitor import Monitor
from bot.config import BotConfig, Rights, Windows
from bot.config import Settings as BotSettings
from bot.operations import registered
from bot.protocol.engine import Engine
from bot.protocol.model import User
from ops.context import Context
from ops.health import Point, Verdict, record
from ops.registry import Registry, load_registry
from ops.restart import Settings as RestartSettings
from ops.store import LocalStore, dump
from ops.workers import WorkerRecord
from tests.fakes.discord_api import ADMINISTRATOR, FakeDiscord, FakeInteraction, FakeMessage, run_bot

PEOPLE = ("alice", "bob", "root")
T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
EVERY = timedelta(minutes=5)


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Context]:
    """A registry of one cluster, `gone`: the local cluster's shape under a home where no head runs,
    its dashboard on a port nothing listens on."""
    monkeypatch.setenv("CLUSTERBOT_HOME", str(tmp_path / "home"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    local = load_registry().clusters["local"]
    gone = local.model_copy(update={"name": "gone", "ray_cluster_name": "cb-gone",
                                    "dashboard_url": f"http://127.0.0.1:{port}"})  # fmt: skip
    registry = Registry(image_repository="r", image_name="i", clusters={"gone": gone})
    ctx = Context(store=LocalStore(tmp_path / "store"), registry=registry)
    yield ctx
    ctx.close()


def make_bot(fake: FakeDiscord, ctx: Context, clock: ManualClock) -> ClusterBot:
    config = BotConfig(
        rights=Rights(admin_roles=[str(fake.guild.role("infra-admin").id)]),
        windows=Windows(tick_s=0.05),
        alerts=AlertSettings(clusters=["gone"]),
    )
    infra = fake.guild.channel("infra").id
    settings = BotSettings(discord_token=fake.token, guild_id=fake.guild.id, infra_channel_id=infra,
                           config=config, config_path=None)  # fmt: skip
    quick = RestartSettings(reach_deadline_s=1)  # the dead head's dashboard is not waited for long
    bot = ClusterBot(settings, ctx=ctx, connector=fake.connector(), guild_ready_timeout=0.05,
                     restart_settings=quick)  # fmt: skip
    bot.engine.clock = clock  # the windows' and the alerts' time: the test moves it
    return bot


async def answer(inter: FakeInteraction) -> tuple[str, bool]:
    first = await inter.response()
    if first.type == 4:
        return first.content or "", first.ephemeral
    msg = await inter.wait_original()
    return msg.content, msg.ephemeral


async def click(
    fake: FakeDiscord, user: str, message: FakeMessage, action: str, arg: str = ""
) -> tuple[str, bool]:
    [cid] = [c for c in fake.messages_by_id[message.id].custom_ids if c.startswith(f"cb:{action}:{arg}:")]
    return await answer(await fake.click(user, message, cid))


def alerts(fake: FakeDiscord) -> list[FakeMessage]:
    return [m for m in fake.messages("infra") if "gone is head-down" in m.content]


@pytest.mark.timeout(120)
async def test_an_alert_fires_once_is_silenced_repeats_and_survives_a_bot_restart(ctx: Context) -> None:
    clock = ManualClock(T0)
    async with FakeDiscord(users=PEOPLE, roles={"infra-admin": ADMINISTRATOR}) as fake:
        bot = make_bot(fake, ctx, clock)
        async with run_bot(bot, fake):
            for _ in range(2):
                [h] = await bot.monitor.check()
                assert h.verdict == Verdict.HEAD_DOWN and alerts(fake) == []
                clock.advance(EVERY.total_seconds())
            await bot.monitor.check()  # the third in a row: it fires
            [alert] = alerts(fake)
            assert "the driver says no head is running for gone" in alert.content
            assert "/restart gone" in alert.content
            labels = [b["label"] for b in fake.messages_by_id[alert.id].buttons]
            assert labels == ["Restart", "Silence 1 h", "Silence 4 h", "Silence 24 h"]  # nothing preempted
            clock.advance(EVERY.total_seconds())
            await bot.monitor.check()
            assert alerts(fake) == [alert]  # one message per cluster and problem

            text, private = await click(fake, "bob", alert, "silence", "4h")
            assert "gone's alerts are silenced until" in text and private  # the message says it to all:
            assert "silenced until" in fake.messages_by_id[alert.id].content
            assert "by bob" in fake.messages_by_id[alert.id].content
            clock.advance(timedelta(hours=3, minutes=50).total_seconds())
            await bot.monitor.check()
            assert alerts(fake) == [alert]  # silenced, and its repeat is not due either
            await bot.engine.tick()  # its liveness record at the clock's now: the restart below is quick

        # A new bot process: all it knows is in the store. Nothing is posted again.
        second = make_bot(fake, ctx, clock)
        async with run_bot(second, fake):
            clock.advance(EVERY.total_seconds())
            await second.monitor.check()
            assert alerts(fake) == [alert]
            assert "clusterbot was down" not in " ".join(m.content for m in fake.messages("infra"))

            clock.advance(timedelta(minutes=20).total_seconds())  # the silence ended, 4 h since it was said
            await second.monitor.check()
            old, again = alerts(fake)
            assert old.id == alert.id and "(said again below)" in fake.messages_by_id[alert.id].content
            assert "silenced" not in fake.messages_by_id[again.id].content
            assert fake.messages_by_id[alert.id].buttons == []
    assert fake.unknown_routes == []


@pytest.mark.timeout(120)
async def test_the_daily_summary_charts_a_seeded_day_and_a_due_worker_is_told_to_its_adder(
    ctx: Context,
) -> None:
    clock = ManualClock(T0 + timedelta(hours=1))
    for i in range(24 * 12):  # a day of checks: two workers, none between 03:10 and 05:00
        at = T0 - timedelta(hours=23) + i * EVERY
        alive = 0 if (at.hour, at.minute) >= (3, 10) and at.hour < 5 else 2
        record(ctx, "gone", Point(at=at, alive=alive, verdict=Verdict.HEALTHY))
    async with FakeDiscord(users=PEOPLE, roles={"infra-admin": ADMINISTRATOR}) as fake:
        alice = str(fake.user("alice").id)
        now = clock()
        worker = WorkerRecord(
            cluster="gone", qr_id="gone-v4-8-abc", qr_name="projects/p/locations/z/queuedResources/x",
            zone="z", accelerator_type="v4-8", capacity="reserved", added_by="alice", added_by_chat=alice,
            added_at=now - timedelta(hours=7), until=now - timedelta(hours=1), request_key="k", state="ready",
        )  # fmt: skip
        ctx.store.put("workers/gone/gone-v4-8-abc.json", dump(worker))
        bot = make_bot(fake, ctx, clock)
        async with run_bot(bot, fake):
            await bot.monitor.check()
            [told] = [m for m in fake.messages("infra") if "gone-v4-8-abc" in m.content]
            assert f"<@{alice}>" in told.content and "past its --for time" in told.content
            assert fake.messages_by_id[told.id].pinged == {int(alice)}
            clock.advance(EVERY.total_seconds())
            await bot.monitor.check()  # told once per repeat interval, not every check
            assert len([m for m in fake.messages("infra") if "gone-v4-8-abc" in m.content]) == 1

            await bot.monitor.summary()
            [summary] = [m for m in fake.messages("infra") if "daily summary" in m.content]
            assert "gone" in summary.content and "head-down" in summary.content
            [chart] = fake.messages_by_id[summary.id].attachments
            assert chart["filename"].endswith(".png")
            png = fake.files[int(chart["id"])]
            assert png.startswith(b"\x89PNG") and len(png) > 5000

            # The Restart button starts the full protocol (announced, consent asked), nothing else.
            for _ in range(2):
                clock.advance(EVERY.total_seconds())
                await bot.monitor.check()
            [alert] = alerts(fake)
            text, private = await click(fake, "alice", alert, "restart")
            assert private and "announced" in text, text
            assert any("asks to **restart gone**" in m.content for m in fake.messages("infra"))
    assert fake.unknown_routes == []


async def test_restart_from_an_alert_on_a_protected_cluster_takes_an_admins_click(ctx: Context) -> None:
    gone = ctx.registry.clusters["gone"]
    ctx.registry.clusters["gone"] = gone.model_copy(update={"protected": True})
    config = BotConfig(rights=Rights(admins=["root"]), alerts=AlertSettings(clusters=["gone"]))
    chat = Recorder()
    engine = Engine(ctx, config, chat, registered(RestartSettings(reach_deadline_s=1)), clock=ManualClock(T0))
    monitor = Monitor(engine)
    alice, root = User(id="alice", name="alice"), User(id="root", name="root")
    r = await engine.act(alice, "alert:gone:head-down", "restart")
    assert not r.ok and "gone is protected" in r.text and chat.log == []
    r = await engine.act(root, "alert:gone:head-down", "restart")
    assert r.ok and "announced" in r.text, r.text
    [op] = engine.ops.values()
    assert op.params["override"] is True and not op.confirmed  # its owners are still asked
    await engine.cancel(root, op.op_id)
    assert monitor.book.firing == {}
