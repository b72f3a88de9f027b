"""`python -m bench [restart|bot] [options]`: the benchmarks; without a name, both with their defaults."""

import sys

from bench import bot, restart

BENCHES = {"restart": restart.main, "bot": bot.main}

args = sys.argv[1:]
if args and args[0] in BENCHES:
    raise SystemExit(BENCHES[args[0]](args[1:]))
if args and not args[0].startswith("-"):
    raise SystemExit(f"unknown benchmark {args[0]!r}; valid: {', '.join(BENCHES)}")
raise SystemExit(max(fn(args) for fn in BENCHES.values()))
