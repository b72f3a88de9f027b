"""The bot's settings: a missing or wrong value is one clear line at start-up, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bot.config import load_config
from ops.registry import REPO_ROOT


def run_bot(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERBOT_", "DISCORD_"))}
    return subprocess.run([sys.executable, "-m", "bot"], capture_output=True, text=True, env=base | env,
                          stdin=subprocess.DEVNULL, timeout=60, cwd=REPO_ROOT)  # fmt: skip


def test_a_token_without_guild_is_one_line(tmp_path: Path) -> None:
    r = run_bot({"DISCORD_TOKEN": "x", "CLUSTERBOT_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == "clusterbot: CLUSTERBOT_GUILD_ID is not set: the Discord bot needs it (see README)"
    )


def test_a_non_numeric_channel_is_one_line(tmp_path: Path) -> None:
    r = run_bot({"DISCORD_TOKEN": "x", "CLUSTERBOT_GUILD_ID": "1", "CLUSTERBOT_INFRA_CHANNEL_ID": "#infra",
                 "CLUSTERBOT_HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 2
    assert "CLUSTERBOT_INFRA_CHANNEL_ID must be a Discord id" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_wrong_config_file_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bot.yaml"
    bad.write_text("windows:\n  consent_s: soon\n")
    r = run_bot({"DISCORD_TOKEN": "x", "CLUSTERBOT_BOT_CONFIG": str(bad), "CLUSTERBOT_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert str(bad) in r.stderr and "windows.consent_s" in r.stderr and "Traceback" not in r.stderr


def test_the_example_config_is_valid_and_names_roles_by_id() -> None:
    config = load_config(REPO_ROOT / "infra" / "bot.example.yaml")
    assert config.rights.admin_roles == ["222222222222222222"] and config.windows.consent_s == 900
    config.rights.check_ids("infra/bot.example.yaml")  # the Discord bot would start with it


def test_a_right_given_by_name_stops_the_discord_bot_with_one_line(tmp_path: Path) -> None:
    """Names can be taken by anyone: the Discord bot refuses them before it connects anywhere."""
    cfg = tmp_path / "bot.yaml"
    cfg.write_text("rights:\n  admins: ['111111111111111111']\n  admin_roles: [infra-admin]\n")
    r = run_bot({"DISCORD_TOKEN": "x", "CLUSTERBOT_GUILD_ID": "1", "CLUSTERBOT_INFRA_CHANNEL_ID": "2",
                 "CLUSTERBOT_BOT_CONFIG": str(cfg), "CLUSTERBOT_HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"clusterbot: {cfg}: rights.admin_roles: 'infra-admin' is not a Discord role id")
    assert "Developer Mode" in line and "Copy Role ID" in line
