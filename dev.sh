#!/usr/bin/env bash
# One entry point that works on a fresh machine (Python 3.11 + pip): sets up .venv, then
#   bash dev.sh run    the bot on its local default (a terminal chat on a local Ray cluster)
#   bash dev.sh test   lint and the whole test suite
#   bash dev.sh bench  the benchmarks
#   bash dev.sh ops …  the ops CLI (python -m ops …)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || [ pyproject.toml -nt .venv/.installed ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.installed
fi
export RAY_USAGE_STATS_ENABLED=0
cmd=${1:-run}
shift || true
case "$cmd" in
  run)   exec .venv/bin/python -m bot "$@" ;;
  # Two test processes (pytest-xdist), a file each at a time: most of the suite waits on Ray heads
  # starting and stopping, and each process has its own local cluster on ports of its own.
  test)  .venv/bin/ruff check . && .venv/bin/ruff format --check . && exec .venv/bin/pytest -n 2 --dist loadfile "$@" ;;
  bench) exec .venv/bin/python -m bench "$@" ;;
  ops)   exec .venv/bin/python -m ops "$@" ;;
  *) echo "usage: bash dev.sh run|test|bench|ops ..." >&2; exit 2 ;;
esac
