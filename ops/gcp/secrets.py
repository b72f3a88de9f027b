"""Secret Manager for ops: secrets and their versions in one project (GCP_API_FACTS.md 3), against Google
or, on the local cluster and in tests, the simulator.

A payload never appears in a log, an exception or a repr: `access` returns pydantic's SecretBytes, and
errors name the secret and version only. We send a crc32c with every version and check the one returned
on access (the client library does neither). Versions are addressed by number; `latest` is the newest
whatever its state (a disabled newest version is an error, not a fall back to an older one).
"""

from __future__ import annotations

from datetime import datetime

import google_crc32c
import grpc
from google.api_core import exceptions
from google.api_core.retry import Retry
from google.cloud import secretmanager_v1 as sm
from pydantic import BaseModel, SecretBytes, SecretStr

from ops.errors import OpsError, Refused
from ops.gcp import common

ACCESSOR = "roles/secretmanager.secretAccessor"
ADDER = "roles/secretmanager.secretVersionAdder"
MANAGER = "roles/secretmanager.secretVersionManager"
ADMIN = "roles/secretmanager.admin"
VIEWER = "roles/secretmanager.viewer"


class SecretVersionInfo(BaseModel):
    name: str  # projects/P/secrets/S/versions/N
    secret_id: str
    version: str  # "3"
    state: str  # ENABLED | DISABLED | DESTROYED
    create_time: datetime | None = None
    etag: str = ""


def secrets_client(endpoint: str | None) -> tuple[sm.SecretManagerServiceClient, grpc.Channel | None]:
    """The client for Google (`endpoint` None: application default credentials) or for the simulator
    at host:port, with the channel to close (None for Google's)."""
    if endpoint is None:
        return sm.SecretManagerServiceClient(), None
    from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
        SecretManagerServiceGrpcTransport,
    )

    channel = common.channel(endpoint)
    return sm.SecretManagerServiceClient(
        transport=SecretManagerServiceGrpcTransport(channel=channel)
    ), channel


class SecretsApi:
    """Secret Manager in one project, through a client passed in."""

    def __init__(
        self,
        client: sm.SecretManagerServiceClient,
        project: str,
        *,
        retry: Retry | None = None,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.client = client
        self.project = project
        self.retry = retry or common.retry()
        self._channel = channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def secret_name(self, secret_id: str) -> str:
        return f"projects/{self.project}/secrets/{secret_id}"

    def version_name(self, secret_id: str, version: str | int = "latest") -> str:
        return f"{self.secret_name(secret_id)}/versions/{version}"

    # ---- secrets ------------------------------------------------------------------------------
    def create(self, secret_id: str, labels: dict[str, str] | None = None) -> bool:
        """Create the secret (automatic replication); False when it already existed (idempotent)."""
        try:
            self.client.create_secret(
                parent=f"projects/{self.project}",
                secret_id=secret_id,
                secret=sm.Secret(replication={"automatic": {}}, labels=labels or {}),
                retry=self.retry,
            )
        except exceptions.AlreadyExists:
            return False
        except Exception as e:
            raise common.api_error(e, f"create secret {secret_id}", ADMIN, self.project) from None
        return True

    def exists(self, secret_id: str) -> bool:
        try:
            self.client.get_secret(name=self.secret_name(secret_id), retry=self.retry)
        except exceptions.NotFound:
            return False
        except Exception as e:
            raise common.api_error(e, f"look up secret {secret_id}", VIEWER, self.project) from None
        return True

    # ---- versions -----------------------------------------------------------------------------
    def add_version(self, secret_id: str, value: bytes | str | SecretBytes | SecretStr) -> SecretVersionInfo:
        """A new version holding `value` (the newest: what `latest` now means)."""
        if isinstance(value, SecretBytes | SecretStr):
            value = value.get_secret_value()
        data = value.encode() if isinstance(value, str) else bytes(value)
        payload = sm.SecretPayload(data=data, data_crc32c=google_crc32c.value(data))
        try:
            version = self.client.add_secret_version(
                parent=self.secret_name(secret_id), payload=payload, retry=self.retry
            )
        except exceptions.NotFound:
            raise OpsError(
                f"secret {secret_id} does not exist in project {self.project}", "create it first"
            ) from None
        except Exception as e:
            raise common.api_error(e, f"add a version to secret {secret_id}", ADDER, self.project) from None
        return _info(version)

    def access(self, secret_id: str, version: str | int = "latest") -> SecretBytes:
        """The version's value, checked against its crc32c; Refused when that version is disabled or
        destroyed, OpsError when it does not exist."""
        what = f"secret {secret_id} version {version}"
        try:
            resp = self.client.access_secret_version(
                name=self.version_name(secret_id, version), retry=self.retry
            )
        except exceptions.NotFound:
            raise OpsError(f"{what} does not exist in project {self.project}") from None
        except exceptions.FailedPrecondition as e:
            state = "destroyed" if "DESTROYED" in (e.message or "") else "disabled"
            raise Refused(f"{what} is {state}", "use another version, or enable this one") from None
        except Exception as e:
            raise common.api_error(e, f"read {what}", ACCESSOR, self.project) from None
        data = resp.payload.data
        if "data_crc32c" in resp.payload and resp.payload.data_crc32c != google_crc32c.value(data):
            raise OpsError(f"{what} arrived corrupted (crc32c mismatch)", "try again")
        return SecretBytes(data)

    def version(self, secret_id: str, version: str | int = "latest") -> SecretVersionInfo | None:
        """The version's metadata (`latest`: the newest, resolved to its number); None when absent."""
        try:
            return _info(
                self.client.get_secret_version(name=self.version_name(secret_id, version), retry=self.retry)
            )
        except exceptions.NotFound:
            return None
        except Exception as e:
            raise common.api_error(
                e, f"look up secret {secret_id} version {version}", VIEWER, self.project
            ) from None

    def versions(self, secret_id: str) -> list[SecretVersionInfo]:
        """Every version, newest first; [] when the secret does not exist."""
        try:
            return [
                _info(v)
                for v in self.client.list_secret_versions(
                    parent=self.secret_name(secret_id), retry=self.retry
                )
            ]
        except exceptions.NotFound:
            return []
        except Exception as e:
            raise common.api_error(
                e, f"list the versions of secret {secret_id}", VIEWER, self.project
            ) from None

    def disable(self, secret_id: str, version: str | int) -> SecretVersionInfo:
        return self._set(secret_id, version, "disable")

    def enable(self, secret_id: str, version: str | int) -> SecretVersionInfo:
        return self._set(secret_id, version, "enable")

    def destroy(self, secret_id: str, version: str | int) -> SecretVersionInfo:
        """Irreversible: the value is gone."""
        return self._set(secret_id, version, "destroy")

    def _set(self, secret_id: str, version: str | int, verb: str) -> SecretVersionInfo:
        what = f"secret {secret_id} version {version}"
        method = getattr(self.client, f"{verb}_secret_version")
        try:
            return _info(method(name=self.version_name(secret_id, version), retry=self.retry))
        except exceptions.NotFound:
            raise OpsError(f"{what} does not exist in project {self.project}") from None
        except exceptions.FailedPrecondition as e:
            raise Refused(f"cannot {verb} {what}: {e.message}") from None
        except Exception as e:
            raise common.api_error(e, f"{verb} {what}", MANAGER, self.project) from None


def _info(v: sm.SecretVersion) -> SecretVersionInfo:
    parts = v.name.split("/")
    return SecretVersionInfo(
        name=v.name,
        secret_id=parts[3],
        version=parts[5],
        state=sm.SecretVersion.State(v.state).name,
        create_time=v.create_time or None,
        etag=v.etag,
    )
