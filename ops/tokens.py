"""Each cluster's Ray auth token: the Secret Manager version it runs with (its pin, in the store), this
machine's copy for Ray's CLI (`ops token`), and the rotation (`rotate-token`).

Why pins: every cluster's secret (`token_secret`, one shared `RAY_AUTH_TOKEN` on the GCP clusters) used
to be read at `latest`, so a version added for one cluster reached every cluster's new workers, which
then could not join their old heads. A cluster now runs with the version recorded for it in
`tokens/<cluster>.json`; the bot and the CLI read the token there (`Context.token`), a rotation moves
one cluster's pin and disables a version only when no cluster pins it any more.

A cluster without a pin gets one the first time it is needed: it adopts the newest enabled version
(`latest`, what a GCP cluster's nodes fetched until pins existed, unless that one was disabled), or for
a local head the enabled version holding the token it runs with; a local secret with no enabled version
is seeded (from the token its running head uses, else this machine's token file, so a running head
keeps working).

The rotation is a restart (ops/restart.py) whose record carries a `TokenRotation`: the backup reads
with the old token, the pin moves to the new version once the old head is stopped, the new head starts
with it, the resubmission and the checks use it, and before "done" the dashboard must accept the new
token and refuse the old. A token never appears in output, logs, exceptions, chat or the store: only
secret names and version numbers do.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, SecretStr

from ops.errors import BadInput, OpsError, Refused
from ops.registry import Cluster
from ops.store import Conflict, Store, dump, read_model

if TYPE_CHECKING:
    from ops.context import Context
    from ops.locks import Lease
    from ops.restart import RestartRun, Settings

TOKEN_BYTES = 32  # a new token is 64 hex characters, as `ray get-auth-token --generate` makes them
PINS = "tokens"


class TokenPin(BaseModel):
    """The version of `secret` a cluster runs with, and the one before it."""

    cluster: str
    project: str
    secret: str
    version: str  # live: what the cluster's head and nodes use
    previous: str | None = None
    updated_at: datetime
    by: str  # "seeded", "adopted", or the operation that moved it


class TokenRotation(BaseModel):
    """A rotation, as its restart record keeps it (what `--resume` knows)."""

    secret: str
    old_version: str
    new_version: str
    live: str  # the version the cluster's pin says now: old until the old head is stopped, then new
    verified: bool = False  # the dashboard accepted the new token and refused the old
    old_disabled: bool = False
    old_kept_for: list[str] = []  # clusters that still pin the old version (then it stays enabled)


def _key(cluster: str) -> str:
    return f"{PINS}/{cluster}.json"


def read_pin(store: Store, cluster: Cluster) -> TokenPin | None:
    got = read_model(store, _key(cluster.name), TokenPin)
    return None if got is None else got[0]


def write_pin(store: Store, cluster: Cluster, version: str, by: str) -> TokenPin:
    """Pin `cluster` to `version` of its secret (idempotent: the same version again changes nothing)."""
    assert cluster.token_secret is not None
    for _ in range(5):
        got = read_model(store, _key(cluster.name), TokenPin)
        if got is not None and got[0].version == version:
            return got[0]
        pin = TokenPin(
            cluster=cluster.name,
            project=cluster.project,
            secret=cluster.token_secret,
            version=version,
            previous=None if got is None else got[0].version,
            updated_at=datetime.now(UTC),
            by=by,
        )
        try:
            if got is None:
                store.create(_key(cluster.name), dump(pin))
            else:
                store.replace(_key(cluster.name), dump(pin), got[1])
            return pin
        except (Conflict, FileExistsError):
            continue  # someone else moved it meanwhile: look again
    raise OpsError(f"could not record {cluster.name}'s token version: the store kept changing under us")


def ensure_pin(ctx: Context, cluster: Cluster) -> TokenPin:
    """The cluster's pin, made on first need (module docstring). BadInput for a cluster without a
    token secret; OpsError when a GCP cluster's secret has no version at all."""
    secret = cluster.token_secret
    if secret is None:
        raise BadInput(f"{cluster.name} has no token_secret in the registry", "name its Ray token's secret")
    pin = read_pin(ctx.store, cluster)
    if pin is not None:
        return pin
    api = ctx.secrets(cluster)
    # The newest enabled version (`latest` may name a disabled one: a rotation's old token, a test's
    # wrong one); for a local head running a token, the enabled version that holds it.
    enabled = [v.version for v in api.versions(secret) if v.state == "ENABLED"]
    running = _running_token(ctx, cluster) if cluster.driver == "local" and enabled else None
    held = [v for v in enabled if running and api.access(secret, v).get_secret_value() == running.encode()]
    if held or enabled:
        return write_pin(ctx.store, cluster, (held or enabled)[0], "adopted")
    if cluster.driver != "local":
        raise OpsError(
            f"secret {secret} of project {cluster.project} has no enabled version: {cluster.name} has no "
            "Ray token",
            "create it once as the runbook says (`ray get-auth-token --generate`, then add it as a version)",
        )
    api.create(secret, labels={"clusterbot": "ray-token"})
    existing = _running_token(ctx, cluster) or cluster.read_token()  # a head started before pins
    info = api.add_version(secret, SecretStr(existing or secrets.token_hex(TOKEN_BYTES)))
    return write_pin(ctx.store, cluster, info.version, "seeded")


def _running_token(ctx: Context, cluster: Cluster) -> str | None:
    """The token the local head runs with now (its driver's token file), if it has one: seeding from it
    keeps a running head reachable, whatever this machine's copy says."""
    path = getattr(ctx.driver(cluster), "head_token_file", None)
    try:
        return path.read_text().strip() or None if path is not None else None
    except OSError:
        return None


def sharing(ctx: Context, cluster: Cluster) -> list[Cluster]:
    """Every cluster of the registry reading the same secret in the same project (itself included)."""
    return [
        c
        for c in ctx.registry.clusters.values()
        if c.token_secret == cluster.token_secret and c.project == cluster.project
    ]


def pinned_by(ctx: Context, cluster: Cluster, version: str) -> list[str]:
    """The clusters sharing `cluster`'s secret whose pin is `version` (a cluster with no pin yet counts
    too: it would adopt the newest version, never an older one, so only when `version` is newest)."""
    return [
        c.name
        for c in sharing(ctx, cluster)
        if (pin := read_pin(ctx.store, c)) is not None and pin.version == version
    ]


# -- this machine's copy ---------------------------------------------------------------------------------
class TokenCopy(BaseModel):
    cluster: str
    secret: str
    version: str
    path: str | None  # where it was written (None with --stdout)


def copy_path(cluster: Cluster) -> Path:
    """Where Ray's CLI on this machine reads the token: the registry's `token.file` for the cluster
    (Ray's own default is ~/.ray/auth_token), else RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    if cluster.token is not None and cluster.token.file is not None:
        return cluster.token.path()  # type: ignore[return-value]  # a file source has a path
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()


def write_private(path: Path, value: str) -> None:
    """Write a token file readable by its owner only, atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)


def save_copy(ctx: Context, cluster: Cluster, to_stdout: Callable[[str], None] | None = None) -> TokenCopy:
    """`ops token`: the cluster's live token written where Ray's CLI expects it, or handed to
    `to_stdout` (for scripts: the one place a token is printed, because it was asked for)."""
    pin = ensure_pin(ctx, cluster)
    value = ctx.token(cluster)
    assert value is not None
    if to_stdout is not None:
        to_stdout(value)
        return TokenCopy(cluster=cluster.name, secret=pin.secret, version=pin.version, path=None)
    path = copy_path(cluster)
    write_private(path, value)
    return TokenCopy(cluster=cluster.name, secret=pin.secret, version=pin.version, path=str(path))


# -- the rotation ---------------------------------------------------------------------------------------
def start_rotation(
    ctx: Context,
    cluster: Cluster,
    caller: str,
    settings: Settings | None = None,
    progress: Callable[[str], None] = lambda _: None,
    lease: Lease | None = None,
    skip_resubmit: dict[str, str] | None = None,
) -> RestartRun:
    """Take the lock (or use `lease`, held since the bot announced it), pin every cluster sharing the
    secret (so the new version reaches no other cluster), add the new token as a version, and create
    the restart that rolls it out; `.run()` executes it."""
    from ops.locks import acquire, new_op_id
    from ops.restart import Settings, start_restart

    settings = settings or Settings()
    secret = cluster.token_secret
    if secret is None:
        raise BadInput(f"{cluster.name} has no token_secret in the registry", "nothing to rotate")
    if lease is None:
        lease = acquire(
            ctx.store, cluster.name, new_op_id(cluster.name), "rotate-token", caller, settings.lease_s
        )
    try:
        old = ensure_pin(ctx, cluster)
        for other in sharing(ctx, cluster):
            ensure_pin(ctx, other)  # before the new version exists: each keeps what it runs with
        info = ctx.secrets(cluster).add_version(secret, SecretStr(secrets.token_hex(TOKEN_BYTES)))
    except BaseException:
        lease.release()
        raise
    progress(f"added version {info.version} of secret {secret} (the cluster runs with {old.version})")
    rotation = TokenRotation(
        secret=secret, old_version=old.version, new_version=info.version, live=old.version
    )
    return start_restart(
        ctx,
        cluster,
        caller,
        True,
        settings,
        progress,
        lease=lease,
        skip_resubmit=skip_resubmit,
        token=rotation,
    )


def switch(ctx: Context, cluster: Cluster, rotation: TokenRotation, op_id: str) -> None:
    """Move the cluster's pin to the new version (idempotent); called once its old head is stopped."""
    write_pin(ctx.store, cluster, rotation.new_version, op_id)


def verify(ctx: Context, cluster: Cluster, rotation: TokenRotation) -> None:
    """The dashboard accepts the new token and refuses the old; OpsError otherwise (resume checks again)."""
    from ops.ray_api import Reach

    new_reach, _ = ctx.ray(cluster, rotation.new_version).probe(timeout=5.0)
    if new_reach != Reach.OK:
        raise OpsError(
            f"the {cluster.name} dashboard did not accept the new token (version {rotation.new_version}): "
            f"{new_reach.value}",
            f"`python -m ops rotate-token --cluster {cluster.name} --resume` checks again",
        )
    old_reach, code = ctx.ray(cluster, rotation.old_version).probe(timeout=5.0)
    if old_reach != Reach.REFUSED:
        raise Refused(
            f"the {cluster.name} dashboard did not refuse the old token (version {rotation.old_version}): "
            + ("it accepted it" if old_reach == Reach.OK else "it did not answer"),
            "the old version stays enabled; check the head's RAY_AUTH_MODE, then resume",
        )


def retire(ctx: Context, cluster: Cluster, rotation: TokenRotation) -> TokenRotation:
    """Disable the old version unless some cluster still pins it; what was done, for the record."""
    keep = pinned_by(ctx, cluster, rotation.old_version)
    if keep:
        return rotation.model_copy(update={"old_kept_for": keep})
    api = ctx.secrets(cluster)
    current = api.version(rotation.secret, rotation.old_version)
    if current is not None and current.state == "ENABLED":
        api.disable(rotation.secret, rotation.old_version)
    return rotation.model_copy(update={"old_disabled": True, "old_kept_for": []})


def report_lines(cluster: str, rotation: TokenRotation) -> list[str]:
    """What a rotation's report says beside the restart's: the versions, and what users must do."""
    was = f"version {rotation.old_version}"
    old = (
        f"{was} disabled"
        if rotation.old_disabled
        else f"{was} kept enabled: still pinned by {', '.join(rotation.old_kept_for)}"
        if rotation.old_kept_for
        else f"{was} not disabled yet"
    )
    return [
        f"Ray token of {cluster} rotated: {rotation.secret} version {rotation.new_version} is live; {old}",
        f"everyone using {cluster}: run `python -m ops token --cluster {cluster}` to refresh your copy",
    ]
