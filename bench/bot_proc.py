"""One bot of the bot benchmark in a process of its own: `python -m bench.bot_proc clusterbot|minimal[-b]
COORDS` (COORDS: the fake Discord's JSON line), so that its RSS and start-up are its own.

Prints one JSON line when the bot is ready (import and start-up times), then runs until stdin closes
and closes the bot. clusterbot runs with the environment it is given (the benchmark's private home,
store and registry), its admin role and Ray job owners (user1, user2) mapped to chat users.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

T0 = time.perf_counter()
READY_TIMEOUT_S = 60.0


def build(which: str, coords: dict[str, Any], connector: Any) -> Any:
    if which.startswith("minimal"):  # minimal-b: a second copy of the reference, the noise floor
        from bench.minimal_bot import MinimalBot

        return MinimalBot(coords["guild_id"], coords["infra_channel_id"], connector=connector,
                          guild_ready_timeout=0.05)  # fmt: skip
    from bot.adapters.discord_bot import ClusterBot
    from bot.config import BotConfig, Rights, Settings
    from ops.context import Context

    users = coords["users"]
    config = BotConfig(
        rights=Rights(admin_roles=[str(coords["admin_role_id"])]),
        owners={u: str(users[u]) for u in ("user1", "user2") if u in users},
    )
    settings = Settings(
        discord_token=coords["token"],
        guild_id=coords["guild_id"],
        infra_channel_id=coords["infra_channel_id"],
        config=config,
        config_path=None,
    )
    return ClusterBot(settings, ctx=Context(), connector=connector, guild_ready_timeout=0.05)


async def run(which: str, coords: dict[str, Any]) -> None:
    import aiohttp

    from tests.fakes.discord_api import FakeDiscordResolver

    if not which.startswith("minimal"):
        import bot.adapters.discord_bot  # noqa: F401  # counted as import time, as before
    imported = time.perf_counter()
    connector = aiohttp.TCPConnector(resolver=FakeDiscordResolver(coords["port"]), ssl=False)
    bot = build(which, coords, connector)
    task = asyncio.create_task(bot.start(coords["token"]))
    deadline = time.perf_counter() + READY_TIMEOUT_S
    while not bot.is_ready():
        if task.done():
            task.result()
            raise RuntimeError("the bot stopped before it was ready")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{which} bot not ready after {READY_TIMEOUT_S} s")
        await asyncio.sleep(0.01)
    ready = time.perf_counter()
    print(json.dumps({"import_s": imported - T0, "startup_s": ready - imported}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the benchmark closes our stdin
    await bot.close()
    try:
        await asyncio.wait_for(task, 10)
    except (TimeoutError, asyncio.CancelledError):
        task.cancel()


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], json.loads(sys.argv[2])))
