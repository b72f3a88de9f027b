"""A simulated Secret Manager v1 (`google.cloud.secretmanager.v1.SecretManagerService`): secrets, their
versions ENABLED / DISABLED / DESTROYED, payloads with crc32c, and `latest` as GCP_API_FACTS.md 3.3
says (the newest version whatever its state: a disabled newest one is FAILED_PRECONDITION, no fallback).

Simulator choices where the facts leave a question open: names use the project as given (Google may show
the project number); a secret without `replication` is INVALID_ARGUMENT; a crc32c mismatch on add is
INVALID_ARGUMENT; enabling or disabling a DESTROYED version and an etag mismatch are FAILED_PRECONDITION.
Payloads never reach a log or an error message. With a `path`, the state is kept in that file (0600).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from base64 import b64decode, b64encode
from pathlib import Path
from typing import Any

import google_crc32c
import grpc
from google.cloud import secretmanager_v1 as sm
from google.protobuf import empty_pb2, timestamp_pb2

from ops.sim.faults import Faults
from ops.sim.rpc import Methods, page, resource_of, service_handler
from ops.sim.state import SimError

SERVICE = "google.cloud.secretmanager.v1.SecretManagerService"
State = sm.SecretVersion.State
MAX_PAYLOAD = 64 * 1024
_SECRET_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_PROJECT_RE = re.compile(r"^projects/([^/]+)$")
_SECRET_RE = re.compile(r"^projects/([^/]+)/secrets/([^/]+)$")
_VERSION_RE = re.compile(r"^(projects/[^/]+/secrets/[^/]+)/versions/([^/]+)$")
PERMISSIONS = {
    "CreateSecret": "secretmanager.secrets.create",
    "GetSecret": "secretmanager.secrets.get",
    "ListSecrets": "secretmanager.secrets.list",
    "DeleteSecret": "secretmanager.secrets.delete",
    "AddSecretVersion": "secretmanager.versions.add",
    "GetSecretVersion": "secretmanager.versions.get",
    "ListSecretVersions": "secretmanager.versions.list",
    "AccessSecretVersion": "secretmanager.versions.access",
    "EnableSecretVersion": "secretmanager.versions.enable",
    "DisableSecretVersion": "secretmanager.versions.disable",
    "DestroySecretVersion": "secretmanager.versions.destroy",
}


def _ts() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts


def _etag() -> str:
    return f'"{secrets.token_hex(7)[:13]}"'


def crc32c(data: bytes) -> int:
    return google_crc32c.value(data)


class SecretState:
    """Secrets by full name, each with its versions (oldest first) and their payloads."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._secrets: dict[str, sm.Secret] = {}
        self._versions: dict[str, list[sm.SecretVersion]] = {}
        self._payloads: dict[str, bytes] = {}  # version name -> data (gone once DESTROYED)
        if path is not None and path.exists():
            self._load(path)

    # ---- for the simulator's owner (no RPC) ---------------------------------------------------
    def seed(self, project: str, values: dict[str, bytes | str]) -> None:
        """Create each secret (if absent) and add `value` as a new version unless it is already the
        latest enabled one: the local cluster's secrets (its Ray token) at the simulator's start."""
        for secret_id, value in values.items():
            data = value.encode() if isinstance(value, str) else value
            name = f"projects/{project}/secrets/{secret_id}"
            if name not in self._secrets:
                self.create_secret(f"projects/{project}", secret_id, sm.Secret(replication={"automatic": {}}))
            versions = self._versions[name]
            if (
                versions
                and versions[-1].state == State.ENABLED
                and self._payloads.get(versions[-1].name) == data
            ):
                continue
            self.add_version(name, sm.SecretPayload(data=data))

    def summary(self) -> dict:
        """Secret names and their versions' states (never a payload), for the control endpoint."""
        with self._lock:
            return {
                name: {v.name.rsplit("/", 1)[-1]: State(v.state).name for v in self._versions[name]}
                for name in self._secrets
            }

    # ---- secrets ------------------------------------------------------------------------------
    def create_secret(self, parent: str, secret_id: str, secret: sm.Secret) -> sm.Secret:
        if not _PROJECT_RE.match(parent):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
        if not _SECRET_ID_RE.match(secret_id or ""):
            raise SimError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid secret id {secret_id!r}: at most 255 letters, digits, '-' or '_'",
            )
        if not sm.Secret.pb(secret).HasField("replication"):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "Secret.replication is required")
        name = f"{parent}/secrets/{secret_id}"
        with self._lock:
            if name in self._secrets:
                raise SimError(grpc.StatusCode.ALREADY_EXISTS, f"Secret [{name}] already exists.")
            stored = _copy(secret)
            stored.name = name
            stored.create_time = _ts()
            stored.etag = _etag()
            self._secrets[name] = stored
            self._versions[name] = []
            self._save()
            return _copy(stored)

    def get_secret(self, name: str) -> sm.Secret:
        with self._lock:
            return _copy(self._secret(name))

    def list_secrets(self, parent: str) -> list[sm.Secret]:
        if not _PROJECT_RE.match(parent):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid parent: {parent!r}")
        with self._lock:
            return [_copy(s) for n, s in sorted(self._secrets.items()) if n.startswith(f"{parent}/")]

    def delete_secret(self, name: str) -> None:
        with self._lock:
            self._secret(name)
            for version in self._versions.pop(name):
                self._payloads.pop(version.name, None)
            del self._secrets[name]
            self._save()

    # ---- versions -----------------------------------------------------------------------------
    def add_version(self, parent: str, payload: sm.SecretPayload) -> sm.SecretVersion:
        data = payload.data
        if len(data) > MAX_PAYLOAD:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Secret payload exceeds {MAX_PAYLOAD} bytes.")
        given = "data_crc32c" in payload
        if given and payload.data_crc32c != crc32c(data):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, "Checksum mismatch: data_crc32c does not match.")
        with self._lock:
            versions = self._versions_of(parent)
            version = sm.SecretVersion(
                name=f"{parent}/versions/{len(versions) + 1}",
                create_time=_ts(),
                state=State.ENABLED,
                etag=_etag(),
                client_specified_payload_checksum=given,
            )
            versions.append(version)
            self._payloads[version.name] = bytes(data)
            self._save()
            return _copy(version)

    def get_version(self, name: str) -> sm.SecretVersion:
        with self._lock:
            return _copy(self._version(name))

    def list_versions(self, parent: str, filter_: str = "") -> list[sm.SecretVersion]:
        """Newest first; `filter` understands `state:ENABLED` (and DISABLED, DESTROYED)."""
        want = None
        if filter_:
            m = re.fullmatch(r"\s*state\s*[:=]\s*(\w+)\s*", filter_)
            if m is None or m.group(1).upper() not in State.__members__:
                raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Unsupported filter {filter_!r}")
            want = State[m.group(1).upper()]
        with self._lock:
            found = [_copy(v) for v in reversed(self._versions_of(parent))]
        return [v for v in found if want is None or v.state == want]

    def access(self, name: str) -> sm.AccessSecretVersionResponse:
        with self._lock:
            version = self._version(name)
            if version.state != State.ENABLED:
                raise SimError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Secret Version [{version.name}] is in {State(version.state).name} state.",
                )
            data = self._payloads[version.name]
            return sm.AccessSecretVersionResponse(
                name=version.name, payload=sm.SecretPayload(data=data, data_crc32c=crc32c(data))
            )

    def set_state(self, name: str, state: State, etag: str = "") -> sm.SecretVersion:
        """Enable, disable or destroy version `name` (a number or `latest`)."""
        with self._lock:
            version = self._version(name)
            if etag and etag != version.etag:
                raise SimError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"The etag {etag} does not match the current etag of [{version.name}].",
                )
            if version.state == State.DESTROYED:
                if state == State.DESTROYED:
                    return _copy(version)
                raise SimError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Secret Version [{version.name}] is in DESTROYED state.",
                )
            version.state = state
            version.etag = _etag()
            if state == State.DESTROYED:
                version.destroy_time = _ts()
                self._payloads.pop(version.name, None)
            self._save()
            return _copy(version)

    # ---- helpers (under the lock) -------------------------------------------------------------
    def _secret(self, name: str) -> sm.Secret:
        if not _SECRET_RE.match(name):
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid secret name: {name!r}")
        secret = self._secrets.get(name)
        if secret is None:
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Secret [{name}] not found or has no versions.")
        return secret

    def _versions_of(self, parent: str) -> list[sm.SecretVersion]:
        self._secret(parent)
        return self._versions[parent]

    def _version(self, name: str) -> sm.SecretVersion:
        m = _VERSION_RE.match(name)
        if not m:
            raise SimError(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid secret version name: {name!r}")
        parent, which = m.groups()
        versions = self._versions.get(parent) if parent in self._secrets else None
        if not versions:
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Secret [{parent}] not found or has no versions.")
        if which == "latest":
            return versions[-1]
        if not which.isdigit() or not 1 <= int(which) <= len(versions):
            raise SimError(grpc.StatusCode.NOT_FOUND, f"Secret Version [{name}] not found.")
        return versions[int(which) - 1]

    # ---- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        if self._path is None:
            return
        data = {
            "secrets": {n: json.loads(sm.Secret.to_json(s)) for n, s in self._secrets.items()},
            "versions": {
                n: [json.loads(sm.SecretVersion.to_json(v)) for v in vs] for n, vs in self._versions.items()
            },
            "payloads": {n: b64encode(d).decode() for n, d in self._payloads.items()},
        }
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self._path)

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self._secrets = {n: sm.Secret.from_json(json.dumps(s)) for n, s in data["secrets"].items()}
        self._versions = {
            n: [sm.SecretVersion.from_json(json.dumps(v)) for v in vs] for n, vs in data["versions"].items()
        }
        self._payloads = {n: b64decode(d) for n, d in data["payloads"].items()}


def _copy(msg: Any) -> Any:
    return type(msg).deserialize(type(msg).serialize(msg))


def secrets_handler(state: SecretState, faults: Faults) -> grpc.GenericRpcHandler:
    """The Secret Manager v1 service over `state`."""

    def list_secrets(r: sm.ListSecretsRequest) -> sm.ListSecretsResponse:
        items = state.list_secrets(r.parent)
        found, token = page(items, r.page_size, r.page_token)
        return sm.ListSecretsResponse(secrets=found, next_page_token=token, total_size=len(items))

    def list_versions(r: sm.ListSecretVersionsRequest) -> sm.ListSecretVersionsResponse:
        items = state.list_versions(r.parent, r.filter)
        found, token = page(items, r.page_size, r.page_token)
        return sm.ListSecretVersionsResponse(versions=found, next_page_token=token, total_size=len(items))

    def delete_secret(r: sm.DeleteSecretRequest) -> empty_pb2.Empty:
        state.delete_secret(r.name)
        return empty_pb2.Empty()

    methods: Methods = {
        "CreateSecret": (
            sm.CreateSecretRequest,
            sm.Secret,
            lambda r: state.create_secret(r.parent, r.secret_id, r.secret),
        ),
        "GetSecret": (sm.GetSecretRequest, sm.Secret, lambda r: state.get_secret(r.name)),
        "ListSecrets": (sm.ListSecretsRequest, sm.ListSecretsResponse, list_secrets),
        "DeleteSecret": (sm.DeleteSecretRequest, empty_pb2.Empty, delete_secret),
        "AddSecretVersion": (
            sm.AddSecretVersionRequest,
            sm.SecretVersion,
            lambda r: state.add_version(r.parent, r.payload),
        ),
        "GetSecretVersion": (
            sm.GetSecretVersionRequest,
            sm.SecretVersion,
            lambda r: state.get_version(r.name),
        ),
        "ListSecretVersions": (sm.ListSecretVersionsRequest, sm.ListSecretVersionsResponse, list_versions),
        "AccessSecretVersion": (
            sm.AccessSecretVersionRequest,
            sm.AccessSecretVersionResponse,
            lambda r: state.access(r.name),
        ),
        "EnableSecretVersion": (
            sm.EnableSecretVersionRequest,
            sm.SecretVersion,
            lambda r: state.set_state(r.name, State.ENABLED, r.etag),
        ),
        "DisableSecretVersion": (
            sm.DisableSecretVersionRequest,
            sm.SecretVersion,
            lambda r: state.set_state(r.name, State.DISABLED, r.etag),
        ),
        "DestroySecretVersion": (
            sm.DestroySecretVersionRequest,
            sm.SecretVersion,
            lambda r: state.set_state(r.name, State.DESTROYED, r.etag),
        ),
    }
    return service_handler(SERVICE, methods, faults, PERMISSIONS, resource_of)
