"""Benchmark of the Discord bot: interaction acknowledgement latency under 50 concurrent slash
commands, start-up time, and idle memory.

The real bot (discord.py + the engine) runs against the fake Discord on 127.0.0.1 (tests/fakes), in
this process. The commands are a mix of `/status` and `/jobs` over the registry's clusters and
`/restart` requests; the GCP clusters' heads are not reachable from here, so the work after each
acknowledgement is a bounded probe in a thread: what is measured is what Discord measures, the time
from the interaction to its first callback (the 3-second deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil


def _rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def measure(concurrency: int, rounds: int) -> dict[str, Any]:
    rss_before = _rss_mib()
    t_import = time.perf_counter()
    from bot.adapters.discord_bot import ClusterBot
    from bot.config import BotConfig, Rights, Settings
    from ops.context import Context
    from ops.registry import load_registry
    from ops.store import LocalStore
    from tests.fakes.discord_api import FakeDiscord, run_bot

    import_s = time.perf_counter() - t_import
    people = [f"user{i}" for i in range(concurrency)]
    home = Path(tempfile.mkdtemp(prefix="cb-bench-bot-"))
    registry = load_registry()
    clusters = list(registry.clusters)
    async with FakeDiscord(users=people, roles={"infra-admin": 0}) as fake:
        settings = Settings(
            discord_token=fake.token,
            guild_id=fake.guild.id,
            infra_channel_id=fake.guild.channel("infra").id,
            config=BotConfig(rights=Rights(admin_roles=[str(fake.guild.role("infra-admin").id)])),
            config_path=None,
        )
        t0 = time.perf_counter()
        bot = ClusterBot(settings, ctx=Context(LocalStore(home / "store"), registry),
                         connector=fake.connector(), guild_ready_timeout=0.05)  # fmt: skip
        latencies: list[float] = []
        async with run_bot(bot, fake):
            startup_s = time.perf_counter() - t0
            await asyncio.sleep(2.0)
            rss_idle = _rss_mib()
            for r in range(rounds):
                handles = []
                for i, user in enumerate(people):
                    cluster = clusters[(i + r) % len(clusters)]
                    kind = ("status", "jobs", "restart")[i % 3]
                    options = {"cluster": cluster}
                    handles.append(fake.slash(user, kind, options, channel="infra"))
                started = await asyncio.gather(*handles)
                replies = await asyncio.gather(*(h.response(timeout=10) for h in started))
                latencies += [rep.latency for rep in replies]
                await asyncio.sleep(0.5)
            # let the work behind the acknowledgements finish before closing
            await asyncio.sleep(3.0)
    lat = sorted(latencies)
    return {
        "concurrency": concurrency,
        "rounds": rounds,
        "interactions": len(lat),
        "ack_p50_ms": 1000 * statistics.median(lat),
        "ack_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "ack_max_ms": 1000 * lat[-1],
        "over_3s": sum(1 for x in lat if x >= 3.0),
        "startup_s": startup_s,
        "import_s": import_s,
        "rss_process_before_import_mib": rss_before,
        "rss_idle_mib": rss_idle,
    }


def render(fig: dict[str, Any]) -> str:
    return "\n".join([
        f"bot benchmark: {fig['rounds']} round(s) of {fig['concurrency']} concurrent slash commands "
        f"({fig['interactions']} interactions) through the fake Discord",
        f"  acknowledgement latency  p50 {fig['ack_p50_ms']:.0f} ms   p99 {fig['ack_p99_ms']:.0f} ms   "
        f"max {fig['ack_max_ms']:.0f} ms   (target p99 <= 200 ms; {fig['over_3s']} over Discord's 3 s)",
        f"  start-up: imports {fig['import_s']:.2f} s, then constructor to ready (commands synced, engine "
        f"started) {fig['startup_s']:.2f} s",
        f"  idle RSS of the process (bot + fake Discord)  {fig['rss_idle_mib']:.0f} MiB "
        f"(interpreter before importing the bot: {fig['rss_process_before_import_mib']:.0f} MiB)",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench bot", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    os.environ.setdefault("CLUSTERBOT_HOME", tempfile.mkdtemp(prefix="cb-bench-home-"))
    fig = asyncio.run(measure(args.concurrency, args.rounds))
    print(render(fig))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(fig, indent=1))
    return 0
