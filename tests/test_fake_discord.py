"""The fake Discord (tests/fakes/discord_api.py) driven by a real discord.py commands.Bot."""

from __future__ import annotations

import asyncio

import discord
import pytest
import pytest_asyncio
from discord import app_commands
from discord.ext import commands

from tests.fakes.discord_api import (
    ADMINISTRATOR,
    EPHEMERAL,
    CommandHidden,
    FakeDiscord,
    FakeDiscordResolver,
    InteractionExpired,
    run_bot,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(30)]

CLUSTERS = ["v4-8", "v4-16", "v5e-8", "v5p-8"]


class RestartButton(discord.ui.View):
    """A persistent view: timeout=None, custom_id set, registered in setup_hook."""

    def __init__(self) -> None:
        super().__init__(timeout=None)

    @discord.ui.button(label="Restart", style=discord.ButtonStyle.danger, custom_id="panel:restart")
    async def restart(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await interaction.response.edit_message(
            content=f"restarting (asked by {interaction.user.name})", view=None
        )


class DeferButton(discord.ui.View):
    def __init__(self) -> None:
        super().__init__(timeout=None)

    @discord.ui.button(label="Refresh", custom_id="panel:refresh")
    async def refresh(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await interaction.response.defer()  # no thinking: nothing is posted
        await asyncio.sleep(0.05)
        await interaction.edit_original_response(content="refreshed")


class ClusterTestBot(commands.Bot):
    def __init__(self, fake: FakeDiscord) -> None:
        super().__init__(
            command_prefix="!",
            intents=discord.Intents.default(),
            connector=fake.connector(),
            guild_ready_timeout=0.05,
        )
        self.fake = fake
        self.late_error: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.synced: list[app_commands.AppCommand] = []
        self.last_interaction: discord.Interaction | None = None
        self.callback_message_ids: list[int | None] = []
        self.seen_messages: list[discord.Message] = []
        guild = discord.Object(fake.guild.id)
        tree = self.tree

        @tree.command(name="ping", description="Immediate answer", guild=guild)
        async def ping(interaction: discord.Interaction) -> None:
            self.last_interaction = interaction
            callback = await interaction.response.send_message(f"pong {interaction.user.mention}")
            self.callback_message_ids.append(callback.message_id)  # parsed from with_response=1

        @tree.command(name="slow", description="Defer then follow up", guild=guild)
        async def slow(interaction: discord.Interaction) -> None:
            await interaction.response.defer(thinking=True)
            await asyncio.sleep(0.1)
            await interaction.followup.send("slow work done", ephemeral=True)  # keeps the defer's visibility
            await interaction.followup.send("second follow-up", ephemeral=True)

        @tree.command(name="secret", description="Ephemeral answer", guild=guild)
        async def secret(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("only you can see this", ephemeral=True)

        @tree.command(name="panel", description="Post the control panel", guild=guild)
        async def panel(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("cluster v4-8: RUNNING", view=RestartButton())

        @tree.command(name="status", description="Cluster status", guild=guild)
        @app_commands.describe(cluster="Cluster name", verbose="More detail")
        async def status(interaction: discord.Interaction, cluster: str, verbose: bool = False) -> None:
            await interaction.response.send_message(f"{cluster}: RUNNING verbose={verbose}")

        @status.autocomplete("cluster")
        async def status_cluster(
            interaction: discord.Interaction, current: str
        ) -> list[app_commands.Choice[str]]:
            return [app_commands.Choice(name=c, value=c) for c in CLUSTERS if current in c][:25]

        @tree.command(name="purge", description="Admins only", guild=guild)
        @app_commands.default_permissions(administrator=True)
        async def purge(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("purged", ephemeral=True)

        @tree.command(name="late", description="Answers too late", guild=guild)
        async def late(interaction: discord.Interaction) -> None:
            await asyncio.sleep(fake.interaction_deadline + 0.3)
            try:
                await interaction.response.send_message("too late")
            except BaseException as exc:
                self.late_error.set_result(exc)
                raise
            self.late_error.set_result(None)

    async def on_message(self, message: discord.Message) -> None:
        self.seen_messages.append(message)

    async def setup_hook(self) -> None:
        self.add_view(RestartButton())
        self.add_view(DeferButton())
        self.synced = await self.tree.sync(guild=discord.Object(self.fake.guild.id))


@pytest_asyncio.fixture(loop_scope="function")
async def fake():
    async with FakeDiscord(users=("alice", "bob")) as f:
        yield f
    assert f.refused_hosts == []


@pytest_asyncio.fixture(loop_scope="function")
async def bot(fake: FakeDiscord):
    b = ClusterTestBot(fake)
    async with run_bot(b, fake):
        yield b
    assert fake.unknown_routes == [], fake.unknown_routes


async def test_login_ready_and_guild(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    assert bot.is_ready()
    assert bot.user is not None and bot.user.id == fake.bot_user.id
    assert bot.application_id == fake.application_id
    guild = bot.get_guild(fake.guild.id)
    assert guild is not None
    assert {c.name for c in guild.text_channels} >= {"general", "infra", "alerts"}
    assert guild.get_member(fake.bot_user.id) is not None
    assert fake.identifies and fake.identifies[0]["intents"] == discord.Intents.default().value
    assert bot.latency < 1.0  # the heartbeat was acknowledged


async def test_guild_command_sync(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    stored = {c["name"]: c for c in fake.guild_commands[fake.guild.id]}
    assert set(stored) == {"ping", "slow", "secret", "panel", "status", "purge", "late"}
    assert fake.global_commands == []
    assert {c.name for c in bot.synced} == set(stored)
    opts = {o["name"]: o for o in stored["status"]["options"]}
    assert opts["cluster"]["autocomplete"] is True and opts["cluster"]["required"] is True
    assert opts["verbose"]["type"] == 5
    # A second sync keeps the command ids, as Discord does.
    again = await bot.tree.sync(guild=discord.Object(fake.guild.id))
    assert {c.id for c in again} == {int(c["id"]) for c in stored.values()}


async def test_slash_immediate_response(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    alice = fake.user("alice")
    handle = await fake.slash("alice", "ping", channel="infra")
    answer = await handle.response()
    assert answer.type == 4 and answer.latency < 3.0
    assert not answer.ephemeral
    msg = await handle.wait_original()
    assert msg.content == f"pong <@{alice.id}>"
    assert msg.channel_id == fake.guild.channel("infra").id
    assert msg.pinged == {alice.id}  # a new public message with a mention pings
    assert msg in fake.messages("infra")
    assert bot.callback_message_ids == [msg.id]

    handle = await fake.slash("bob", "status", options={"cluster": "v4-16", "verbose": True})
    msg = await handle.wait_original()
    assert msg.content == "v4-16: RUNNING verbose=True"
    with pytest.raises(ValueError, match="required"):
        await fake.slash("bob", "status", options={"verbose": True})


async def test_slash_defer_and_followups(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    handle = await fake.slash("alice", "slow", channel="infra")
    answer = await handle.response()
    assert answer.type == 5 and not answer.ephemeral
    first = await handle.followup(0)
    second = await handle.followup(1)
    # The first follow-up replaced the public "thinking" message and stayed public ...
    assert first.id == handle.original.id and not first.ephemeral and not first.loading
    assert first.content == "slow work done" and first.edits == 1 and first.pinged == set()
    # ... the second one is a new message with its own (ephemeral) visibility.
    assert second.id != first.id and second.ephemeral and second.flags & EPHEMERAL
    assert [m.content for m in fake.messages("infra")] == ["slow work done"]


async def test_ephemeral_flag_recorded(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    handle = await fake.slash("alice", "secret")
    answer = await handle.response()
    assert answer.type == 4 and answer.ephemeral and answer.data["flags"] & EPHEMERAL
    msg = await handle.wait_original()
    assert msg.ephemeral and msg.content == "only you can see this"
    assert fake.messages("general") == []
    assert fake.messages("general", include_ephemeral=True) == [msg]


async def test_persistent_button_click_edits_message(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    posted = await (await fake.slash("alice", "panel", channel="infra")).wait_original()
    assert posted.custom_ids == ["panel:restart"]
    click = await fake.click("bob", posted, "panel:restart")
    answer = await click.response()
    assert answer.type == 7 and answer.latency < 3.0
    edited = await fake.wait_for_message(lambda m: m.id == posted.id and m.content.startswith("restarting"))
    assert edited.content == "restarting (asked by bob)"
    assert edited.components == [] and edited.history[0]["content"] == "cluster v4-8: RUNNING"
    with pytest.raises(ValueError, match="no component"):
        await fake.click("bob", edited, "panel:restart")


async def test_button_defer_then_edit_original_edits_the_message(
    bot: ClusterTestBot, fake: FakeDiscord
) -> None:
    channel = bot.get_channel(fake.guild.channel("infra").id)
    sent = await channel.send("panel", view=DeferButton())
    stored = fake.messages_by_id[sent.id]
    click = await fake.click("alice", stored, "panel:refresh")
    answer = await click.response()
    assert answer.type == 6
    msg = await fake.wait_for_message(lambda m: m.id == sent.id and m.content == "refreshed")
    assert len(fake.messages("infra")) == 1 and msg.edits == 1


async def test_autocomplete_returns_choices(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    choices = await fake.autocomplete("alice", "status", "cluster", "v4")
    assert choices == [{"name": "v4-8", "value": "v4-8"}, {"name": "v4-16", "value": "v4-16"}]
    assert await fake.autocomplete("alice", "status", "cluster", "zzz") == []


async def test_channel_message_sent_and_edited(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    alice, bob = fake.user("alice"), fake.user("bob")
    channel = bot.get_channel(fake.guild.channel("infra").id)
    sent = await channel.send(
        f"job 1 started for <@{alice.id}>", allowed_mentions=discord.AllowedMentions(users=True)
    )
    await sent.edit(content=f"job 1 finished for <@{alice.id}> and <@{bob.id}>")
    msg = await fake.wait_for_message(lambda m: "finished" in m.content, channel="infra")
    assert msg.id == sent.id and msg.author.id == fake.bot_user.id
    assert [v["content"] for v in msg.history] == [f"job 1 started for <@{alice.id}>"]
    assert msg.mentions == [alice.id, bob.id]
    assert msg.pinged == {alice.id}  # the edit added bob's mention but pinged nobody
    fetched = await channel.fetch_message(sent.id)
    assert fetched.content == msg.content and fetched.edited_at is not None
    # allowed_mentions=none: the mention is written but nobody is pinged.
    quiet = await channel.send(f"<@{bob.id}> FYI", allowed_mentions=discord.AllowedMentions.none())
    assert fake.messages_by_id[quiet.id].pinged == set()


async def test_unanswered_interaction_expires_and_late_answer_fails(
    bot: ClusterTestBot, fake: FakeDiscord
) -> None:
    handle = await fake.slash("alice", "late")
    with pytest.raises(InteractionExpired):
        await handle.response()
    assert handle.expired
    exc = await asyncio.wait_for(bot.late_error, 2.0)
    assert isinstance(exc, discord.NotFound) and exc.code == 10062
    [late] = handle.rejected_callbacks
    assert late.status == 404 and late.latency > fake.interaction_deadline
    assert late.error == {"message": "Unknown interaction", "code": 10062}


async def test_clean_shutdown_leaves_no_tasks() -> None:
    async with FakeDiscord() as f:
        b = ClusterTestBot(f)
        async with run_bot(b, f):
            await (await f.slash("alice", "ping")).response()
    await asyncio.sleep(0)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == [], others


class Ask(discord.ui.Modal, title="Reason"):
    reason = discord.ui.TextInput(label="Why?", custom_id="ask:reason")

    async def on_submit(self, interaction: discord.Interaction) -> None:
        await interaction.response.send_message(f"noted: {self.reason.value}", ephemeral=True)


class Pick(discord.ui.View):
    def __init__(self) -> None:
        super().__init__(timeout=None)

    @discord.ui.select(custom_id="pick:size", options=[discord.SelectOption(label=x) for x in ("8", "16")])
    async def size(self, interaction: discord.Interaction, select: discord.ui.Select) -> None:
        await interaction.response.send_modal(Ask())


async def test_select_then_modal_submit(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    channel = bot.get_channel(fake.guild.channel("alerts").id)
    sent = await channel.send("pick a size", view=Pick())
    with pytest.raises(ValueError, match="not options"):
        await fake.click("bob", fake.messages_by_id[sent.id], "pick:size", values=["32"])
    click = await fake.click("bob", fake.messages_by_id[sent.id], "pick:size", values=["16"])
    assert (await click.response()).type == 9
    assert click.modal["title"] == "Reason"
    submit = await fake.submit_modal("bob", click, {"ask:reason": "more TPUs"})
    answer = await submit.response()
    assert answer.ephemeral and answer.content == "noted: more TPUs"


async def test_gateway_resume_and_user_message(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    await fake.drop_gateway(4000)
    await fake.wait_until(lambda: fake.resumes and fake._active_session(), 5.0, "a resumed session")
    user_msg = await fake.post_user_message("alice", "general", "hello bot")
    seen = await fake.wait_until(
        lambda: [m for m in bot.seen_messages if m.id == user_msg.id], 5.0, "on_message after resume"
    )
    assert seen[0].content == ""  # no message_content intent: Discord withholds the content
    assert len(fake.identifies) == 1  # resumed, not re-identified
    handle = await fake.slash("alice", "ping")
    assert (await handle.response()).type == 4


async def test_limits_answer_invalid_form_body(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    channel = bot.get_channel(fake.guild.channel("alerts").id)
    view = discord.ui.View()
    view.add_item(discord.ui.Button(label="x", custom_id="x" * 101))
    with pytest.raises(discord.HTTPException) as info:
        await channel.send("bad", view=view)
    assert info.value.status == 400 and info.value.code == 50035
    with pytest.raises(discord.HTTPException) as info:
        await channel.send("y" * 2001)
    assert info.value.code == 50035
    assert fake.messages("alerts") == []


async def test_dm_to_a_user(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    alice = await bot.fetch_user(fake.user("alice").id)
    dm = await alice.send(f"{alice.mention} your job finished")
    stored = fake.messages_by_id[dm.id]
    assert stored.content.endswith("your job finished") and stored.guild_id is None
    assert fake.channel(stored.channel_id).recipients[0].username == "alice"


async def test_expired_interaction_token_rejects_edits(bot: ClusterTestBot, fake: FakeDiscord) -> None:
    handle = await fake.slash("alice", "ping")
    msg = await handle.wait_original()
    await bot.last_interaction.edit_original_response(content="edited in time")
    handle.expire_token()  # as if 15 minutes had passed
    with pytest.raises(discord.HTTPException) as info:
        await bot.last_interaction.edit_original_response(content="too late")
    assert info.value.status == 401 and info.value.code == 50027
    assert msg.content == "edited in time" and msg.edits == 1


async def test_resolver_sends_discord_hosts_to_the_fake_and_refuses_others() -> None:
    refused: list[str] = []
    resolver = FakeDiscordResolver(4433, refused)
    for host in ("discord.com", "gateway.discord.gg", "us-east1.discord.gg", "canary.discord.com"):
        [hit] = await resolver.resolve(host, 443)
        assert (hit["host"], hit["port"]) == ("127.0.0.1", 4433)
    for host in ("example.com", "notdiscord.com", "cdn.discordapp.com"):
        with pytest.raises(OSError):
            await resolver.resolve(host, 443)
    assert refused == ["example.com", "notdiscord.com", "cdn.discordapp.com"]


async def test_wrong_token_fails_login(fake: FakeDiscord) -> None:
    bot = commands.Bot(command_prefix="!", intents=discord.Intents.default(), connector=fake.connector())
    try:
        with pytest.raises(discord.LoginFailure):
            await bot.login("not-the-token")
    finally:
        await bot.close()


async def test_a_command_with_default_permissions_is_shown_to_admins_only(
    bot: ClusterTestBot, fake: FakeDiscord
) -> None:
    stored = {c["name"]: c for c in fake.guild_commands[fake.guild.id]}
    assert stored["purge"]["default_member_permissions"] == str(ADMINISTRATOR)
    assert stored["ping"]["default_member_permissions"] is None
    with pytest.raises(CommandHidden, match="/purge is not shown to alice"):
        await fake.slash("alice", "purge")
    assert not [i for i in fake.interactions.values() if i.name == "purge"]  # nothing reached the bot
    assert (await (await fake.slash(fake.owner, "purge")).response()).content == "purged"  # the owner
    fake.give_role("bob", fake.add_role("mods", permissions=ADMINISTRATOR))
    assert (await (await fake.slash("bob", "purge")).response()).content == "purged"
