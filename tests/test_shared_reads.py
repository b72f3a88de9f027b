"""Shared reads (ops/shared_reads.py): fifty people asking for the same cluster at once cause one read
of it; a failed read is shared by those who waited on it and never kept; a result lives ttl_s. And
through Discord: /jobs and /status share their reads, and a quick answer is the acknowledgement
itself, while a head that does not answer still gets a deferral within the budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from bot.adapters.discord_bot import ClusterBot
from ops.registry import REPO_ROOT, Cluster
from ops.shared_reads import SharedReads
from tests.fakes.discord_api import CHANNEL_MESSAGE, DEFERRED_CHANNEL_MESSAGE, FakeDiscord, run_bot
from tests.localray import cont


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fifty_threads_asking_while_a_read_is_slow_share_it() -> None:
    reads = SharedReads(ttl_s=1.0)
    release = threading.Event()
    entered = threading.Event()

    def slow_read() -> list[str]:
        entered.set()
        assert release.wait(10), "the test never released the read"
        return ["bob's job"]

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(reads.get, ("jobs", "local"), slow_read) for _ in range(50)]
        assert entered.wait(10)
        release.set()
        results = [f.result(timeout=10) for f in futures]
    assert reads.calls == 1
    assert all(r is results[0] for r in results)


def test_a_result_is_kept_ttl_s_then_read_again_and_keys_are_apart() -> None:
    clock = Clock()
    reads = SharedReads(ttl_s=1.0, clock=clock)
    n = iter(range(100))
    assert reads.get("a", lambda: next(n)) == 0
    clock.now += 0.9
    assert reads.get("a", lambda: next(n)) == 0
    assert reads.get("b", lambda: next(n)) == 1  # another key reads on its own
    clock.now += 0.2
    assert reads.get("a", lambda: next(n)) == 2
    reads.forget("a")
    assert reads.get("a", lambda: next(n)) == 3
    assert reads.calls == 4


def test_a_failed_read_reaches_every_waiter_and_is_not_kept() -> None:
    reads = SharedReads(ttl_s=60.0)
    release = threading.Event()
    entered = threading.Event()

    def failing() -> None:
        entered.set()
        assert release.wait(10)
        raise TimeoutError("dashboard of local did not answer in 10 s")

    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(reads.get, "local", failing) for _ in range(10)]
        assert entered.wait(10)
        release.set()
        errors = [f.exception(timeout=10) for f in futures]
    assert all(isinstance(e, TimeoutError) for e in errors)
    assert reads.calls == 1
    assert reads.get("local", lambda: "read again") == "read again"


async def test_coroutines_share_one_read_and_a_cancelled_waiter_does_not_cancel_it() -> None:
    reads = SharedReads(ttl_s=1.0)
    release = asyncio.Event()

    async def slow_read(cluster: str) -> str:
        await release.wait()
        return f"{cluster}: 2 jobs"

    waiters = [asyncio.ensure_future(reads.aget(("status", "local"), slow_read, "local")) for _ in range(50)]
    await asyncio.sleep(0)
    waiters[0].cancel()
    release.set()
    done = await asyncio.wait_for(asyncio.gather(*waiters[1:]), 5)
    assert done == ["local: 2 jobs"] * 49 and reads.calls == 1
    assert await reads.aget(("status", "local"), slow_read, "local") == "local: 2 jobs"  # kept
    assert reads.calls == 1


def test_fifty_jobs_reads_of_the_local_cluster_make_one_dashboard_call(cluster: Cluster) -> None:
    from ops.context import Context
    from ops.jobs import active_jobs

    ctx = Context()
    reads = SharedReads(ttl_s=5.0)
    made = []

    def read() -> list:
        made.append(1)
        return active_jobs(ctx.ray(cluster))

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: reads.get(("jobs", cluster.name), read), range(50)))
    assert len(made) == 1 and reads.calls == 1
    assert all(r == results[0] for r in results)


WARM_THEN_READ = """
import json, sys
from ops.context import Context
from ops.status import cluster_status
ctx = Context()
ctx.warm()
before = set(sys.modules)
for cluster in ctx.registry.clusters.values():
    if cluster.driver == "gcp":
        cluster_status(ctx, cluster)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_warmed_context_reads_every_gcp_cluster_without_importing_our_modules_or_googles_clients(
    tmp_path: Path,
) -> None:
    """What the bot warms before it says it is ready: the first /status of every cluster then imports
    none of ops' modules nor Google's client libraries (they held the GIL 0.2 s mid-burst)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CLUSTERBOT_HOME": str(tmp_path / "cb"),
           "CLUSTERBOT_STORE": str(tmp_path / "store"), "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", WARM_THEN_READ], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    imported = json.loads(out.stdout.splitlines()[-1])
    assert [m for m in imported if m.startswith(("ops.", "google.cloud", "grpc"))] == []


def test_a_driver_that_cannot_be_made_does_not_stop_the_warm_up() -> None:
    """The bot warms before it is ready: one cluster whose driver fails is left to its first read."""
    from ops.context import Context
    from ops.drivers import driver_for
    from ops.registry import load_registry

    registry = load_registry()
    broken = next(iter(registry.clusters))

    def factory(cluster: Cluster):  # noqa: ANN202
        if cluster.name == broken:
            raise RuntimeError("no such thing")
        return driver_for(cluster)

    ctx = Context(registry=registry, driver_factory=factory)
    ctx.warm()
    assert set(ctx._drivers) == set(registry.clusters) - {broken}
    with pytest.raises(RuntimeError, match="no such thing"):
        ctx.driver(registry.clusters[broken])


def test_ttl_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        SharedReads(ttl_s=-1)


@contextlib.asynccontextmanager
async def discord_bot(people: list[str]) -> AsyncIterator[tuple[FakeDiscord, ClusterBot]]:
    """The real bot on the fake Discord, with the session's store and registry (ops_env)."""
    from bot.adapters.discord_bot import ClusterBot
    from bot.config import BotConfig, Settings
    from ops.context import Context

    async with FakeDiscord(users=people) as fake:
        settings = Settings(
            discord_token=fake.token,
            guild_id=fake.guild.id,
            infra_channel_id=fake.guild.channel("infra").id,
            config=BotConfig(),
            config_path=None,
        )
        bot = ClusterBot(settings, ctx=Context(), connector=fake.connector(), guild_ready_timeout=0.05)
        async with run_bot(bot, fake):
            yield fake, bot
        assert fake.unknown_routes == []


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.timeout(120)
async def test_fifty_people_asking_jobs_local_through_discord_share_one_read(cluster: Cluster) -> None:
    people = [f"user{i}" for i in range(50)]
    async with discord_bot(people) as (fake, bot):
        started = await asyncio.gather(
            *(fake.slash(u, "jobs", {"cluster": cluster.name}, channel="infra") for u in people)
        )
        answers = await asyncio.gather(*(i.wait_original(timeout=30) for i in started))
        reads = bot.get_cog("ReadOnly").reads  # type: ignore[union-attr]
    assert all(i.answer is not None and i.answer.latency < 3.0 for i in started)
    assert {a.content for a in answers} == {answers[0].content} and "local" in answers[0].content
    assert reads.calls == 1


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.timeout(120)
async def test_a_quick_answer_is_the_acknowledgement_and_a_stalled_head_is_deferred(
    cluster: Cluster, stalled: psutil.Process
) -> None:
    async with discord_bot(["bob"]) as (fake, _):
        slow = await fake.slash("bob", "status", {"cluster": cluster.name}, channel="infra")
        ack = await slow.response()
        assert ack.type == DEFERRED_CHANNEL_MESSAGE and not ack.ephemeral and ack.latency < 1.0
        msg = await slow.wait_original(timeout=30)  # the probe gives up after 2 s: head unreachable
        assert "local" in msg.content and not msg.ephemeral
        cont(stalled)
        first = await fake.slash("bob", "jobs", {"cluster": cluster.name}, channel="infra")
        await first.wait_original(timeout=30)  # a head just woken up may take longer than the budget
        again = await fake.slash("bob", "jobs", {"cluster": cluster.name}, channel="infra")
        ack = await again.response()  # within READ_TTL_S: the shared answer, ready at once
        assert ack.type == CHANNEL_MESSAGE and not ack.ephemeral  # one request: no defer, no follow-up
        assert "local" in (ack.content or "")
