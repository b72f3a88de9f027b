"""The terminal chat (the local default), driven as people drive it: a child process reading a script
from standard input (or typing at a pseudo-terminal), with the session's isolated environment and a
bot config with windows in seconds, against the session's real local Ray cluster.

Each test has its own store (locks, operations, backups), so what one leaves pending never meets
another; the Ray cluster is the session's.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import pytest
import yaml
from pydantic import Field

from bot.adapters.terminal import Console, TerminalChat
from bot.adapters.terminal.commands import Terminal
from bot.config import DEFAULT_CONFIG, BotConfig, Rights, Settings
from bot.protocol.engine import Engine
from bot.protocol.model import (
    AdminOnly,
    Button,
    ClusterParams,
    Look,
    Message,
    Operation,
    Outcome,
    Params,
    Spec,
    State,
)
from ops.context import Context
from ops.jobs import active_jobs
from ops.locks import current_lock
from ops.ray_api import RayApi
from ops.registry import DEFAULT_REGISTRY, Cluster, load_registry
from ops.restart import Settings as RestartSettings
from ops.restart import start_restart
from ops.store import LocalStore, read_model
from tests.localray import Env, Result, free_ports, wait_for

REPO = Path(__file__).resolve().parent.parent
TERMINAL = [sys.executable, "-m", "bot"]  # no DISCORD_TOKEN in the tests' environment: the terminal
FAST = """\
rights: {admins: [admin]}
windows: {confirm_s: 120, consent_s: 120, grace_s: 1, tick_s: 0.2}
"""


def environment(
    ops_env: Env, tmp_path: Path, config: str | None, user: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "CLUSTERBOT_", "DISCORD_"))}
    env.update(ops_env.vars, CLUSTERBOT_STORE=str(tmp_path / "store"), LOGNAME=user, USER=user)
    env.update(extra or {})
    if config is not None:
        cfg = tmp_path / "bot.yaml"
        cfg.write_text(config)
        env["CLUSTERBOT_BOT_CONFIG"] = str(cfg)
    return env


def chat(
    ops_env: Env,
    tmp_path: Path,
    script: str,
    config: str | None = FAST,
    user: str = "alice",
    timeout: float = 300,
    extra: dict[str, str] | None = None,
) -> Result:
    """Run the terminal chat on `script` (its standard input is not a terminal: script mode)."""
    proc = subprocess.run(
        TERMINAL,
        input=textwrap.dedent(script),
        capture_output=True,
        text=True,
        env=environment(ops_env, tmp_path, config, user, extra),
        timeout=timeout,
        cwd=REPO,
    )
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, result
    return result


def operations(tmp_path: Path) -> dict[str, Operation]:
    store = LocalStore(tmp_path / "store")
    ops = [read_model(store, key, Operation) for key in store.list("bot/ops/")]
    return {got[0].op_id: got[0] for got in ops if got}


def test_a_restart_from_a_script_keeps_bobs_job(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    r = chat(
        ops_env,
        tmp_path,
        """\
        # bob has a job; alice restarts; carol submits one after the announcement; bob agrees; alice confirms
        /as bob
        /submit sleep 600
        /as alice
        /restart local
        /as carol
        /submit sleep 700
        /as bob
        ok
        /as alice
        confirm
        /wait-state newest done 240
        """,
    )
    out = r.out
    assert r.code == 0, r
    assert f"[clusterbot] local cluster already up, dashboard at {cluster.dashboard_url}" in out
    old_id = re.search(r"^\[to bob\] submitted (\S+) on local as bob: sleep 600$", out, re.M).group(1)
    op_id = re.search(r"^\[#infra (\d+)\] alice asks to restart local \((local-[\w-]+)\)$", out, re.M)
    mid, op_id = op_id.groups()
    announcement = out[out.index(f"[#infra {mid}]") :]
    asked = announcement.splitlines()[1]
    assert "1 running or pending job(s) on local: @bob: 1 job, not answered yet" in asked
    assert "[buttons: confirm, ok, delay 10, delay 30, object, skip, cancel, override]" in announcement
    assert f"[to alice] announced {op_id} in #infra (#infra message {mid}): type confirm to go ahead" in out
    # the consent lines: bob's OK edits the announcement, then alice's confirmation starts the countdown
    assert f"[to bob] OK counted ({op_id})" in out
    assert re.search(rf"^\[#infra edit {mid}\] .*@bob: 1 job, OK$", out, re.M), out
    assert "consent: every affected owner agreed" in out
    assert f"[to alice] confirmed ({op_id})" in out
    countdown = (
        rf"^\[#infra edit {mid}\] consent reached \(every affected owner agreed\); "
        rf"starting \d\d:\d\d:\d\d UTC unless cancelled$"
    )
    assert re.search(countdown, out, re.M), out
    assert re.search(rf"^\[#infra edit {mid}\] executing…$", out, re.M), out
    # the report: a new message, old -> new job id for bob, bob mentioned
    report = out[out.index(f"restart local is done ({op_id}), asked by alice") :]
    new_id = re.search(rf"^\s+bob: {re.escape(old_id)} -> (\S+)$", report, re.M).group(1)
    assert "your jobs were resubmitted: @bob @carol" in report
    carol_id = re.search(r"^\[to carol\] submitted (\S+) on local as carol: sleep 700$", out, re.M).group(1)
    assert f"submitted after the announcement, preserved too: {carol_id} (carol)" in report
    assert f"[clusterbot] {op_id} is done" in out
    assert operations(tmp_path)[op_id].state == State.DONE
    assert current_lock(LocalStore(tmp_path / "store"), "local") is None

    api = RayApi(cluster)

    def running() -> object:
        return next((j for j in active_jobs(api) if (j.submission_id, j.status) == (new_id, "RUNNING")), None)

    job = wait_for(running, 60, f"bob's resubmitted job {new_id} running")
    assert job.owner == "bob" and job.entrypoint == "sleep 600"
    for j in active_jobs(api):  # a clean slate for the next test (else its fixture restarts the head)
        api.stop(j.submission_id)
    wait_for(lambda: not active_jobs(api), 30, "bob's and carol's jobs stopped")


def test_a_local_cluster_a_restart_stopped_is_left_to_it_then_booted_by_ops_local_up(
    ops_env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Booting is one ops call for the terminal's start-up and `ops local up`: a local cluster that a
    restart in progress stopped is left to that restart (starting it would race it) by both; once the
    restart is gone, `ops local up` starts it and returns when it accepts jobs."""
    raw = yaml.safe_load(ops_env.registry.read_text())  # a local cluster of this test's own, down
    ports = free_ports()
    raw["clusters"]["local"]["local_ports"] = ports
    raw["clusters"]["local"]["dashboard_url"] = f"http://127.0.0.1:{ports['dashboard']}"
    (tmp_path / "home").mkdir()
    registry_path = tmp_path / "home" / "clusters.yaml"
    registry_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    extra = {"CLUSTERBOT_REGISTRY": str(registry_path), "CLUSTERBOT_HOME": str(tmp_path / "home"),
             "CLUSTERBOT_STORE": str(tmp_path / "store")}  # fmt: skip
    for name, value in extra.items():  # the in-process driver finds the same state dir (its pid file)
        monkeypatch.setenv(name, value)
    ctx = Context(LocalStore(tmp_path / "store"), load_registry(registry_path))
    down = ctx.cluster("local")
    run = start_restart(ctx, down, "frank", True, RestartSettings(lease_s=3600))  # begun: its record exists
    try:
        held = current_lock(ctx.store, "local").describe()
        r = chat(ops_env, tmp_path, "/submit sleep 1\n", extra=extra)
        assert r.code == 0, r
        assert f"[clusterbot] local cluster down: {held} brings it back (not started here)" in r.out
        assert "[to alice] refused: " in r.out  # nothing to submit to
        up = ops_env.ops("local", "up", extra_env=extra)
        assert up.code == 0 and f"local cluster down: {held} brings it back" in up.out, up
        assert not ctx.driver(down).is_up()
    finally:
        run.lease.release()
    try:
        up = ops_env.ops("local", "up", extra_env=extra)
        assert up.code == 0 and "starting the local Ray cluster" in up.err, up
        assert up.out.startswith("local cluster up (pid "), up
        # accepted at once: `local up` returned only once the job agent took a submission
        r = ops_env.ops("submit", "--cluster", "local", "--as", "dora", "--", "true", extra_env=extra)
        assert r.code == 0 and r.out.startswith("submitted "), r
    finally:
        ctx.driver(down).stop()
        ctx.close()
    assert not ctx.driver(down).is_up()


def test_a_token_rotation_that_began_is_left_to_bring_the_local_cluster_back(tmp_path: Path) -> None:
    """A rotation is a restart too (it stops the head and starts it with the new token): booting the
    cluster under it would race it, as under a restart."""
    from ops.local import restart_bringing_back
    from ops.locks import acquire
    from ops.restart import RestartRecord, _record_key
    from ops.store import dump

    store = LocalStore(tmp_path / "store")
    ctx = Context(store, load_registry(DEFAULT_REGISTRY))
    cluster = ctx.cluster("local")
    lease = acquire(store, "local", "local-rot-1", "rotate-token", "frank", lease_s=60)
    try:
        assert restart_bringing_back(ctx, cluster) is None  # only announced: nothing stopped yet
        record = RestartRecord(op_id="local-rot-1", cluster="local", requested_by="frank",
                               preserve_jobs=True, created_at=datetime.now(UTC))  # fmt: skip
        store.put(_record_key("local", "local-rot-1"), dump(record))
        assert restart_bringing_back(ctx, cluster) == current_lock(store, "local").describe()
    finally:
        lease.release()


def readme_tour() -> str:
    """The tour in the README, as written there (an indented block, comments included)."""
    text = (REPO / "README.md").read_text()
    lines: list[str] = []
    for line in text[text.index("a first tour:") :].splitlines()[1:]:
        if line.startswith("    "):
            lines.append(line[4:])
        elif lines and line.strip():
            break
    return "\n".join(lines) + "\n"


def test_the_readme_tour_piped_into_the_bot_ends_with_bobs_job_back(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """`python -m bot < tour.txt`: the script ends at alice's `confirm`, in the countdown; the terminal
    keeps its clock running, waits for the restart and its report, and bob's job runs under a new id."""
    tour = readme_tour()
    assert tour.rstrip().splitlines()[-1].startswith("confirm") and "/wait" not in tour, tour
    r = chat(ops_env, tmp_path, tour)
    out = r.out
    assert r.code == 0, r
    old_id = re.search(r"^\[to bob\] submitted (\S+) on local as bob: sleep 600$", out, re.M).group(1)
    op_id = re.search(r"^\[#infra \d+\] alice asks to restart local \((local-[\w-]+)\)$", out, re.M).group(1)
    assert f"[clusterbot] end of script: waiting (at most 15 min) for {op_id}" in out
    report = out[out.index(f"restart local is done ({op_id}), asked by alice") :]
    new_id = re.search(rf"^\s+bob: {re.escape(old_id)} -> (\S+)$", report, re.M).group(1)
    assert "your jobs were resubmitted: @bob" in report
    assert "left pending" not in out and "refused" not in out
    assert operations(tmp_path)[op_id].state == State.DONE
    assert current_lock(LocalStore(tmp_path / "store"), "local") is None

    api = RayApi(cluster)
    job = wait_for(
        lambda: next((j for j in active_jobs(api) if j.submission_id == new_id), None), 60, f"job {new_id}"
    )
    assert job.owner == "bob" and job.entrypoint == "sleep 600" and job.status in ("RUNNING", "PENDING")
    for j in active_jobs(api):
        api.stop(j.submission_id)
    wait_for(lambda: not active_jobs(api), 30, "bob's job stopped")


def test_bad_input_and_wrong_users_change_nothing(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    r = chat(
        ops_env,
        tmp_path,
        """\
        /restart nowhere
        /restrat local
        restart local
        /restart local --presrve
        confirm
        /submit
        /restart local

        /restart local
        /as bob
        confirm
        ok
        override
        cancel
        /unlock local
        /restart big-run
        /as admin
        /restart big-run
        /unlock local
        /show
        """,
    )
    out = r.out
    assert r.code == 0, r
    lines = [line for line in out.splitlines() if line.startswith("[to ")]
    expected = [
        "[to alice] refused: unknown cluster 'nowhere'; valid: ",
        "[to alice] refused: unknown command /restrat; did you mean /restart?",
        "[to alice] refused: unknown command restart; did you mean /restart?",
        "[to alice] refused: unknown flag --presrve; did you mean --no-preserve-jobs?",
        "[to alice] refused: there is no open operation to confirm",
        "[to alice] refused: usage: /submit ENTRYPOINT...",
        "[to alice] announced local-",
        "[to alice] refused: local is busy: restart local-",
        "[to bob] refused: only alice (who asked) can confirm",
        "[to bob] refused: only people whose jobs this stops can answer for them",
        "[to bob] refused: only an admin can override",
        "[to bob] refused: only alice (who asked) or an admin can cancel",
        "[to bob] refused: only an admin can force-unlock a cluster",
        "[to bob] refused: big-run is protected: only read-only commands, unless an admin passes override",
        "[to admin] refused: big-run is protected",
        "[to admin] admin force-unlocked local (was: restart local-",
        "[to admin] alice asks to restart local (local-",  # /show: the announcement as it reads now
    ]
    assert len(lines) == len(expected), out
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start), f"{line!r} does not start with {start!r}\n{out}"
    assert "consent reached" not in out and "executing" not in out
    (op,) = operations(tmp_path).values()  # one operation was announced, and it was cancelled
    assert op.state == State.CANCELLED and op.cancelled_by == "admin (force-unlock)" and not op.confirmed
    assert re.search(
        r"^\[#infra edit \d+\] cancelled by admin \(force-unlock\); nothing was done$", out, re.M
    )
    assert out.rstrip().splitlines()[-1].strip() == "cancelled by admin (force-unlock); nothing was done"
    assert current_lock(LocalStore(tmp_path / "store"), "local") is None


def test_links_force_unbacked_and_skip_as_terminal_words(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """/link and /unlink; --force-unbacked for admins only (and kept with the request); `skip` by an
    owner whose job the restart would stop."""
    r = chat(
        ops_env,
        tmp_path,
        """\
        /as carol
        /link carol-ray          # carol's Ray jobs run as carol-ray
        /submit sleep 600        # a job of carol's own chat name, for `skip`
        /unlink carol-ray
        /restart local --force-unbacked
        /as admin
        /restart local --force-unbacked
        /unlink carol-ray
        /as carol
        skip
        /as admin
        cancel
        """,
    )
    out = r.out
    assert r.code == 0, r
    lines = [line for line in out.splitlines() if line.startswith("[to ")]
    expected = [
        "[to carol] ",  # linked
        "[to carol] submitted ",
        "[to carol] refused: only an admin can unlink a Ray user",
        "[to carol] refused: force_unbacked (restart without a backup when the head does not answer) is "
        "for admins",
        "[to admin] announced local-",
        "[to admin] ",  # unlinked
        "[to carol] OK counted; your 1 job will be backed up but not resubmitted",
        "[to admin] cancelled local-",
    ]
    assert len(lines) == len(expected), out
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start) and "refused" not in line.replace(start, ""), (line, start, out)
    assert "carol-ray" in lines[0] and "carol-ray" in lines[5]
    (op,) = operations(tmp_path).values()
    assert op.params["force_unbacked"] is True and op.requester.name == "admin"
    assert op.state == State.CANCELLED
    assert set(op.skip_resubmit.values()) == {"carol"}
    api = RayApi(cluster)
    for j in active_jobs(api):
        api.stop(j.submission_id)
    wait_for(lambda: not active_jobs(api), 30, "carol's job stopped")


def test_pending_operations_stay_persisted_and_the_next_start_picks_them_up(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    first = chat(ops_env, tmp_path, "/restart local\n")
    assert first.code == 0, first
    (op,) = operations(tmp_path).values()
    assert op.state == State.AWAITING and op.requester.name == "alice"
    assert f"left pending (persisted; the next start picks them up): {op.op_id} (awaiting)" in first.out
    store = LocalStore(tmp_path / "store")
    assert current_lock(store, "local").op_id == op.op_id  # still held for the next start

    second = chat(ops_env, tmp_path, "/ops\ncancel\n")
    assert second.code == 0, second
    assert f"picked up: {op.op_id} (awaiting)" in second.out
    assert f"[to alice] {op.op_id}  restart local by alice: awaiting" in second.out
    assert f"[to alice] cancelled {op.op_id}" in second.out
    assert operations(tmp_path)[op.op_id].state == State.CANCELLED
    assert current_lock(store, "local") is None


@pytest.mark.skipif(DEFAULT_CONFIG.exists(), reason=f"{DEFAULT_CONFIG} exists: it would be the config")
def test_without_a_config_file_the_user_named_admin_is_an_admin(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    r = chat(ops_env, tmp_path, "/help\n/unlock local\n/as admin\n/unlock local\n", config=None)
    assert r.code == 0, r
    assert "with no bot config file, the user named admin is an admin (/as admin)" in r.out
    assert "windows: confirm 10 min, consent 15 min, grace 2 min" in r.out  # the real defaults
    assert "[to alice] refused: only an admin can force-unlock a cluster" in r.out
    assert "[clusterbot] you are now admin (an admin)" in r.out
    assert "[to admin] local was not locked" in r.out


def test_a_wrong_bot_config_is_one_line(ops_env: Env, tmp_path: Path) -> None:
    proc = subprocess.run(
        TERMINAL,
        input="/status\n",
        capture_output=True,
        text=True,
        env=environment(ops_env, tmp_path, "windows: {grace_s: soon}\n", "alice"),
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert (
        line.startswith("clusterbot: ") and "windows.grace_s" in line and str(tmp_path / "bot.yaml") in line
    )


def test_interactive_prompt_while_timers_run(ops_env: Env, cluster: Cluster, tmp_path: Path) -> None:
    """At a pseudo-terminal: the prompt names the acting user, and the engine's clock runs while the
    chat waits for a line (an unconfirmed request expires with nobody typing)."""
    config = "windows: {confirm_s: 2, consent_s: 60, grace_s: 1, tick_s: 0.2}\n"
    master, slave = os.openpty()
    proc = subprocess.Popen(
        TERMINAL,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environment(ops_env, tmp_path, config, "alice") | {"TERM": "dumb"},
        cwd=REPO,
        start_new_session=True,
    )
    os.close(slave)
    seen = ""

    def until(pattern: str, timeout: float = 60) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while not re.search(pattern, seen, re.M):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout:.0f}s in:\n{seen}")
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    pass

    try:
        until(r"alice> ")
        os.write(master, b"/restart local\n")
        until(r"waiting for alice to Confirm")
        until(r"expired: alice did not confirm in time; nothing was done", timeout=30)  # nobody typed
        os.write(master, b"/as bob\n")
        until(r"bob> ")
        os.write(master, b"/quit\n")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    (op,) = operations(tmp_path).values()
    assert op.state == State.EXPIRED
    assert current_lock(LocalStore(tmp_path / "store"), "local") is None


@pytest.mark.parametrize("at", [datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)])
async def test_the_chat_prints_posts_edits_and_mentions_plainly(at: datetime) -> None:
    class Out:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

    out = Out()
    chat = TerminalChat(Console(out))
    assert chat.mention("bob") == "@bob" and chat.when(at) == "03:04:05 UTC" and chat.when(None) == "-"
    mid = await chat.post(Message("**alice** asks to restart (`op1`)\nwaiting", [Button("confirm", "Confirm"),
                                  Button("delay", "Delay 10 min", arg="10")], ["bob"]))  # fmt: skip
    await chat.edit(
        mid, Message("**alice** asks to restart (`op1`)\nconfirmed", [Button("cancel", "Cancel")])
    )
    await chat.edit(
        mid, Message("**alice** asks to restart (`op1`)\nconfirmed", [Button("cancel", "Cancel")])
    )
    await chat.edit("7", Message("from an earlier life\ntwo lines"))  # unknown: printed whole
    assert out.text == (
        "[#infra 1] alice asks to restart (op1)\n"
        "           waiting\n"
        "           [buttons: confirm, delay 10]\n"
        "[#infra edit 1] confirmed\n"
        "                [buttons: cancel]\n"
        "[#infra edit 7] from an earlier life\n"
        "                two lines\n"
    )


class Say(Params):
    text: str = Field(description="What to say in #infra")
    loud: Annotated[bool, AdminOnly("loud (mention everyone)")] = False


class Drain(ClusterParams):
    minutes: int = Field(5, ge=1, le=60, description="How long to drain")


async def test_operations_declared_only_as_specs_are_terminal_commands(tmp_path: Path) -> None:
    """The terminal offers every operation of the engine from its spec, with no line of its own:
    `/<kind> [CLUSTER] [VALUE ...] [name=value ...] [--flag]`; the engine judges the values."""
    said: list[str] = []

    def say(engine, op, lease, progress):  # noqa: ANN001, ANN202
        said.append(op.params["text"])
        return Outcome(f"said {op.params['text']!r}", owners=[])

    def drain(engine, op, lease, progress):  # noqa: ANN001, ANN202
        raise AssertionError("nobody confirmed: the drain must not run")

    nothing = lambda engine, cluster, user, params: Look([], [])  # noqa: E731
    specs = {
        "say": Spec("say", "announce", nothing, say, params=Say, needs_cluster=False, summary="Say it"),
        "drain": Spec("drain", "full", nothing, drain, params=Drain, summary="Drain a cluster"),
    }

    class Out:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

    out = Out()
    console = Console(out)
    config = BotConfig(rights=Rights(admins=["admin"]))
    settings = Settings(
        discord_token=None, guild_id=None, infra_channel_id=None, config=config, config_path=None
    )
    ctx = Context(LocalStore(tmp_path / "store"), load_registry())
    engine = Engine(ctx, config, TerminalChat(console), specs)
    term = Terminal(engine, console, settings, "alice", "admins: admin")
    for line in ("/help", "/say hello", "/say 'hi there' --loud", "/say text=again local", "/say",
                 "/drain", "/drain nowhere", "/drain local --overide", "/drain local minutes=99",
                 "/drain local minutes=7"):  # fmt: skip
        await term.handle(line)
    await engine.wait_executing(10)
    await engine.close()

    text = out.text
    shown = [line.strip() for line in text.splitlines()]
    i = shown.index("/say TEXT [--loud]")  # /help: each operation's usage, summary and parameters
    assert shown[i : i + 4] == [
        "/say TEXT [--loud]",
        "Say it",
        "text: What to say in #infra",
        "loud (--loud)",
    ]
    assert shown[i + 4 : i + 8] == [
        "/drain CLUSTER [minutes=5] [--override]",
        "Drain a cluster",
        "override (--override): Admins only: allow a protected cluster (big-run)",
        "minutes: How long to drain",
    ]
    replies = [line for line in text.splitlines() if line.startswith("[to ")]
    expected = [
        "[to alice] say announced in #infra (#infra message 1) and started",
        "[to alice] refused: loud (mention everyone) is for admins",
        "[to alice] refused: too many words: local (usage: /say TEXT [--loud])",
        "[to alice] refused: bad parameters for /say: text: Field required",
        "[to alice] refused: /drain needs a cluster; valid: ",
        "[to alice] refused: unknown cluster 'nowhere'; valid: ",
        "[to alice] refused: unknown flag --overide; did you mean --override? (usage: /drain CLUSTER",
        "[to alice] refused: bad parameters for /drain: minutes: Input should be less than or equal to 60",
        "[to alice] announced local-",
    ]
    assert len(replies) == len(expected), text
    for line, start in zip(replies, expected, strict=True):
        assert line.startswith(start), f"{line!r} does not start with {start!r}\n{text}"
    assert said == ["hello"]
    (drained,) = [op for op in engine.ops.values() if op.kind == "drain"]
    assert drained.cluster == "local" and drained.params == {"override": False, "minutes": 7}
    assert drained.state == State.AWAITING


def test_a_bot_killed_mid_restart_finishes_it_once_on_its_next_start(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    """The bot dies while the restart runs (right after the cluster was stopped); started again with
    nothing to do, it picks the executing operation up, finishes it, and bob's job comes back once."""
    api = RayApi(cluster)
    old_id = api.submit(entrypoint="sleep 600", metadata={"user": "bob"})
    script = """\
        /restart local
        /as bob
        ok
        /as alice
        confirm
        /wait-state newest done 240
        """
    env = environment(ops_env, tmp_path, FAST, "alice") | {"CLUSTERBOT_FAULT": "after:cluster_stopped"}
    killed = subprocess.run(TERMINAL, input=textwrap.dedent(script), capture_output=True, text=True,
                            env=env, timeout=300, cwd=REPO)  # fmt: skip
    assert killed.returncode == -9, killed.stdout + killed.stderr
    (op,) = operations(tmp_path).values()
    assert op.state == State.EXECUTING

    again = chat(ops_env, tmp_path, "# nothing to do: whatever was executing is finished first\n")

    assert again.code == 0, again
    assert operations(tmp_path)[op.op_id].state == State.DONE
    assert f"restart local is done ({op.op_id})" in again.out
    assert "your jobs were resubmitted: @bob" in again.out
    copies = [d for d in api.list_jobs() if (d.metadata or {}).get("clusterbot_resubmitted_from") == old_id]
    assert len(copies) == 1
    api.stop(copies[0].submission_id)
    wait_for(lambda: not active_jobs(api), 30, "bob's job stopped")


def test_health_and_an_alert_as_it_fires_in_the_terminal(
    ops_env: Env, cluster: Cluster, tmp_path: Path
) -> None:
    config = FAST + "alerts: {clusters: [local, us-central2], fire_after: 1}\n"
    script = "/health local\n/check\nsilence 4h us-central2\n/health nowhere\n"
    r = chat(ops_env, tmp_path, script, config=config)
    assert r.code == 0, r
    assert "local: HEALTHY" in r.out, r.out
    assert "checked: local healthy, us-central2 " in r.out
    # us-central2's head cannot be reached from here: its alert prints in #infra as it fires.
    assert "us-central2 is " in r.out and "[buttons: restart, silence 1h, silence 4h, silence 24h]" in r.out
    assert "[to alice] us-central2's alerts are silenced until" in r.out
    assert "refused: unknown cluster 'nowhere'" in r.out
