"""`python -m ops`: the CLI (see ops/cli.py)."""

from ops.cli import main

raise SystemExit(main())
