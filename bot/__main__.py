"""`python -m bot`: on Discord when DISCORD_TOKEN is set, else the terminal chat on the local cluster."""

from __future__ import annotations

import logging
import os
import sys

from bot.config import ConfigError, load_settings


def main() -> None:
    if not os.environ.get("DISCORD_TOKEN"):
        from bot.adapters.terminal import main as terminal

        terminal()
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"clusterbot: {e}", file=sys.stderr)
        sys.exit(2)
    from bot.adapters.discord_bot import run

    run(settings)


main()
