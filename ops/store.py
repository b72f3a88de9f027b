"""The durable store: a local directory by default, `gs://bucket/prefix` when configured.

Everything clusterbot must not lose (restart journals, job backups, locks) goes through here. Each
backend offers the same few primitives, each atomic through the backend's own mechanism:
create-if-absent and compare-and-set on a version (a content hash locally, the object generation on
GCS). Locks and journals are built on those two alone (FINDINGS: no `open("xb")`, no conditional
deletes on GCS).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import BaseModel

from ops.errors import BadInput
from ops.registry import clusterbot_home

M = TypeVar("M", bound=BaseModel)


class Conflict(Exception):
    """A create found the key present, or a compare-and-set found another version."""


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: str


class Store(Protocol):
    url: str

    def read(self, key: str) -> Versioned | None: ...
    def create(self, key: str, data: bytes) -> str: ...
    def replace(self, key: str, data: bytes, version: str) -> str: ...
    def put(self, key: str, data: bytes) -> str: ...
    def list(self, prefix: str) -> list[str]: ...


class LocalStore:
    """A directory. Create is `link()` of a complete temp file (atomic, fails if present); compare-and-set
    holds an flock on a side file while it compares the content hash and renames a temp file in; `put`
    takes the same flock so that it cannot land between a compare-and-set's compare and its rename.

    Versions are content hashes, so compare-and-set compares values: writing the bytes already there
    leaves the version unchanged (GCS would give a new generation)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad store key {key!r}")
        return self.root / key

    @staticmethod
    def _version(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:32]

    def _temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    @staticmethod
    def _sync_dir(path: Path) -> None:
        """Make a link or rename in `path`'s directory durable."""
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _locked(self, path: Path):  # noqa: ANN202 - an open file holding an exclusive flock
        path.parent.mkdir(parents=True, exist_ok=True)
        lockf = open(path.with_name(f".{path.name}.lock"), "a")
        fcntl.flock(lockf, fcntl.LOCK_EX)
        return lockf

    def read(self, key: str) -> Versioned | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return Versioned(data, self._version(data))

    def create(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise Conflict(key) from None
        finally:
            tmp.unlink()
        self._sync_dir(path)
        return self._version(data)

    def replace(self, key: str, data: bytes, version: str) -> str:
        path = self._path(key)
        with self._locked(path):
            current = self.read(key)
            if current is None or current.version != version:
                raise Conflict(key)
            os.replace(self._temp(path, data), path)
        self._sync_dir(path)
        return self._version(data)

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        with self._locked(path):
            os.replace(self._temp(path, data), path)
        self._sync_dir(path)
        return self._version(data)

    def list(self, prefix: str) -> list[str]:
        """Keys starting with `prefix` as a string (like a GCS prefix: "a/b" matches "a/bc/d")."""
        if prefix and not prefix.endswith("/"):
            head, _, _ = prefix.rpartition("/")
        else:
            head = prefix.rstrip("/")
        base = self._path(head) if head else self.root
        if not base.is_dir():
            return []
        return sorted(
            key
            for p in base.rglob("*")
            if not p.name.startswith(".")
            and p.is_file()
            and (key := p.relative_to(self.root).as_posix()).startswith(prefix)
        )


class GcsStore:
    """A bucket prefix through google-cloud-storage: `if_generation_match=0` creates only when absent,
    `if_generation_match=G` replaces only generation G (GCP_API_FACTS.md 6.1)."""

    def __init__(self, url: str, client: object | None = None) -> None:
        from google.api_core.exceptions import PreconditionFailed
        from google.cloud import storage

        self._precondition_failed = PreconditionFailed
        rest = url.removeprefix("gs://")
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise BadInput(f"bad store URL {url!r}", "use gs://BUCKET[/PREFIX]")
        self.url = url
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._client = client or _gcs_client(storage)
        self._bucket = self._client.bucket(bucket)

    def _blob(self, key: str):  # noqa: ANN202 - google.cloud.storage.Blob
        return self._bucket.blob(self._prefix + key)

    def read(self, key: str) -> Versioned | None:
        from google.api_core.exceptions import NotFound

        blob = self._blob(key)
        try:
            data = blob.download_as_bytes()
        except NotFound:
            return None
        return Versioned(data, str(blob.generation))

    def _upload(self, key: str, data: bytes, generation: int | None) -> str:
        from google.api_core.exceptions import NotFound

        blob = self._blob(key)
        # Each write carries a unique token: a retried conditional upload whose first try landed (but
        # whose reply was lost) comes back 412, and only the token tells our write from someone else's
        # (comparing bytes would let two creates or two increments of the same value both "win"). If a
        # third writer replaced our landed write before we look, we still report a Conflict.
        token = uuid.uuid4().hex
        blob.metadata = {_WRITE_TOKEN: token}
        try:
            blob.upload_from_string(data, if_generation_match=generation)
        except self._precondition_failed:
            if generation is not None:
                current = self._blob(key)
                try:
                    current.reload()
                except NotFound:
                    raise Conflict(key) from None
                if (current.metadata or {}).get(_WRITE_TOKEN) == token:
                    return str(current.generation)
            raise Conflict(key) from None
        return str(blob.generation)

    def create(self, key: str, data: bytes) -> str:
        return self._upload(key, data, 0)

    def replace(self, key: str, data: bytes, version: str) -> str:
        return self._upload(key, data, int(version))

    def put(self, key: str, data: bytes) -> str:
        return self._upload(key, data, None)

    def list(self, prefix: str) -> list[str]:
        blobs = self._client.list_blobs(self._bucket, prefix=self._prefix + prefix)
        return sorted(b.name[len(self._prefix) :] for b in blobs)


_WRITE_TOKEN = "clusterbot-write"


def _gcs_client(storage):  # noqa: ANN001, ANN202
    """A storage client; STORAGE_EMULATOR_HOST (an emulator) needs no credentials."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project="clusterbot",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator},
        )
    return storage.Client()


def default_store_url() -> str:
    return os.environ.get("CLUSTERBOT_STORE") or str(clusterbot_home() / "store")


def open_store(url: str | None = None) -> Store:
    """The store named by `url`, else by CLUSTERBOT_STORE, else `~/.clusterbot/store`."""
    url = url or default_store_url()
    if url.startswith("gs://"):
        return GcsStore(url)
    if "://" in url:
        raise BadInput(f"unsupported store URL {url!r}", "use a local directory or gs://BUCKET/PREFIX")
    return LocalStore(Path(url).expanduser())


def read_model(store: Store, key: str, model: type[M]) -> tuple[M, str] | None:
    """A pydantic model and its version, or None when the key is absent."""
    got = store.read(key)
    return None if got is None else (model.model_validate_json(got.data), got.version)


def dump(model: BaseModel) -> bytes:
    return model.model_dump_json(indent=1).encode()
