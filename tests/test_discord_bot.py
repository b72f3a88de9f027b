"""The Discord bot end to end: the real discord.py client against the fake Discord on 127.0.0.1.

Most tests run the real engine (store, lock, journal, timers) with a registered test operation whose
`look` reports a fixed set of jobs and whose `execute` counts its runs, with windows of seconds, so
they need no Ray. One test runs the real restart on the session's local Ray cluster, with jobs of two
owners, and kills the bot (a child process, SIGKILL) in the middle of the restart.

People: alice asks, bob and carol own jobs, root is an admin (role infra-admin, named by its id in the
rights, and a Discord administrator, who sees /unlock), mallory has no jobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from bot.adapters.discord_bot import CUSTOM_ID, ClusterBot
from bot.config import BotConfig, ConfigError, Rights, Settings, Windows
from bot.operations import registered
from bot.protocol.engine import ALIVE_KEY, Look, Outcome, Spec
from bot.protocol.model import Message, State, Vote
from ops import journal
from ops.context import Context
from ops.errors import Refused
from ops.jobs import Job
from ops.locks import current_lock
from ops.registry import Cluster, load_registry
from ops.restart import Settings as RestartSettings
from ops.store import LocalStore
from tests.fakes.discord_api import (
    ADMINISTRATOR,
    APPLICATION_COMMAND,
    CommandHidden,
    FakeDiscord,
    FakeDiscordResolver,
    FakeInteraction,
    FakeMessage,
    run_bot,
)
from tests.localray import Env

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(60)]

PEOPLE = ("alice", "bob", "carol", "root", "mallory")
FAST = Windows(confirm_s=10, consent_s=3, grace_s=0.3, tick_s=0.05, delay_choices_min=[10, 30])
LATENCIES: list[float] = []  # every interaction acknowledgement seen, for the summary test at the end


def job(owner: str | None, n: int = 0) -> Job:
    return Job(submission_id=f"raysubmit_{owner}_{n}", status="RUNNING", owner=owner,
               owner_source="metadata" if owner else "unknown", entrypoint="sleep 600")  # fmt: skip


class World:
    """The fake Discord with its people, a store, the registry, and a test operation counting runs."""

    def __init__(self, fake: FakeDiscord, tmp_path: Path, jobs: list[Job], windows: Windows = FAST) -> None:
        self.fake = fake
        self.store = LocalStore(tmp_path / "store")
        self.registry = load_registry()
        self.jobs = jobs
        self.runs: list[str] = []
        self.look_error: Exception | None = None
        self.params: list[dict] = []  # what each look was asked, as the engine got it
        self.id = {name: str(fake.user(name).id) for name in PEOPLE}
        self.settings = Settings(
            discord_token=fake.token,
            guild_id=fake.guild.id,
            infra_channel_id=fake.guild.channel("infra").id,
            config=BotConfig(
                rights=Rights(admin_roles=[str(fake.guild.role("infra-admin").id)]),
                owners={name: self.id[name] for name in ("alice", "bob", "carol")},
                windows=windows,
            ),
            config_path=None,
        )

    def spec(self) -> Spec:
        def look(engine, cluster, user, params):  # noqa: ANN001, ANN202
            self.params.append(dict(params))
            if self.look_error is not None:
                raise self.look_error
            return Look(list(self.jobs), [])

        def execute(engine, op, lease, progress):  # noqa: ANN001, ANN202
            self.runs.append(op.op_id)
            progress("step one")
            if lease is not None:
                lease.release()
            return Outcome("all went well", owners=[j.owner for j in self.jobs if j.owner])

        restart = registered(RestartSettings(lease_s=30))["restart"]  # its parameters and texts
        return dataclasses.replace(restart, look=look, execute=execute)

    def bot(self) -> ClusterBot:
        return ClusterBot(
            self.settings,
            ctx=Context(self.store, self.registry),
            specs={"restart": self.spec()},
            restart_settings=RestartSettings(lease_s=30),
            connector=self.fake.connector(),
            guild_ready_timeout=0.05,
        )

    def infra(self) -> list[FakeMessage]:
        return self.fake.messages("infra")


@pytest_asyncio.fixture(loop_scope="function")
async def fake():
    async with FakeDiscord(users=PEOPLE, roles={"infra-admin": ADMINISTRATOR}) as f:
        f.give_role("root", "infra-admin")
        yield f
    assert f.refused_hosts == []


@pytest.fixture
def world(fake: FakeDiscord, tmp_path: Path) -> World:
    return World(fake, tmp_path, [job("alice"), job("bob"), job("bob", 1), job("carol")])


@pytest_asyncio.fixture(loop_scope="function")
async def bot(world: World):
    b = world.bot()
    async with run_bot(b, world.fake):
        yield b
    assert world.fake.unknown_routes == [], world.fake.unknown_routes


# -- helpers -------------------------------------------------------------------------------------------


async def answer(inter: FakeInteraction) -> tuple[str, bool]:
    """What the person who clicked or typed was told, and whether only they see it."""
    first = await inter.response()
    LATENCIES.append(first.latency)
    assert first.latency < 3.0
    if first.type == 4:
        return first.content or "", first.ephemeral
    msg = await inter.wait_original()  # deferred: the first follow-up fills the "thinking" message
    return msg.content, msg.ephemeral


async def slash(world: World, user: str, name: str, **options: object) -> tuple[str, bool]:
    return await answer(await world.fake.slash(user, name, options=options, channel="infra"))


async def click(
    world: World, user: str, message: FakeMessage, action: str, arg: str = ""
) -> tuple[str, bool]:
    [cid] = [c for c in world.fake.messages_by_id[message.id].custom_ids
             if c.startswith(f"cb:{action}:{arg}:")]  # fmt: skip
    return await answer(await world.fake.click(user, message, cid))


async def until(predicate, timeout: float = 10.0, what: str = "the engine") -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def announce(world: World, bot: ClusterBot, user: str = "alice") -> tuple[str, FakeMessage]:
    text, private = await slash(world, user, "restart", cluster="local")
    assert private and "announced" in text, text
    [op_id] = [o for o in bot.engine.ops if o in text]
    message = await world.fake.wait_for_message(lambda m: op_id in m.content, channel="infra")
    return op_id, message


async def report(world: World, op_id: str, timeout: float = 10.0) -> FakeMessage:
    return await world.fake.wait_for_message(
        lambda m: "is done" in m.content and op_id in m.content, timeout, channel="infra"
    )


def state(bot: ClusterBot, op_id: str) -> State:
    return bot.engine.ops[op_id].state


# -- commands ----------------------------------------------------------------------------------------


async def test_commands_are_synced_to_the_configured_guild(bot: ClusterBot, world: World) -> None:
    stored = {c["name"]: c for c in world.fake.guild_commands[world.fake.guild.id]}
    assert set(stored) == {"restart", "cancel", "unlock", "status", "jobs", "link", "unlink", "add-worker",
                           "workers", "clean-preempted", "health", "build-image", "rotate-token"}  # fmt: skip
    assert world.fake.global_commands == []
    assert {c.name for c in bot.synced} == set(stored)
    opts = {o["name"]: o for o in stored["restart"]["options"]}
    assert opts["cluster"]["required"] and opts["cluster"]["autocomplete"]
    assert opts["preserve_jobs"]["type"] == 5 and not opts["preserve_jobs"].get("required")
    assert opts["override"]["type"] == 5 and not opts["override"].get("required")
    assert opts["force_unbacked"]["type"] == 5 and not opts["force_unbacked"].get("required")
    assert "NOT backed up" in opts["force_unbacked"]["description"]
    # Discord shows the admins' commands to its administrators only; the others to everyone.
    admin_only = {n for n, c in stored.items() if c["default_member_permissions"] == str(ADMINISTRATOR)}
    assert admin_only == {"unlock", "unlink"}
    assert all(stored[n]["default_member_permissions"] is None for n in set(stored) - admin_only)
    assert stored["link"]["options"][0]["name"] == "ray_user" and stored["link"]["options"][0]["required"]
    assert not stored["status"]["options"][0].get("required")
    assert stored["jobs"]["options"][0]["required"] and stored["unlock"]["options"][0]["required"]
    assert not stored["cancel"]["options"][0].get("required")


async def test_autocomplete_offers_the_registered_clusters(bot: ClusterBot, world: World) -> None:
    names = list(world.registry.clusters)
    every = await world.fake.autocomplete("alice", "restart", "cluster", "")
    assert [c["value"] for c in every] == names
    assert any("protected" in c["name"] for c in every if c["value"] == "big-run")
    us = await world.fake.autocomplete("bob", "status", "cluster", "us-c")
    assert {c["value"] for c in us} == {"us-central1", "us-central2"}
    assert await world.fake.autocomplete("bob", "jobs", "cluster", "nowhere") == []
    assert [c["value"] for c in await world.fake.autocomplete("root", "unlock", "cluster", "loc")] == [
        "local"
    ]


async def test_bad_input_and_big_run_get_ephemeral_refusals_and_nothing_happens(
    bot: ClusterBot, world: World
) -> None:
    text, private = await slash(world, "alice", "restart", cluster="us-central3")
    assert private and "unknown cluster 'us-central3'" in text and "us-central2" in text
    text, private = await slash(world, "alice", "restart", cluster="big-run")
    assert private and "protected" in text
    text, private = await slash(world, "alice", "restart", cluster="big-run", override=True)
    assert private and "override is for admins" in text
    text, private = await slash(world, "bob", "status", cluster="nope")
    assert private and "unknown cluster 'nope'" in text
    text, private = await slash(world, "bob", "jobs", cluster="nope")
    assert private and "unknown cluster" in text
    with pytest.raises(CommandHidden):  # Discord does not even show /unlock to mallory
        await world.fake.slash("mallory", "unlock", options={"cluster": "local"}, channel="infra")
    # The server's owner sees it (a Discord administrator) but is not one of the bot's admins.
    text, private = await slash(world, world.fake.owner.username, "unlock", cluster="local")
    assert private and "only an admin" in text
    text, private = await slash(world, "mallory", "cancel")
    assert private and "no operation that can still be cancelled" in text
    assert world.infra() == [] and bot.engine.ops == {}
    assert current_lock(world.store, "big-run") is None and current_lock(world.store, "local") is None


async def test_a_slash_command_is_acknowledged_within_the_deadline(bot: ClusterBot, world: World) -> None:
    handle = await world.fake.slash("alice", "restart", options={"cluster": "local"}, channel="infra")
    first = await handle.response()
    assert first.type == 5 and first.ephemeral  # deferred at once, visible to alice alone
    assert first.latency < 1.0, first.latency  # the deadline is 3 s; the defer is the first await
    LATENCIES.append(first.latency)
    msg = await handle.wait_original()
    assert msg.ephemeral and "announced" in msg.content


# -- the protocol through buttons -------------------------------------------------------------------


async def test_alice_restarts_local_and_everyone_says_ok(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    bob, carol = world.id["bob"], world.id["carol"]
    assert ann.author.id == world.fake.bot_user.id and not ann.ephemeral and ann.interaction_id is None
    assert f"<@{bob}>: 2 jobs, not answered yet" in ann.content
    assert f"<@{carol}>: 1 job, not answered yet" in ann.content
    assert "1 of alice's own" in ann.content and "<t:" in ann.content  # a Discord timestamp
    assert ann.pinged == {int(bob), int(carol)}  # the affected owners are notified; alice asked
    assert all(CUSTOM_ID.fullmatch(c) and op_id in c and len(c) <= 100 for c in ann.custom_ids)
    assert [b["label"] for b in ann.buttons] == [
        "Confirm", "OK", "Delay 10 min", "Delay 30 min", "Object", "Don't resubmit mine", "Cancel",
        "Override (admin)",
    ]  # fmt: skip

    assert await click(world, "bob", ann, "ok") == ("OK counted", True)
    await world.fake.wait_for_message(lambda m: m.id == ann.id and f"<@{bob}>: 2 jobs, OK" in m.content)
    assert await click(world, "carol", ann, "ok") == ("OK counted", True)
    assert state(bot, op_id) == State.AWAITING  # alice has not confirmed yet
    assert await click(world, "alice", ann, "confirm") == ("confirmed", True)

    done = await report(world, op_id)
    # Every owner whose jobs were resubmitted is notified, alice's own included.
    assert "all went well" in done.content and done.pinged == {int(world.id["alice"]), int(bob), int(carol)}
    assert world.runs == [op_id]
    final = world.fake.messages_by_id[ann.id]
    assert final.components == [] and "› step one" in final.content and "all went well" in final.content
    assert final.pinged == {int(bob), int(carol)}  # edits pinged nobody new
    assert current_lock(world.store, "local") is None
    assert len(world.infra()) == 2  # the announcement (edited) and the report: no spam


async def test_lazy_consent_when_the_window_passes_without_objection(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    await click(world, "alice", ann, "confirm")
    await asyncio.sleep(1.0)
    assert state(bot, op_id) == State.AWAITING  # bob and carol have not answered, the window is open
    await report(world, op_id, timeout=FAST.consent_s + 5)
    assert world.runs == [op_id]
    [grace] = [e for e in journal.read(world.store, f"bot/journal/{op_id}") if e["event"] == "grace"]
    assert "the consent window passed" in str(grace)


async def test_an_objection_blocks_until_withdrawn(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    await click(world, "alice", ann, "confirm")
    text, private = await click(world, "bob", ann, "object")
    assert private and text.startswith("objection counted")
    await click(world, "carol", ann, "ok")
    await asyncio.sleep(FAST.consent_s + 0.5)  # the window passes: an objection still blocks
    assert state(bot, op_id) == State.AWAITING and world.runs == []
    assert "consent: objection by" in world.fake.messages_by_id[ann.id].content
    assert await click(world, "bob", ann, "ok") == ("objection withdrawn: OK counted", True)
    await report(world, op_id)
    assert world.runs == [op_id]


async def test_an_admin_overrides_an_objection(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    await click(world, "bob", ann, "object")
    text, private = await click(world, "alice", ann, "override")
    assert private and "only an admin" in text
    assert await click(world, "root", ann, "override") == ("consent overridden", True)
    await world.fake.wait_for_message(lambda m: m.id == ann.id and "overridden by admin root" in m.content)
    assert state(bot, op_id) == State.AWAITING  # the requester still confirms
    await click(world, "alice", ann, "confirm")
    await report(world, op_id)
    assert world.runs == [op_id]


async def test_an_owner_asks_for_a_delay_to_checkpoint(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    await click(world, "alice", ann, "confirm")
    assert await click(world, "bob", ann, "delay", "10") == ("delayed by 10 min for your checkpoint", True)
    await click(world, "carol", ann, "ok")
    shown = await world.fake.wait_for_message(lambda m: m.id == ann.id and "delayed until <t:" in m.content)
    assert "10 min asked in total" in shown.content
    await asyncio.sleep(FAST.consent_s + 0.5)  # the lazy window passes: the delay still holds
    assert state(bot, op_id) == State.AWAITING and world.runs == []
    assert await click(world, "bob", ann, "delay", "30") == ("delayed by 30 min for your checkpoint", True)
    text, private = await click(world, "bob", ann, "delay", "30")  # 70 min > the 60 min bound
    assert private and "at most 60 min of delay in total" in text
    await slash(world, "alice", "cancel", operation=op_id)
    assert state(bot, op_id) == State.CANCELLED and world.runs == []


async def test_an_owner_asks_not_to_resubmit_their_jobs(bot: ClusterBot, world: World) -> None:
    """A new action of the engine ("skip") is a button like any other: no adapter change."""
    op_id, ann = await announce(world, bot)
    text, private = await click(world, "bob", ann, "skip")
    assert private and text.startswith("OK counted; your 2 jobs will be backed up but not resubmitted"), text
    assert set(bot.engine.ops[op_id].skip_resubmit.values()) == {"bob"}
    await slash(world, "alice", "cancel", operation=op_id)


async def test_cancel_during_the_grace_countdown(world: World) -> None:
    world.jobs = [job("alice")]  # only her own job: her confirmation suffices
    world.settings.config.windows = FAST.model_copy(update={"grace_s": 30})
    bot = world.bot()
    async with run_bot(bot, world.fake):
        op_id, ann = await announce(world, bot)
        assert ann.pinged == set() and ann.custom_ids[0].startswith("cb:confirm::")
        await click(world, "alice", ann, "confirm")
        await until(lambda: state(bot, op_id) == State.GRACE)
        counting = await world.fake.wait_for_message(lambda m: m.id == ann.id and "starting <t:" in m.content)
        assert [b["label"] for b in counting.buttons] == ["Cancel"]
        text, private = await click(world, "bob", counting, "cancel")
        assert private and "only alice (who asked) or an admin can cancel" in text
        text, private = await slash(world, "alice", "cancel")  # her newest operation
        assert private and text == f"cancelled {op_id}"
        assert state(bot, op_id) == State.CANCELLED
        final = await world.fake.wait_for_message(
            lambda m: m.id == ann.id and "cancelled by alice" in m.content
        )
        assert final.components == []
        assert world.runs == [] and current_lock(world.store, "local") is None


async def test_clicks_by_the_wrong_people_are_refused_and_change_nothing(
    bot: ClusterBot, world: World
) -> None:
    op_id, ann = await announce(world, bot)
    before, edits = bot.engine.ops[op_id], world.fake.messages_by_id[ann.id].edits
    for user, action, arg, why in (
        ("bob", "confirm", "", "only alice (who asked) can confirm"),
        ("mallory", "ok", "", "only people whose jobs this stops"),
        ("mallory", "object", "", "only people whose jobs this stops"),
        ("mallory", "delay", "10", "only people whose jobs this stops"),
        ("mallory", "cancel", "", "only alice (who asked) or an admin"),
        ("bob", "override", "", "only an admin can override"),
    ):
        text, private = await click(world, user, ann, action, arg)
        assert private and why in text, (user, action, text)
    assert bot.engine.ops[op_id] == before
    assert world.fake.messages_by_id[ann.id].edits == edits
    # /cancel offers the operation to those who may cancel it, and to nobody else.
    for user, offered in (("alice", [op_id]), ("root", [op_id]), ("mallory", []), ("bob", [])):
        choices = await world.fake.autocomplete(user, "cancel", "operation", "")
        assert [c["value"] for c in choices] == offered, user
    assert await slash(world, "mallory", "cancel", operation=op_id) == (
        "only alice (who asked) or an admin can cancel",
        True,
    )


async def test_double_clicks_count_once(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    answers = await asyncio.gather(*[click(world, "bob", ann, "ok") for _ in range(2)])
    assert sorted(answers) == [("OK counted", True), ("already counted: OK", True)]
    answers = await asyncio.gather(*[click(world, "alice", ann, "confirm") for _ in range(3)])
    assert sorted(t for t, _ in answers) == ["already confirmed", "already confirmed", "confirmed"]
    await click(world, "carol", ann, "ok")  # the last consent: the countdown starts
    await report(world, op_id)
    await asyncio.sleep(0.3)
    assert world.runs == [op_id]
    assert len([m for m in world.infra() if "is done" in m.content]) == 1


class StallingStore(LocalStore):
    """The bot's store, whose writes of an operation's state take `stall_s` when told to (a slow disk or
    bucket): what a click waits for before it is answered."""

    stall_s = 0.0

    def replace(self, key: str, data: bytes, version: str) -> str:
        time.sleep(self.stall_s)
        return super().replace(key, data, version)


async def test_a_click_the_store_is_slow_to_record_is_deferred_and_a_refusal_is_not(
    fake: FakeDiscord, tmp_path: Path
) -> None:
    """Answers wait for the record, never longer than the budget before Discord hears from the bot;
    a refusal needs no record and is the acknowledgement itself, even while a write stalls."""
    world = World(fake, tmp_path, [job("alice"), job("bob")])
    world.store = StallingStore(tmp_path / "store")
    bot = world.bot()
    async with run_bot(bot, fake):
        op_id, ann = await announce(world, bot)
        world.store.stall_s = 1.5  # beyond the 1 s budget, within Discord's 3 s
        cid = {a: next(c for c in ann.custom_ids if c.startswith(f"cb:{a}:")) for a in ("ok", "confirm")}
        bob = await fake.click("bob", ann, cid["ok"])
        mallory = await fake.click("mallory", ann, cid["ok"])
        refused = await mallory.response()
        assert refused.type == 4 and refused.ephemeral and "only people whose jobs" in (refused.content or "")
        first = await bob.response()
        assert first.type == 5 and first.ephemeral and 0.9 < first.latency < 3.0  # deferred, privately
        assert refused.latency < first.latency
        msg = await bob.wait_original(timeout=10)
        assert msg.content == "OK counted" and msg.ephemeral
        assert bot.engine.ops[op_id].affected[world.id["bob"]].vote == Vote.OK  # recorded before answered
        world.store.stall_s = 0.0
        quick = await fake.click("alice", ann, cid["confirm"])
        assert (await quick.response()).type == 4  # recorded within the budget: the answer itself


async def test_two_concurrent_restarts_of_one_cluster_announce_once(bot: ClusterBot, world: World) -> None:
    (a, a_private), (b, b_private) = await asyncio.gather(
        slash(world, "alice", "restart", cluster="local"), slash(world, "bob", "restart", cluster="local")
    )
    assert a_private and b_private
    assert sorted(["announced" in a, "announced" in b]) == [False, True]
    loser = b if "announced" in a else a
    assert "locked by restart" in loser or "busy" in loser, loser
    await asyncio.sleep(0.3)
    assert len(bot.engine.ops) == 1 and len(world.infra()) == 1


async def test_a_bot_killed_mid_consent_comes_back_and_old_buttons_still_work(world: World) -> None:
    first = world.bot()
    async with run_bot(first, world.fake):
        op_id, ann = await announce(world, first)
        await click(world, "bob", ann, "ok")
    assert first.is_closed()
    # Down for two minutes: the last liveness record is moved back (the engine writes one every 30 s
    # and counts the downtime beyond that interval).
    alive = json.loads(world.store.read(ALIVE_KEY).data)
    alive["at"] = (datetime.fromisoformat(alive["at"]) - timedelta(minutes=2)).isoformat()
    world.store.put(ALIVE_KEY, json.dumps(alive).encode())

    second = world.bot()  # a new process: all it knows comes from the store
    async with run_bot(second, world.fake):
        assert state(second, op_id) == State.AWAITING
        # The old message, never re-posted: its buttons reach the new bot through their custom_ids.
        # The downtime is said once, in a message of its own.
        ids = [m.id for m in world.infra()]
        assert ids[0] == ann.id and len(ids) == 2, ids
        assert "clusterbot was down for 1 min" in world.infra()[1].content
        assert await click(world, "carol", ann, "ok") == ("OK counted", True)
        assert await click(world, "alice", ann, "confirm") == ("confirmed", True)
        await report(world, op_id)
        assert world.runs == [op_id]
        assert "the windows were extended" in " ".join(
            v["content"] for v in world.fake.messages_by_id[ann.id].history
        )
    assert len(world.fake.identifies) == 2


async def test_an_admin_force_unlocks_a_cluster_in_public(bot: ClusterBot, world: World) -> None:
    op_id, ann = await announce(world, bot)
    with pytest.raises(CommandHidden):
        await world.fake.slash("alice", "unlock", options={"cluster": "local"}, channel="infra")
    text, private = await slash(world, "root", "unlock", cluster="local")
    assert not private and f"root force-unlocked local (was: restart {op_id} by alice" in text
    assert state(bot, op_id) == State.CANCELLED and current_lock(world.store, "local") is None
    final = await world.fake.wait_for_message(lambda m: m.id == ann.id and "force-unlock" in m.content)
    assert final.components == []
    text, private = await slash(world, "root", "unlock", cluster="local")
    assert not private and text == "local was not locked"


# -- rights, owners, links ------------------------------------------------------------------------------


async def test_rights_go_by_id_so_a_look_alike_role_gives_nothing(world: World) -> None:
    """mallory creates a role named infra-admin and takes it: not an admin. carol, listed by her user
    id, is one; root is one through the real infra-admin role (by its id)."""
    world.fake.give_role("mallory", world.fake.add_role("infra-admin"))  # same name, another id
    world.settings.config.rights.admins = [world.id["carol"]]
    bot = world.bot()
    async with run_bot(bot, world.fake):
        op_id, ann = await announce(world, bot)
        await click(world, "bob", ann, "object")
        text, private = await click(world, "mallory", ann, "override")
        assert private and "only an admin can override" in text
        assert await click(world, "carol", ann, "override") == ("consent overridden", True)
        text, private = await slash(world, "root", "cancel", operation=op_id)
        assert private and text == f"cancelled {op_id}"


async def test_rights_that_name_people_or_roles_are_one_config_line(world: World) -> None:
    world.settings.config.rights.commands = {"restart": ["*", "researcher"]}
    with pytest.raises(ConfigError) as info:
        world.bot()
    line = str(info.value)
    assert "\n" not in line and "rights.commands.restart: 'researcher' is not a Discord role id" in line
    assert "Copy Role ID" in line
    world.settings.config.rights.commands = {"restart": ["*"]}
    world.settings.config.rights.admins = ["root"]
    with pytest.raises(ConfigError, match=r"rights\.admins: 'root' is not a Discord user id.*Copy User ID"):
        world.bot()


async def test_a_user_links_their_ray_name_and_an_admin_unlinks_it(bot: ClusterBot, world: World) -> None:
    mallory = world.id["mallory"]
    text, private = await slash(world, "mallory", "link", ray_user="mal")
    assert private and "mal" in text, text
    world.jobs = [job("mal")]
    op_id, ann = await announce(world, bot)  # mallory's Ray name now reaches her
    assert f"<@{mallory}>: 1" in ann.content and ann.pinged == {int(mallory)}
    await slash(world, "alice", "cancel", operation=op_id)
    with pytest.raises(CommandHidden):  # Discord shows /unlink to its administrators only
        await world.fake.slash("mallory", "unlink", options={"ray_user": "mal"}, channel="infra")
    text, private = await slash(world, world.fake.owner.username, "unlink", ray_user="mal")
    assert private and "admin" in text  # a Discord administrator, not one of the bot's admins
    text, private = await slash(world, "root", "unlink", ray_user="mal")
    assert private and "mal" in text, text
    op_id, ann = await announce(world, bot)
    assert f"<@{mallory}>" not in ann.content and ann.pinged == set()


async def test_force_unbacked_reaches_the_engine_for_admins_only(bot: ClusterBot, world: World) -> None:
    text, private = await slash(world, "mallory", "restart", cluster="local", force_unbacked=True)
    assert private and "admin" in text and bot.engine.ops == {} and world.infra() == []
    text, private = await slash(world, "root", "restart", cluster="local", force_unbacked=True)
    assert private and "announced" in text, text
    assert world.params[-1]["force_unbacked"] is True


async def test_the_reply_to_restart_links_the_announcement(bot: ClusterBot, world: World) -> None:
    text, private = await slash(world, "alice", "restart", cluster="local")
    [ann] = world.infra()
    infra = world.fake.guild.channel("infra").id
    assert private and f"https://discord.com/channels/{world.fake.guild.id}/{infra}/{ann.id}" in text, text
    assert bot.link("not-a-message") is None


# -- errors ------------------------------------------------------------------------------------------


async def test_known_errors_reach_the_user_and_others_are_logged_not_shown(
    bot: ClusterBot, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.look_error = Refused("the head of local does not answer", "start it: python -m ops start local")
    text, private = await slash(world, "alice", "restart", cluster="local")
    assert private and text == "the head of local does not answer (start it: python -m ops start local)"

    world.look_error = RuntimeError("boom with token=s3cr3t-v4lue")
    with caplog.at_level(logging.ERROR, logger="clusterbot.discord"):
        text, private = await slash(world, "alice", "restart", cluster="local")
    assert private and text.startswith("Sorry, something went wrong") and "s3cr3t" not in text
    assert "Traceback" not in text
    [record] = [r for r in caplog.records if r.name == "clusterbot.discord"]
    assert record.exc_info and "s3cr3t" in str(record.exc_info[1])  # the traceback is in the log only
    assert world.infra() == [] and current_lock(world.store, "local") is None


@pytest.mark.parametrize(
    ("field", "says"),
    [("guild_id", "CLUSTERBOT_GUILD_ID"), ("infra_channel_id", "CLUSTERBOT_INFRA_CHANNEL_ID")],
)
async def test_a_wrong_guild_or_channel_is_one_clear_line_at_start_up(
    world: World, field: str, says: str
) -> None:
    setattr(world.settings, field, 4242)
    with pytest.raises(ConfigError, match=says) as info:
        async with run_bot(world.bot(), world.fake):
            pass
    assert "\n" not in str(info.value)


async def test_long_engine_messages_are_cut_to_discord_limits(bot: ClusterBot, world: World) -> None:
    mid = await bot.post(Message("x" * 2500, mentions=[world.id["bob"]]))
    msg = world.fake.messages_by_id[int(mid)]
    assert len(msg.content) <= 2000 and "cut" in msg.content
    assert msg.pinged == {int(world.id["bob"])}  # the mention did not fit in the text: it is added
    await bot.edit(mid, Message("short"))
    assert world.fake.messages_by_id[int(mid)].content == "short"


async def test_interaction_acknowledgement_latency_summary(bot: ClusterBot, world: World) -> None:
    """Ten concurrent slash commands; the figures of every interaction of this module are printed."""
    handles = await asyncio.gather(*[world.fake.slash(u, "cancel", channel="infra") for u in PEOPLE * 2])
    for h in handles:
        await answer(h)
    ours = [i.latency for i in world.fake.interactions.values()
            if i.type == APPLICATION_COMMAND and i.latency is not None]  # fmt: skip
    assert max(ours) < 1.0
    seen = sorted(LATENCIES)
    p99 = seen[min(len(seen) - 1, int(len(seen) * 0.99))]
    print(f"\nack latency over {len(seen)} interactions: p50 {statistics.median(seen) * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms, max {seen[-1] * 1000:.0f} ms")  # fmt: skip
    assert seen[-1] < 3.0


# -- the real restart on the local Ray cluster ----------------------------------------------------------


def _child_main(port: int, settings_json: str) -> None:
    """The bot in a child process, to be SIGKILLed mid-restart (CLUSTERBOT_FAULT)."""
    import aiohttp

    async def main() -> None:
        settings = Settings.model_validate_json(settings_json)
        connector = aiohttp.TCPConnector(resolver=FakeDiscordResolver(port), ssl=False)
        bot = ClusterBot(settings, restart_settings=RestartSettings(lease_s=3, stop_grace_s=3),
                         connector=connector, guild_ready_timeout=0.05)  # fmt: skip
        async with bot:
            await bot.start(settings.discord_token)

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())


@pytest.mark.timeout(300)
async def test_real_restart_of_the_local_cluster_with_a_bot_killed_mid_restart(
    ops_env: Env, cluster: Cluster, fake: FakeDiscord, tmp_path: Path
) -> None:
    """alice restarts `local` while bob's job runs; bob says OK, alice confirms; the bot (a child
    process) is killed right after the cluster stopped; a new bot resumes the restart where it was
    (same store, same lock holder) and reports old -> new job ids, mentioning bob."""
    from ops.jobs import active_jobs
    from ops.ray_api import RayApi
    from ops.store import open_store

    api = RayApi(cluster)
    alice_job = await asyncio.to_thread(api.submit, entrypoint="sleep 600", metadata={"user": "alice"})
    bob_job = await asyncio.to_thread(api.submit, entrypoint="sleep 600", metadata={"user": "bob"})
    world = World(fake, tmp_path, [])  # its people and settings; the bots use the session's store
    world.settings.config.windows = Windows(confirm_s=60, consent_s=60, grace_s=0.5, tick_s=0.1)
    bob = world.id["bob"]

    env = {**os.environ, "CLUSTERBOT_FAULT": "after:cluster_stopped"}
    with (tmp_path / "child.log").open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", f"from tests.test_discord_bot import _child_main; "
             f"_child_main({fake.port}, {world.settings.model_dump_json()!r})"],
            env=env, cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await fake.wait_connected(30)
        await asyncio.sleep(0.5)  # the session exists at IDENTIFY; READY and the guild follow
        text, private = await slash(world, "alice", "restart", cluster="local")
        assert private and "announced" in text, text
        ann = await fake.wait_for_message(lambda m: "asks to **restart local**" in m.content, channel="infra")
        [op_id] = {c.split(":", 3)[3] for c in ann.custom_ids}
        assert f"<@{bob}>: 1 job, not answered yet" in ann.content and "1 of alice's own" in ann.content
        assert ann.pinged == {int(bob)}
        assert await click(world, "bob", ann, "ok") == ("OK counted", True)
        assert await click(world, "alice", ann, "confirm") == ("confirmed", True)
        code = await asyncio.to_thread(child.wait, 120)
        log_tail = (tmp_path / "child.log").read_text()[-3000:]
        assert code == -9, log_tail  # killed by the fault, right after the cluster stopped
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert "stopped" in world.fake.messages_by_id[ann.id].content

    bot = ClusterBot(world.settings, ctx=Context(open_store(), load_registry(ops_env.registry)),
                     restart_settings=RestartSettings(lease_s=3, stop_grace_s=3),
                     connector=fake.connector(), guild_ready_timeout=0.05)  # fmt: skip
    async with run_bot(bot, fake):
        done = await report(world, op_id, timeout=180)
        jobs = await asyncio.to_thread(lambda: active_jobs(RayApi(cluster)))
        new = {j.owner: j.submission_id for j in jobs}
        assert set(new) == {"alice", "bob"} and {alice_job, bob_job}.isdisjoint(new.values())
        text, private = await slash(world, "mallory", "jobs", cluster="local")
        assert not private and new["bob"] in text and new["alice"] in text
        text, private = await slash(world, "mallory", "status", cluster="local")
        assert not private and "head: up" in text and "operation in progress: none" in text
    assert f"  bob: {bob_job} -> {new['bob']}" in done.content
    assert f"  alice: {alice_job} -> {new['alice']}" in done.content
    assert f"<@{bob}>" in done.content and int(bob) in done.pinged
    assert f"resuming {op_id} at step cluster_stopped" in world.fake.messages_by_id[ann.id].content
    assert current_lock(open_store(), "local") is None
    for sid in new.values():  # leave the cluster as the next test expects it: no active job
        await asyncio.to_thread(RayApi(cluster).stop, sid)
