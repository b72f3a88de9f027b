"""The bot's settings: environment for secrets and ids, a YAML file for people and rights.

Environment: DISCORD_TOKEN (absent: the terminal chat), CLUSTERBOT_GUILD_ID, CLUSTERBOT_INFRA_CHANNEL_ID,
CLUSTERBOT_BOT_CONFIG (the file), CLUSTERBOT_STORE (shared with the CLI). The file says who may do
what (roles per command, per cluster), who the admins are, how Ray job owners map to chat users,
the protocol's windows and the health alerts' schedule. A missing or wrong value is one `ConfigError`
line at start-up.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.alerts.model import AlertSettings
from ops.registry import REPO_ROOT


class ConfigError(Exception):
    """One line saying which setting is missing or wrong, and how to fix it."""


class Windows(BaseModel):
    """The protocol's timings in seconds (tests use seconds, people use the defaults)."""

    model_config = ConfigDict(extra="forbid")
    confirm_s: float = 600.0  # the requester must Confirm within this
    consent_s: float = 900.0  # lazy consensus: no objection within this counts as consent
    grace_s: float = 120.0  # countdown between consent and execution
    delay_choices_min: list[int] = Field(default_factory=lambda: [10, 30])
    max_delay_s: float = 3600.0  # all delays of one operation together
    tick_s: float = 1.0  # how often deadlines are checked
    # How often the bot notes that it is alive (the downtime check on start compares with it); GCS
    # takes one write per second per object, and this one is written by every tick that is due.
    alive_s: float = Field(default=30.0, ge=1.0, le=300.0)


class Rights(BaseModel):
    """Who may request an operation: chat roles per command, optionally narrowed per cluster.

    People and roles are named by id, never by name: on Discord anyone can take a free name or create
    a role called `infra-admin`; ids cannot be chosen (`check_ids`). The terminal's users are names
    that are also their ids, so a config for the terminal names them. A user whose id is in `admins`,
    or who has an `admin_roles` role, may do everything. `"*"` in a command's or a cluster's role list
    means everyone.
    """

    model_config = ConfigDict(extra="forbid")
    admins: list[str] = Field(default_factory=list)
    admin_roles: list[str] = Field(default_factory=list)
    commands: dict[str, list[str]] = Field(default_factory=dict)  # command -> roles
    clusters: dict[str, list[str]] = Field(default_factory=dict)  # cluster -> roles (all commands)

    def check_ids(self, where: str) -> None:
        """On Discord every person and role must be an id (a number): a name is one ConfigError line
        naming the field, saying why and how to find the id."""
        lists = [("admins", self.admins, "user"), ("admin_roles", self.admin_roles, "role")]
        lists += [(f"commands.{k}", v, "role") for k, v in self.commands.items()]
        lists += [(f"clusters.{k}", v, "role") for k, v in self.clusters.items()]
        for field, values, kind in lists:
            open_to_all = field.startswith(("commands.", "clusters."))
            for value in values:
                if not (value.isdigit() or (open_to_all and value == "*")):
                    raise ConfigError(
                        f"{where}: rights.{field}: {value!r} is not a Discord {kind} id: rights take ids "
                        f"(numbers), since names can be changed or taken by anyone. To find one: Discord "
                        f"settings > Advanced > Developer Mode on, then right-click the {kind} > Copy "
                        f"{'User' if kind == 'user' else 'Role'} ID"
                    )


class BotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rights: Rights = Field(default_factory=Rights)
    owners: dict[str, str] = Field(default_factory=dict)  # Ray job owner -> chat user id
    windows: Windows = Field(default_factory=Windows)
    alerts: AlertSettings = Field(default_factory=AlertSettings)


class Settings(BaseModel):
    discord_token: str | None
    guild_id: int | None
    infra_channel_id: int | None
    config: BotConfig
    config_path: Path | None

    def check_discord(self) -> None:
        """What the Discord bot needs beyond a token: its guild and channel, and rights by id."""
        for name, value in (("CLUSTERBOT_GUILD_ID", self.guild_id),
                            ("CLUSTERBOT_INFRA_CHANNEL_ID", self.infra_channel_id)):  # fmt: skip
            if value is None:
                raise ConfigError(f"{name} is not set: the Discord bot needs it (see README)")
        self.config.rights.check_ids(str(self.config_path or "the bot config"))


DEFAULT_CONFIG = REPO_ROOT / "infra" / "bot.yaml"


def load_config(path: Path) -> BotConfig:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"cannot read the bot config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return BotConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from None


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a Discord id (a number), not {value!r}") from None


def load_settings() -> Settings:
    """Read the environment and the config file; ConfigError says what is wrong in one line."""
    path_env = os.environ.get("CLUSTERBOT_BOT_CONFIG")
    path = Path(path_env) if path_env else (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = load_config(path) if path else BotConfig()
    token = os.environ.get("DISCORD_TOKEN") or None
    settings = Settings(
        discord_token=token,
        guild_id=_int_env("CLUSTERBOT_GUILD_ID"),
        infra_channel_id=_int_env("CLUSTERBOT_INFRA_CHANNEL_ID"),
        config=config,
        config_path=path,
    )
    if token:
        settings.check_discord()
    return settings
