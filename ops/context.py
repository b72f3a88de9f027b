"""The one place that hands out what operations use: the store, the registry, a driver and a Ray API
per cluster, and the Google Cloud clients for a cluster's project (Cloud TPU, Secret Manager, Cloud
Build, Artifact Registry): Google's for a GCP cluster, the simulator's for the local one.

Built once from configuration by whoever runs operations (the CLI, the bot); nothing below it builds
its own client, and tests pass theirs (a store on fake-gcs-server, a registry copy, a driver with a
fake `ray`). Drivers are kept per cluster because reaching a head may hold something open (a GCP
cluster's dashboard tunnel); `close()` lets go of it.

A cluster's Ray token comes from here too (`token`): Secret Manager at the version the cluster is pinned
to (ops/tokens.py), read once per version; the Ray API and the driver (which starts heads with it) get it
from this one place, never from a file.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.drivers import Driver, driver_for
from ops.ray_api import RayApi
from ops.registry import Cluster, Registry, load_registry
from ops.store import Store, open_store

log = logging.getLogger("clusterbot.context")

if TYPE_CHECKING:
    from ops.gcp.artifacts import ArtifactsApi
    from ops.gcp.build import BuildApi
    from ops.gcp.objects import Objects
    from ops.gcp.secrets import SecretsApi
    from ops.gcp.tpu import TpuApi


class Context:
    def __init__(
        self,
        store: Store | None = None,
        registry: Registry | None = None,
        driver_factory: Callable[[Cluster], Driver] = driver_for,
        tpu_factory: Callable[[Cluster], TpuApi] | None = None,
        cloud_endpoint: Callable[[Cluster], str | None] | None = None,
    ) -> None:
        """`store` and `registry` default to the configured ones (CLUSTERBOT_STORE, CLUSTERBOT_REGISTRY),
        opened on first use so that commands which need neither do not fail on them. `cloud_endpoint`
        (tests) says where a cluster's Google APIs answer instead of its driver (None: Google)."""
        if store is not None:
            self.__dict__["store"] = store
        if registry is not None:
            self.__dict__["registry"] = registry
        self._driver_factory = driver_factory
        self._tpu_factory = tpu_factory
        self._drivers: dict[str, Driver] = {}
        self._tpus: dict[str, TpuApi] = {}
        self._cloud_endpoint = cloud_endpoint
        self._apis: dict[tuple[str, str], Any] = {}  # (kind, cluster name) -> SecretsApi / BuildApi / ...
        self._tokens: dict[tuple[str, str, str], str] = {}  # (project, secret, version) -> token
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
                # Drivers that start heads take the token (local) or its pinned version (GCP) from here.
                if hasattr(driver, "token_reader"):
                    driver.token_reader = lambda: self.token(cluster)
                if hasattr(driver, "token_version_reader") and cluster.token_secret is not None:
                    driver.token_version_reader = lambda: self._pinned_version(cluster)
                if hasattr(driver, "config_renderer"):  # a start runs the image pinned in the store
                    driver.config_renderer = lambda: self._start_config(cluster)
                key = cluster.ssh_key
                if hasattr(driver, "ssh_key_reader") and key is not None and key.private_secret is not None:
                    secret = key.private_secret
                    driver.ssh_key_reader = lambda: self.secrets(cluster).access(secret).get_secret_value()
            return driver

    def _start_config(self, cluster: Cluster) -> str | None:
        from ops.images import render_for_start

        return render_for_start(self, cluster)

    def ray(self, cluster: Cluster, token_version: str | None = None) -> RayApi:
        """The cluster's Ray API where its driver reaches the dashboard now (a tunnel may open: call
        from a thread in the bot), with the cluster's token (its pinned version, or `token_version`),
        read on first use. Raises OpsError when the driver cannot give an address at all."""
        return RayApi(
            cluster, self.driver(cluster).dashboard_url(), token=lambda: self.token(cluster, token_version)
        )

    def _pinned_version(self, cluster: Cluster) -> str:
        from ops.errors import OpsError
        from ops.tokens import ensure_pin

        try:
            return ensure_pin(self, cluster).version
        except OpsError:
            raise
        except Exception as e:  # no credentials, a client that cannot start
            raise OpsError(
                f"cannot read which version of secret {cluster.token_secret} {cluster.name} runs with: "
                f"{type(e).__name__}",
                "this machine needs Secret Manager access (gcloud auth application-default login)",
            ) from None

    def token(self, cluster: Cluster, version: str | None = None) -> str | None:
        """The cluster's Ray token from Secret Manager at its pinned version (or `version`), cached per
        version; for a cluster with no `token_secret`, this machine's copy (the registry's `token`).
        OpsError (naming the secret, never the value) when it cannot be read."""
        secret = cluster.token_secret
        if secret is None:
            return cluster.read_token()
        from ops.errors import OpsError
        from ops.tokens import ensure_pin

        try:
            version = version or ensure_pin(self, cluster).version
            key = (cluster.project, secret, version)
            with self._mutex:
                value = self._tokens.get(key)
            if value is None:
                value = self.secrets(cluster).access(secret, version).get_secret_value().decode()
                with self._mutex:
                    self._tokens[key] = value
            return value
        except OpsError:
            raise
        except Exception as e:  # no credentials, a client that cannot start: say which secret, not more
            raise OpsError(
                f"cannot read {cluster.name}'s Ray token (secret {secret}, project {cluster.project}): "
                f"{type(e).__name__}",
                "this machine needs Secret Manager access (gcloud auth application-default login)",
            ) from None

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

    def secrets(self, cluster: Cluster) -> SecretsApi:
        """Secret Manager of the cluster's project (the simulator's for the local cluster)."""

        def make(endpoint: str | None) -> SecretsApi:
            from ops.gcp.secrets import SecretsApi, secrets_client

            client, channel = secrets_client(endpoint)
            return SecretsApi(client, cluster.project, channel=channel)

        return self._api("secrets", cluster, make)

    def builds(self, cluster: Cluster) -> BuildApi:
        """Cloud Build of the cluster's project, with the buckets its sources and logs live in (Cloud
        Storage; for the local cluster, the simulator's directory of buckets)."""

        def make(endpoint: str | None) -> BuildApi:
            from ops.gcp.build import BuildApi, builds_client

            client, channel = builds_client(endpoint)
            return BuildApi(client, cluster.project, self._objects(cluster, endpoint), channel=channel)

        return self._api("builds", cluster, make)

    def artifacts(self, cluster: Cluster) -> ArtifactsApi:
        """Artifact Registry of the cluster's project (the simulator's for the local cluster)."""

        def make(endpoint: str | None) -> ArtifactsApi:
            from ops.gcp.artifacts import ArtifactsApi, artifacts_client

            client, channel = artifacts_client(endpoint)
            return ArtifactsApi(client, cluster.project, channel=channel)

        return self._api("artifacts", cluster, make)

    def _endpoint(self, cluster: Cluster) -> str | None:
        """Where the cluster's Google APIs answer: None for Google, host:port for a simulator (which
        serves every API on the port it serves Cloud TPU on)."""
        if self._cloud_endpoint is not None:
            return self._cloud_endpoint(cluster)
        return self.driver(cluster).tpu_endpoint()

    def _api(self, kind: str, cluster: Cluster, make: Callable[[str | None], Any]) -> Any:
        key = (kind, cluster.name)
        with self._mutex:
            api = self._apis.get(key)
        if api is None:
            api = make(self._endpoint(cluster))
            with self._mutex:
                kept = self._apis.setdefault(key, api)
            if kept is not api:
                api.close()
                api = kept
        return api

    def _objects(self, cluster: Cluster, endpoint: str | None) -> Objects:
        """Cloud Storage, or for a simulator the directory of buckets its sim.json names."""
        from ops.gcp.objects import DirObjects, GcsObjects

        if endpoint is None:
            return GcsObjects()
        sim_dir = getattr(self.driver(cluster), "sim_dir", None)  # the local driver's simulator
        info = json.loads((Path(sim_dir) / "sim.json").read_text()) if sim_dir is not None else {}
        if not info.get("buckets_dir"):
            from ops.errors import OpsError

            raise OpsError(f"{cluster.name}'s simulator names no buckets directory", "restart the cluster")
        return DirObjects(Path(info["buckets_dir"]))

    def warm(self) -> None:
        """Make every registered cluster's driver and import the Secret Manager client (tokens, SSH
        keys): no I/O, only the imports (~0.2 s) that a process's first read of every cluster would
        otherwise pay while holding the GIL (a bot's first /status under a burst; issue 10). A driver
        that cannot be made is left to the read that needs it, which says why."""
        import ops.gcp.secrets  # noqa: F401

        for cluster in self.registry.clusters.values():
            try:
                self.driver(cluster)
            except Exception as e:
                log.warning("%s: no driver made ahead of its first read: %s: %s", cluster.name,
                            type(e).__name__, e)  # fmt: skip

    def close(self) -> None:
        """Let go of what reaching heads and clouds holds open (tunnels, channels); clusters are untouched."""
        with self._mutex:
            drivers, self._drivers = list(self._drivers.values()), {}
            tpus, self._tpus = list(self._tpus.values()), {}
            apis, self._apis = list(self._apis.values()), {}
        for driver in drivers:
            driver.close()
        for api in tpus:
            api.clients.close()
        for api in apis:
            api.close()
