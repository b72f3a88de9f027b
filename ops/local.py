"""The local Ray cluster on this machine: booting it, for the CLI (`ops local up`) and the terminal chat.

One implementation of "make the local cluster usable": start it when it is down and wait until it
accepts jobs, unless a restart in progress stopped it (that restart brings it back; starting it here
would race it).
"""

from __future__ import annotations

from collections.abc import Callable

from ops.context import Context
from ops.errors import BadInput
from ops.locks import current_lock
from ops.registry import Cluster

ACCEPT_TIMEOUT_S = 90.0  # a freshly started head accepts jobs a few seconds after its node is alive


def local_cluster(ctx: Context, name: str) -> Cluster:
    """The registry's cluster `name`, which must be one this machine runs; BadInput lists those."""
    cluster = ctx.cluster(name)
    if cluster.driver != "local":
        local = ", ".join(c.name for c in ctx.registry.clusters.values() if c.driver == "local")
        raise BadInput(f"{cluster.name} is not a local cluster", f"local clusters: {local or 'none'}")
    return cluster


def restart_bringing_back(ctx: Context, cluster: Cluster) -> str | None:
    """What holds the cluster's lock, when it is a restart that has begun (its record exists): the
    cluster may be down because of it, and it starts the cluster itself. None otherwise (a restart
    only announced has stopped nothing)."""
    from ops.restart import RESTARTING_KINDS, find_record

    held = current_lock(ctx.store, cluster.name)
    if (
        held is None
        or held.kind not in RESTARTING_KINDS  # a token rotation is a restart too
        or find_record(ctx.store, cluster.name, held.op_id) is None
    ):
        return None
    return held.describe()


def boot(ctx: Context, cluster: Cluster, progress: Callable[[str], None]) -> str:
    """Bring a local cluster up if it is down, and wait until it accepts jobs; says what it found or
    did. Blocks (about 10 s when it starts the head): call from a thread in the bot. OpsError when the
    head cannot start or does not accept a job in time."""
    driver = ctx.driver(cluster)
    if driver.is_up():
        return f"{cluster.name} cluster already up, dashboard at {cluster.dashboard_url}"
    restart = restart_bringing_back(ctx, cluster)
    if restart is not None:
        return f"{cluster.name} cluster down: {restart} brings it back (not started here)"
    progress(f"starting the {cluster.name} Ray cluster (about 10 s)...")
    text = driver.start()
    progress(f"{text}; waiting until it accepts jobs")
    ctx.ray(cluster).wait_accepting(ACCEPT_TIMEOUT_S)
    return text
