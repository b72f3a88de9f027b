"""`python -m bench [restart|bot|workers|health] [options]`: the benchmarks; without a name, every one
with its defaults.

Run all, each benchmark is a child process of its own: a benchmark points its environment at a
private home, store and registry (removed when it ends) and Ray caches its auth per process, so none
may leak into the next (the bot benchmark once crashed on the registry the restart one had deleted).
"""

import subprocess
import sys

from bench import bot, health, restart, workers

BENCHES = {"restart": restart.main, "bot": bot.main, "workers": workers.main, "health": health.main}

args = sys.argv[1:]
if args and args[0] in BENCHES:
    raise SystemExit(BENCHES[args[0]](args[1:]))
if args and not args[0].startswith("-"):
    raise SystemExit(f"unknown benchmark {args[0]!r}; valid: {', '.join(BENCHES)}")
codes = [subprocess.run([sys.executable, "-m", "bench", name, *args]).returncode for name in BENCHES]
raise SystemExit(max(codes))
