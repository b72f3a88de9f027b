"""The one place that hands out what operations use: the store, the registry, a driver and a Ray API
per cluster (and, as they arrive, the Google Cloud clients).

Built once from configuration by whoever runs operations (the CLI, the bot); nothing below it builds
its own client, and tests pass theirs (a store on fake-gcs-server, a registry copy, a driver with a
fake `ray`). Drivers are kept per cluster because reaching a head may hold something open (a GCP
cluster's dashboard tunnel); `close()` lets go of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from ops.drivers import Driver, driver_for
from ops.ray_api import RayApi
from ops.registry import Cluster, Registry, load_registry
from ops.store import Store, open_store

if TYPE_CHECKING:
    from ops.gcp.tpu import TpuApi


class Context:
    def __init__(
        self,
        store: Store | None = None,
        registry: Registry | None = None,
        driver_factory: Callable[[Cluster], Driver] = driver_for,
        tpu_factory: Callable[[Cluster], TpuApi] | None = None,
    ) -> None:
        """`store` and `registry` default to the configured ones (CLUSTERBOT_STORE, CLUSTERBOT_REGISTRY),
        opened on first use so that commands which need neither do not fail on them."""
        if store is not None:
            self.__dict__["store"] = store
        if registry is not None:
            self.__dict__["registry"] = registry
        self._driver_factory = driver_factory
        self._tpu_factory = tpu_factory
        self._drivers: dict[str, Driver] = {}
        self._tpus: dict[str, TpuApi] = {}
        self._mutex = threading.Lock()

    @cached_property
    def store(self) -> Store:
        return open_store()

    @cached_property
    def registry(self) -> Registry:
        return load_registry()

    def cluster(self, name: str) -> Cluster:
        """The registry's cluster `name`; BadInput lists the valid names otherwise."""
        return self.registry.get(name)

    def driver(self, cluster: Cluster) -> Driver:
        """The cluster's driver, one per cluster for the life of this context."""
        with self._mutex:
            driver = self._drivers.get(cluster.name)
            if driver is None:
                driver = self._drivers[cluster.name] = self._driver_factory(cluster)
            return driver

    def ray(self, cluster: Cluster) -> RayApi:
        """The cluster's Ray API where its driver reaches the dashboard now (a tunnel may open: call
        from a thread in the bot). Raises OpsError when the driver cannot give an address at all."""
        return RayApi(cluster, self.driver(cluster).dashboard_url())

    def tpu(self, cluster: Cluster) -> TpuApi:
        """Cloud TPU for the cluster's project, where its driver says the cloud is: Google for a GCP
        cluster, the simulator for the local one. One per cluster for the life of this context."""
        with self._mutex:
            api = self._tpus.get(cluster.name)
        if api is None:
            if self._tpu_factory is not None:
                api = self._tpu_factory(cluster)
            else:
                from ops.gcp.tpu import TpuApi, tpu_clients

                api = TpuApi(tpu_clients(self.driver(cluster).tpu_endpoint()), cluster.project)
            with self._mutex:
                api = self._tpus.setdefault(cluster.name, api)
        return api

    def close(self) -> None:
        """Let go of what reaching heads and clouds holds open (tunnels, channels); clusters are untouched."""
        with self._mutex:
            drivers, self._drivers = list(self._drivers.values()), {}
            tpus, self._tpus = list(self._tpus.values()), {}
        for driver in drivers:
            driver.close()
        for api in tpus:
            api.clients.close()
