"""Start and stop a whole cluster. One driver per kind of cluster, chosen by the registry's `driver`.

Drivers know how to bring a cluster's Ray up and down; they know nothing of jobs (the restart backs
them up first) nor of chat.
"""

from __future__ import annotations

from typing import Protocol

from ops.registry import Cluster


class Driver(Protocol):
    cluster: Cluster

    def start(self) -> str:
        """Bring the cluster up (idempotent); return a one-line description (where the dashboard is)."""
        ...

    def stop(self) -> str:
        """Bring the cluster down (idempotent); return a one-line description of what was stopped."""
        ...

    def is_up(self) -> bool:
        """Whether the cluster's head is running, as far as this driver can tell."""
        ...

    def head_exists(self) -> bool | None:
        """Whether a head exists, said positively: True (it does), False (it certainly does not:
        nothing runs there, so nothing can be lost), None (cannot tell). A dashboard that does not
        answer is not a dead head; only False lets a restart go on without a backup."""
        ...

    def dashboard_url(self) -> str:
        """Where this machine reaches the head's dashboard now (opening a tunnel if that is how)."""
        ...

    def tpu_endpoint(self) -> str | None:
        """Where the cluster's Cloud TPU API answers: None for Google itself, `host:port` for the
        local cluster's simulator (started with it)."""
        ...

    def close(self) -> None:
        """Let go of what reaching the head holds open (a tunnel); the cluster itself is untouched."""
        ...


def driver_for(cluster: Cluster) -> Driver:
    if cluster.driver == "local":
        from ops.drivers.local import LocalDriver

        return LocalDriver(cluster)
    from ops.drivers.gcp import GcpDriver

    return GcpDriver(cluster)
