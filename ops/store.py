"""The durable store: a local directory by default, `gs://bucket/prefix` when configured.

Everything clusterbot must not lose (restart journals, job backups, locks) goes through here. Each
backend offers the same few primitives, each atomic through the backend's own mechanism:
create-if-absent and compare-and-set on a version (a content hash locally, the object generation on
GCS). Locks and journals are built on those two alone (FINDINGS: no `open("xb")`, no conditional
deletes on GCS).

Job backups hold the jobs' env vars, secrets included (they must, to resubmit faithfully): the local
store is private to its user (files 0600, directories 0700), and the README says how to keep a bucket
private. `open_store` checks the store before anyone relies on it: a store that cannot be used is one
BadInput naming it and the fix, not a traceback halfway through an operation.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import BaseModel

from ops.errors import BadInput, OpsError
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

    def check(self) -> None: ...
    def read(self, key: str) -> Versioned | None: ...
    def create(self, key: str, data: bytes) -> str: ...
    def replace(self, key: str, data: bytes, version: str) -> str: ...
    def put(self, key: str, data: bytes) -> str: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None:
        """Remove `key`; an absent key counts as deleted (pruning is idempotent)."""
        ...


class LocalStore:
    """A directory. Create is `link()` of a complete temp file (atomic, fails if present); compare-and-set
    holds an flock on a side file while it compares the content hash and renames a temp file in; `put`
    takes the same flock so that it cannot land between a compare-and-set's compare and its rename.

    Versions are content hashes, so compare-and-set compares values: writing the bytes already there
    leaves the version unchanged (GCS would give a new generation)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        try:
            _private_dirs(root)
        except OSError as e:
            raise _unusable(self.url, e) from None

    def check(self) -> None:
        """Write and remove a probe file: a store we cannot write would fail in the middle of a restart."""
        probe = self.root / f".probe-{uuid.uuid4().hex}"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as e:
            raise _unusable(self.url, e) from None

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad store key {key!r}")
        return self.root / key

    @staticmethod
    def _version(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:32]

    def _temp(self, path: Path, data: bytes) -> Path:
        _private_dirs(path.parent)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
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
        _private_dirs(path.parent)
        lock = path.with_name(f".{path.name}.lock")
        lockf = os.fdopen(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
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

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        path.with_name(f".{path.name}.lock").unlink(missing_ok=True)  # the compare-and-set side file
        parent = path.parent
        while parent != self.root and parent.is_relative_to(self.root):
            try:
                parent.rmdir()  # only when empty: a directory still in use stays
            except OSError:
                break
            parent = parent.parent

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


def _private_dirs(path: Path) -> None:
    """`mkdir -p` whose every new directory is 0700 (`Path.mkdir(parents=True)` gives the parents
    the default mode, 0755 under the usual umask). Existing directories are left as they are."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            if not d.is_dir():
                raise NotADirectoryError(20, "Not a directory", str(d)) from None


def _unusable(url: str, e: OSError) -> BadInput:
    if isinstance(e, (NotADirectoryError, FileExistsError)):
        where = f" ({e.filename} is a file)" if e.filename and str(e.filename) != url else ""
        return BadInput(
            f"the store {url} is not a directory{where}",
            "set CLUSTERBOT_STORE to a directory (or gs://BUCKET/PREFIX)",
        )
    return BadInput(
        f"cannot write to the store {url}: {e.strerror or e}",
        "make it writable for this user, or set CLUSTERBOT_STORE to a directory it can write",
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
        self._client = client or _gcs_client(storage, url)
        self._bucket = self._client.bucket(bucket)

    def check(self) -> None:
        """List one object under the prefix: the credentials work and the bucket exists and lets us in.
        (Not a probe write: GCS allows one write per second per object, and every process opens.)"""
        from google.api_core import exceptions as gexc
        from google.auth.exceptions import GoogleAuthError, TransportError
        from google.cloud.storage.retry import DEFAULT_RETRY

        retry = DEFAULT_RETRY.with_timeout(CHECK_TIMEOUT_S)
        try:
            blobs = self._client.list_blobs(
                self._bucket, prefix=self._prefix, max_results=1, timeout=CHECK_TIMEOUT_S, retry=retry
            )
            list(blobs)
        except gexc.NotFound:
            raise BadInput(
                f"the store's bucket {self._bucket.name} does not exist ({self.url})",
                "create it, or set CLUSTERBOT_STORE to an existing bucket",
            ) from None
        except TransportError as e:  # a network failure while getting a token: not the user's input
            raise OpsError(
                f"cannot reach Google to authenticate for the store {self.url}: {type(e).__name__}",
                "check the network and retry",
            ) from None
        except (gexc.Forbidden, gexc.Unauthorized, GoogleAuthError) as e:
            raise BadInput(
                f"no access to the store {self.url}: {getattr(e, 'message', None) or type(e).__name__}",
                "grant this machine's service account Storage Object Admin on the bucket (README)",
            ) from None
        except (gexc.GoogleAPIError, OSError) as e:
            raise OpsError(
                f"cannot reach the store {self.url}: {type(e).__name__}", "check the network and retry"
            ) from None

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

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(key).delete()
        except NotFound:
            pass

    def list(self, prefix: str) -> list[str]:
        blobs = self._client.list_blobs(self._bucket, prefix=self._prefix + prefix)
        return sorted(b.name[len(self._prefix) :] for b in blobs)


_WRITE_TOKEN = "clusterbot-write"


CHECK_TIMEOUT_S = 20.0  # open_store's look at a bucket, retries included


def _gcs_client(storage, url: str):  # noqa: ANN001, ANN202
    """A storage client; STORAGE_EMULATOR_HOST (an emulator) needs no credentials."""
    from google.auth.exceptions import DefaultCredentialsError

    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project="clusterbot",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator},
        )
    # google.auth logs a warning for each place it looked in vain; our one line says it all.
    quiet = logging.getLogger("google.auth._default")
    hush = _Hush()
    quiet.addFilter(hush)
    try:
        return storage.Client()
    except DefaultCredentialsError:
        raise BadInput(
            f"no Google Cloud credentials for the store {url}",
            "set GOOGLE_APPLICATION_CREDENTIALS to a service account key, run "
            "`gcloud auth application-default login`, or run on a VM with a service account",
        ) from None
    finally:
        quiet.removeFilter(hush)


class _Hush(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING


def default_store_url() -> str:
    return os.environ.get("CLUSTERBOT_STORE") or str(clusterbot_home() / "store")


def open_store(url: str | None = None) -> Store:
    """The store named by `url`, else by CLUSTERBOT_STORE, else `~/.clusterbot/store`, checked usable
    (BadInput naming the store and the fix otherwise)."""
    url = url or default_store_url()
    if url.startswith("gs://"):
        store: Store = GcsStore(url)
    elif "://" in url:
        raise BadInput(f"unsupported store URL {url!r}", "use a local directory or gs://BUCKET/PREFIX")
    else:
        store = LocalStore(Path(url).expanduser())
    store.check()
    return store


def read_model(store: Store, key: str, model: type[M]) -> tuple[M, str] | None:
    """A pydantic model and its version, or None when the key is absent."""
    got = store.read(key)
    return None if got is None else (model.model_validate_json(got.data), got.version)


def dump(model: BaseModel) -> bytes:
    return model.model_dump_json(indent=1).encode()
