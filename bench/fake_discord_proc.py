"""The fake Discord (tests/fakes/discord_api.py) in a process of its own, driven by the bot benchmark
over stdin/stdout, one JSON object per line.

Why a process: in the bot's process it shared the event loop (its latencies were the bot's too) and
the RSS figure. Here it is what Discord is to a bot: another program that dispatches interactions and
times their answers (`python -m bench.fake_discord_proc USERS`).

On start it prints its coordinates (port, token, guild, #infra, the admin role, user ids). Requests:
- `{"op": "connected", "timeout": s}`: wait until a bot has identified on the gateway;
- `{"op": "burst", "users": [...], "name": "jobs", "options": {...}}`: one slash command per user, all
  at once; or with `"message_id"` and `"custom_id"`: one click per user on that message;
- `{"op": "buttons"}`: the newest #infra message with buttons (id, custom_ids).
A burst answers, per interaction, `ack` (dispatch to the first accepted callback: Discord's 3-second
deadline) and `seen` (dispatch to the moment the user sees the answer: the callback when it carries
the message, else the deferred message being filled).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from tests.fakes.discord_api import CHANNEL_MESSAGE, FakeDiscord, FakeInteraction

ANSWER_TIMEOUT_S = 10.0  # beyond Discord's 3 s deadline: a late answer is counted, not waited for


async def _timing(inter: FakeInteraction) -> dict[str, Any]:
    try:
        answer = await inter.response(timeout=ANSWER_TIMEOUT_S)
    except (AssertionError, TimeoutError) as e:  # InteractionExpired is an AssertionError
        return {"ack": None, "seen": None, "error": str(e)[:200]}
    if answer.type == CHANNEL_MESSAGE:
        seen = answer.latency
    else:
        try:
            msg = await inter.wait_original(timeout=ANSWER_TIMEOUT_S)
            seen = (msg.edited_at or msg.created_at) - inter.dispatched_at
        except TimeoutError:
            seen = None
    return {"ack": answer.latency, "seen": seen, "type": answer.type, "ephemeral": answer.ephemeral}


async def burst(fake: FakeDiscord, req: dict[str, Any]) -> dict[str, Any]:
    users = req["users"]
    if "custom_id" in req:
        message = fake.messages_by_id[int(req["message_id"])]
        starts = [fake.click(u, message, req["custom_id"]) for u in users]
    else:
        starts = [fake.slash(u, req["name"], req.get("options") or {}, channel="infra") for u in users]
    inters = await asyncio.gather(*starts)
    return {"results": await asyncio.gather(*(_timing(i) for i in inters))}


def buttons(fake: FakeDiscord) -> dict[str, Any]:
    for msg in reversed(fake.messages("infra")):
        if msg.custom_ids:
            return {"message_id": msg.id, "custom_ids": msg.custom_ids, "text": msg.content[:500]}
    return {"message_id": None, "custom_ids": []}


async def serve(users: list[str]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    async with FakeDiscord(users=users, roles={"infra-admin": 0}) as fake:
        say({
            "port": fake.port,
            "token": fake.token,
            "guild_id": fake.guild.id,
            "infra_channel_id": fake.guild.channel("infra").id,
            "admin_role_id": fake.guild.role("infra-admin").id,
            "users": {u: fake.user(u).id for u in users},
        })  # fmt: skip
        while line := await reader.readline():
            req = json.loads(line)
            try:
                if req["op"] == "connected":
                    await fake.wait_connected(req.get("timeout", 30.0))
                    say({"ok": True})
                elif req["op"] == "burst":
                    say(await burst(fake, req))
                elif req["op"] == "buttons":
                    say(buttons(fake))
                else:
                    say({"error": f"unknown op {req['op']!r}"})
            except Exception as e:
                say({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1:]))
