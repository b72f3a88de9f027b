"""Benchmark of the Discord bot: how fast each command and button click is answered under a burst of
50 concurrent interactions, against a minimal discord.py bot in the same run, idle and loaded; start-up
time and idle memory.

Processes as in production: per bot, a fake Discord (bench/fake_discord_proc.py), which dispatches
the interactions and times their answers, and the bot (bench/bot_proc.py: clusterbot, or the
reference bench/minimal_bot.py that answers everything at once with a fixed text); and this
coordinator. The bots are up at once and the bursts rotate among them, so all meet the same machine
(other work on it moves the figures a lot; the ratio is what compares). A second copy of the reference
(`minimal-b`) runs beside them: its ratio to the reference is the noise floor of a ratio of p99s (one
stall of a process in 150 answers is a p99), printed beside clusterbot's.

Figures per interaction kind, each `--rounds` bursts of `--concurrency` users:
- `/status`, `/status local`, `/jobs local`: `ack`, the time to the first callback (Discord's 3-second
  deadline; clusterbot defers, then fills the message), and `seen`, the time until the answer shows;
- clicks on an announcement (user0's `/restart local`, jobs of user1 and user2 running there): OK,
  Delay, Confirm; for a click what matters is `seen`, the time until the clicker reads the answer.
Loaded: a CPU burner process per core during the bursts. The `local` cluster is started here on
ports of its own (PORTS) with a private home, store and registry copy, and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil

from bench.isolation import isolate

# Below Linux's ephemeral range, clear of the local default (6379, 8265, 10001, 11365-11368, workers
# 20000-20999), the restart bench (11100-11106, 11400-11999) and the tests (12000-32499).
PORTS = {
    "gcs": 11200,
    "dashboard": 11201,
    "dashboard_agent_listen": 11202,
    "dashboard_agent_grpc": 11203,
    "metrics_export": 11204,
    "runtime_env_agent": 11205,
    "ray_client_server": 11206,
    "min_worker": 11210,
    "max_worker": 11360,
}
BOTS = ("minimal", "clusterbot", "minimal-b")  # minimal-b: the reference again (the noise floor)
COMMANDS = {  # label -> (slash command, options)
    "/status": ("status", {}),
    "/status local": ("status", {"cluster": "local"}),
    "/jobs local": ("jobs", {"cluster": "local"}),
}
CLICKS = {"click OK": "ok", "click Delay": "delay", "click Confirm": "confirm"}  # Confirm last: it consents
OWNERS = ("user1", "user2")  # own a running job on local each; user0 asks for the restart
TARGET_MS, TARGET_RATIO = 200.0, 1.5
REPLY_TIMEOUT_S = 120.0  # for one answer of the fake Discord (a burst waits <= 10 s per interaction)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- isolation and the local cluster -----------------------------------------------------------------------
def owners_jobs(cluster: Any) -> None:
    """A long job of each of OWNERS on the cluster, so that a restart announcement asks them."""
    from ops.jobs import active_jobs
    from ops.ray_api import RayApi

    api = RayApi(cluster)
    api.wait_accepting(120)
    have = {j.owner for j in active_jobs(api)}
    for owner in OWNERS:
        if owner not in have:
            api.submit(entrypoint="sleep 3600", metadata={"user": owner})


# -- processes ---------------------------------------------------------------------------------------------
class Proc:
    """A child process spoken to in JSON lines; ended by its pid when done."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.started = time.perf_counter()
        pipe = subprocess.PIPE
        self.p = subprocess.Popen([sys.executable, "-m", *args], stdin=pipe, stdout=pipe, text=True, env=env)

    def line(self, timeout: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        out: IO[str] = self.p.stdout  # type: ignore[assignment]
        with _alarm(timeout):
            text = out.readline()
        if not text:
            raise RuntimeError(f"{self.p.args[2]} exited ({self.p.wait(5)}) without answering")
        return json.loads(text)

    def ask(self, req: dict[str, Any], timeout: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        self.p.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]
        got = self.line(timeout)
        if "error" in got:
            raise RuntimeError(f"fake Discord: {got['error']}")
        return got

    def end(self) -> None:
        with contextlib.suppress(OSError):
            self.p.stdin.close()  # type: ignore[union-attr]  # the bot closes itself on EOF
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def fire(*_: Any) -> None:
        raise TimeoutError(f"no answer within {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def burners(on: bool) -> Iterator[None]:
    """One busy-looping process per core while on (the loaded measurement)."""
    procs = [] if not on else [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                                for _ in range(os.cpu_count() or 2)]  # fmt: skip
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


# -- the bots, side by side ------------------------------------------------------------------------------
class Side:
    """One bot and its own fake Discord, up and idle; `end()` stops both."""

    def __init__(self, which: str, users: list[str]) -> None:
        self.which, self.bot, self.message_id = which, None, 0
        self.fake = Proc(["bench.fake_discord_proc", *users])
        try:
            coords = self.fake.line()
            bot_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
            self.bot = Proc(["bench.bot_proc", which, json.dumps(coords)], env=bot_env)
            self.info: dict[str, Any] = self.bot.line()
            self.info["startup_wall_s"] = time.perf_counter() - self.bot.started
            self.fake.ask({"op": "connected"})
        except BaseException:
            self.end()
            raise

    def rss_mib(self) -> float:
        assert self.bot is not None
        return psutil.Process(self.bot.p.pid).memory_info().rss / 2**20

    def burst(self, users: list[str], **req: Any) -> list[dict[str, Any]]:
        return self.fake.ask({"op": "burst", "users": users, **req})["results"]

    def announce(self) -> dict[str, str]:
        """user0's /restart local; the announcement's custom_id per action."""
        self.burst(["user0"], name="restart", options={"cluster": "local"})
        found = self.fake.ask({"op": "buttons"})
        if not found["message_id"]:
            raise RuntimeError(f"{self.which}: /restart local posted no announcement with buttons")
        self.message_id = found["message_id"]
        return {cid.split(":")[1]: cid for cid in found["custom_ids"]}

    def end(self) -> None:
        if self.bot is not None:
            self.bot.end()
        self.fake.end()


def measure_load(concurrency: int, rounds: int, loaded: bool) -> dict[str, Any]:
    """Every bot up at once; each round's bursts go to one after the other (who goes first rotates),
    so all meet the same machine."""
    users = [f"user{i}" for i in range(concurrency)]
    sides: list[Side] = []
    try:
        for which in BOTS:
            sides.append(Side(which, users))
        time.sleep(2.0)  # idle: what a bot holds when nobody asks
        out = {s.which: {**s.info, "rss_idle_mib": s.rss_mib(), "kinds": {}} for s in sides}
        with burners(loaded):
            plan: list[tuple[str, dict[Side, dict[str, Any]]]] = [
                (label, {s: {"name": name, "options": options} for s in sides})
                for label, (name, options) in COMMANDS.items()
            ]
            buttons = {s: s.announce() for s in sides}
            plan += [
                (label, {s: {"message_id": s.message_id, "custom_id": buttons[s][action]} for s in sides})
                for label, action in CLICKS.items()
            ]
            for label, reqs in plan:
                got: dict[str, list[dict[str, Any]]] = {s.which: [] for s in sides}
                for r in range(rounds):
                    for s in sides[r % len(sides) :] + sides[: r % len(sides)]:
                        got[s.which] += s.burst(users, **reqs[s])
                        time.sleep(0.3)
                for s in sides:
                    out[s.which]["kinds"][label] = summary(got[s.which])
            for s in sides:  # before the grace ends: the benchmark restarts nothing
                if "cancel" in buttons[s]:
                    s.burst(["user0"], message_id=s.message_id, custom_id=buttons[s]["cancel"])
        for s in sides:
            out[s.which].update(rss_after_mib=s.rss_mib(), load_1min=os.getloadavg()[0])
        return out
    finally:
        for s in sides:
            s.end()


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if r.get("ack") is not None and r.get("seen") is not None]
    return {
        "ack": _pct([r["ack"] for r in done]),
        "seen": _pct([r["seen"] for r in done]),
        "failed": len(results) - len(done),
        "n": len(results),
    }


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(xs)
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return {"p50_ms": 1000 * statistics.median(s), "p99_ms": 1000 * p99, "max_ms": 1000 * s[-1]}


# -- the run ------------------------------------------------------------------------------------------
def measure(concurrency: int, rounds: int, loads: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {"concurrency": concurrency, "rounds": rounds, "runs": {}}
    for load in loads:
        say(f"{load}: {', '.join(BOTS)} side by side, {rounds} x {concurrency} of each interaction")
        for which, fig in measure_load(concurrency, rounds, load == "loaded").items():
            figures["runs"][f"{load}/{which}"] = fig
    return figures


def verdicts(figures: dict[str, Any], which: str = "clusterbot") -> list[str]:
    """Kinds over the target: p99 (ack, and seen for clicks) <= 200 ms and <= 1.5x the minimal bot's
    (`which`: clusterbot, or the reference's second copy: how often the reference misses it itself)."""
    bad = []
    for load in ("idle", "loaded"):
        cb, ref = figures["runs"].get(f"{load}/{which}"), figures["runs"].get(f"{load}/minimal")
        if not cb or not ref:
            continue
        for kind, fig in cb["kinds"].items():
            metric = "seen" if kind.startswith("click") else "ack"
            mine, theirs = fig[metric]["p99_ms"], ref["kinds"][kind][metric]["p99_ms"]
            if mine is None or fig["failed"]:
                bad.append(f"{load} {kind}: {fig['failed']} unanswered")
            elif mine > TARGET_MS or (theirs and mine > TARGET_RATIO * theirs):
                bad.append(f"{load} {kind}: {metric} p99 {mine:.0f} ms (minimal bot {theirs:.0f} ms)")
    return bad


def render(figures: dict[str, Any]) -> str:
    c, r = figures["concurrency"], figures["rounds"]
    lines = [f"bot benchmark: {r} burst(s) of {c} concurrent interactions per kind, clusterbot against a "
             "minimal discord.py bot, through a fake Discord in its own process"]  # fmt: skip
    for load in ("idle", "loaded"):
        cb, ref = figures["runs"].get(f"{load}/clusterbot"), figures["runs"].get(f"{load}/minimal")
        if not cb or not ref:
            continue
        again = figures["runs"].get(f"{load}/minimal-b")
        lines.append(f"  {load} (load average {cb['load_1min']:.1f}):  p50 / p99 ms, clusterbot | minimal, "
                     "ratio of p99s; the reference's second copy against it (noise floor)")  # fmt: skip
        for kind, fig in cb["kinds"].items():
            for metric in ("ack", "seen"):
                mine, theirs = fig[metric], ref["kinds"][kind][metric]
                if mine["p99_ms"] is None or theirs["p99_ms"] is None:
                    lines.append(f"    {kind:<15} {metric:<4}  unanswered: {fig['failed']}")
                    continue
                ratio = mine["p99_ms"] / theirs["p99_ms"]
                floor = again["kinds"][kind][metric]["p99_ms"] if again else None
                lines.append(f"    {kind:<15} {metric:<4} {mine['p50_ms']:5.0f} / {mine['p99_ms']:5.0f}  |  "
                             f"{theirs['p50_ms']:5.0f} / {theirs['p99_ms']:5.0f}   x{ratio:.2f}"
                             + (f"   (noise x{floor / theirs['p99_ms']:.2f})" if floor else "")
                             + (f"   ({fig['failed']} unanswered)" if fig["failed"] else ""))  # fmt: skip
    for which in ("minimal", "clusterbot"):
        fig = figures["runs"].get(f"idle/{which}")
        if fig:
            lines.append(
                f"  {which}: start-up {fig['startup_wall_s']:.2f} s from launch to ready (imports "
                f"{fig['import_s']:.2f} s, constructor to ready {fig['startup_s']:.2f} s); RSS idle "
                f"{fig['rss_idle_mib']:.0f} MiB, after the bursts {fig['rss_after_mib']:.0f} MiB"
            )
    bad = verdicts(figures)
    target = f"target: p99 <= {TARGET_MS:.0f} ms and <= {TARGET_RATIO}x the minimal bot's (clicks: seen)"
    lines.append(f"  {target}: " + ("met" if not bad else "MISSED: " + "; ".join(bad)))
    if any(k.endswith("/minimal-b") for k in figures["runs"]):
        floor = verdicts(figures, "minimal-b")
        lines.append("  the same target for the reference's second copy (the noise floor): "
                     + ("met" if not floor else "MISSED: " + "; ".join(floor)))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench bot", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loads", default="idle,loaded", help="comma-separated, of idle, loaded")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args(argv)
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    if args.concurrency < 3 or args.rounds < 1 or not loads or set(loads) - {"idle", "loaded"}:
        p.error("--concurrency >= 3, --rounds >= 1, --loads of idle, loaded")
    home = Path(tempfile.mkdtemp(prefix="cb-bench-bot-"))
    isolate(home, PORTS)
    from ops.drivers.local import LocalDriver
    from ops.registry import load_registry

    cluster = load_registry().get("local")
    driver = LocalDriver(cluster)
    code = 0
    try:
        say(f"isolated home {home}; starting the local cluster on 127.0.0.1:{PORTS['dashboard']}")
        driver.start()
        owners_jobs(cluster)
        figures = measure(args.concurrency, args.rounds, loads)
    except Exception as e:
        say(f"benchmark failed: {type(e).__name__}: {e}")
        figures, code = None, 1
    finally:
        say(driver.stop())
        if not driver._our_processes():
            shutil.rmtree(driver.temp_dir, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
    if figures is None:
        return code
    print(render(figures))
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if not verdicts(figures) else 1
