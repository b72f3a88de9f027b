"""`python -m bot`: on Discord when DISCORD_TOKEN is set, else the terminal chat on the local cluster."""

from __future__ import annotations

import logging
import sys

from bot.config import ConfigError, load_settings


def main() -> None:
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"clusterbot: {e}", file=sys.stderr)
        sys.exit(2)
    if settings.discord_token is None:
        from bot.adapters.terminal import main as terminal

        terminal(settings)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from bot.adapters.discord_bot import run

    run(settings)


main()
