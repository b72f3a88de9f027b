"""Secrets stay where they belong, through a whole bot-driven restart on the real local cluster.

The bot's own token (DISCORD_TOKEN, in the bot's environment) must reach no job, no log, no store
object and no chat message. A job's env-var secret must be kept (a faithful resubmission needs it),
but only in the store's private (0600) job backups: never in a journal, an operation record, a chat
message or our logs. Ray's own runtime-env agent logs job env vars on the head: Ray's, out of scope.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path

import pytest

from bot.adapters.recorder import ManualClock, Recorder
from bot.config import BotConfig, Rights, Windows
from bot.operations import registered
from bot.protocol.engine import Engine
from bot.protocol.model import State, User
from ops.context import Context
from ops.drivers.local import LocalDriver
from ops.ray_api import RayApi
from ops.registry import Cluster, load_registry
from ops.restart import Settings
from ops.store import open_store
from tests.localray import Env, wait_for

BOT_TOKEN = "MTA-canary-bot-token.Xy9z.never-anywhere-7f3a"
ENV_SECRET = "canary-wandb-key-only-in-0600-backups-51c2"
RAYS_OWN = {"runtime_env_agent.log"}  # Ray logs every job's runtime_env here (out of scope)
ALICE = User(id="2001", name="alice")
BOB = User(id="2002", name="bob")


def _files_with(root: Path, needle: str) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and needle.encode() in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


async def test_a_bot_driven_restart_leaks_neither_the_bot_token_nor_a_jobs_secret(
    ops_env: Env, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("DISCORD_TOKEN", BOT_TOKEN)  # the bot's process: the new head is started from it
    api = RayApi(cluster)
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(
        "import os, time\nprint(sorted(os.environ.items()), flush=True)\ntime.sleep(900)\n"
    )
    env = {"working_dir": str(work), "env_vars": {"WANDB_API_KEY": ENV_SECRET}}
    sid = api.submit(entrypoint="python job.py", metadata={"user": "bob"}, runtime_env=env)
    wait_for(lambda: api.status(sid) == "RUNNING", 60, "bob's job to run")

    clock = ManualClock()
    config = BotConfig(
        rights=Rights(), windows=Windows(tick_s=0.05), owners={"alice": ALICE.id, "bob": BOB.id}
    )
    chat = Recorder()
    store = open_store()
    ctx = Context(store, load_registry(ops_env.registry))
    engine = Engine(ctx, config, chat, registered(Settings(lease_s=3)), clock=clock)
    await engine.start()
    try:
        r = await engine.request(ALICE, "restart", "local")
        assert r.ok, r.text
        op_id = next(o.op_id for o in engine.ops.values() if o.open)
        await engine.act(BOB, op_id, "ok")
        await engine.act(ALICE, op_id, "confirm")
        clock.advance(config.windows.grace_s)
        await engine.tick()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 240
        while engine.ops[op_id].state not in (State.DONE, State.FAILED):
            assert loop.time() < deadline, "the restart did not finish"
            await asyncio.sleep(0.2)
    finally:
        await engine.close()
    assert engine.ops[op_id].state == State.DONE, engine.ops[op_id].error

    # The resubmitted job runs with its secret (faithful), and without the bot's token.
    new_id = next(d.submission_id for d in api.list_jobs()
                  if (d.metadata or {}).get("clusterbot_resubmitted_from") == sid)  # fmt: skip
    wait_for(lambda: "WANDB_API_KEY" in api.jobs.get_job_logs(new_id), 60, "the resubmitted job's output")
    logs = api.jobs.get_job_logs(new_id)
    assert ENV_SECRET in logs and BOT_TOKEN not in logs and "DISCORD_TOKEN" not in logs

    # The bot's token is nowhere: head logs (every session of this head), the store, chat, our logs.
    head_dir = LocalDriver(cluster).temp_dir
    assert _files_with(head_dir, BOT_TOKEN) == []
    store_root = Path(store.url)
    assert _files_with(store_root, BOT_TOKEN) == []
    said = "\n".join(m.text for _, _, m in chat.log) + "\n" + caplog.text + r.text
    assert BOT_TOKEN not in said

    # The job's secret: only in private backups, never in a journal, a record, chat, or our logs.
    holders = _files_with(store_root, ENV_SECRET)
    assert holders, "the backup must keep the job's env vars to resubmit it faithfully"
    for path in holders:
        assert "/jobs/" in path.as_posix(), f"{path} holds the job's secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in store_root.rglob("*"):
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, path
    assert ENV_SECRET not in said
    the_jobs_own = (f"job-driver-{sid}", f"job-driver-{new_id}")  # it prints its environment
    leaked = [p for p in _files_with(head_dir, ENV_SECRET)
              if p.name not in RAYS_OWN and not p.name.startswith(the_jobs_own)]  # fmt: skip
    assert leaked == [], f"the job's secret is in head logs that are not Ray's own or the job's: {leaked}"
