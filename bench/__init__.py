"""Benchmarks, run with `python -m bench` (or `bash dev.sh bench`); see bench/restart.py."""
