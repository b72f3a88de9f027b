"""`python -m bench`: the restart benchmark (bench/restart.py); `--help` lists its options."""

from bench.restart import main

raise SystemExit(main())
