"""Objects in Cloud Storage buckets, as Cloud Build uses them (a source tarball in, a log out): on GCS
(google-cloud-storage; fake-gcs-server in tests), or in a directory standing for all buckets
(`<root>/<bucket>/<object>`), which is where the simulated Cloud Build of the local cluster reads and
writes by default. Both sides (ops and the simulator) use the same class for the same place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol


class Objects(Protocol):
    url: str

    def read(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        ...

    def write(self, bucket: str, name: str, data: bytes) -> None: ...


class DirObjects:
    """Buckets as directories under `root` (created on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"

    def _path(self, bucket: str, name: str) -> Path:
        path = (self.root / bucket / name).resolve()
        if not path.is_relative_to(self.root.resolve()) or not bucket or "/" in bucket or not name:
            raise ValueError(f"not an object name: gs://{bucket}/{name}")
        return path

    def read(self, bucket: str, name: str) -> bytes | None:
        try:
            return self._path(bucket, name).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write(self, bucket: str, name: str, data: bytes) -> None:
        path = self._path(bucket, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class GcsObjects:
    """Cloud Storage through a google-cloud-storage client (default: application credentials)."""

    def __init__(self, client: Any | None = None) -> None:
        if client is None:
            from google.cloud import storage

            client = storage.Client()
        self.client = client
        self.url = "gs://"

    def read(self, bucket: str, name: str) -> bytes | None:
        from google.api_core import exceptions

        try:
            return self.client.bucket(bucket).blob(name).download_as_bytes()
        except exceptions.NotFound:
            return None

    def write(self, bucket: str, name: str, data: bytes) -> None:
        self.client.bucket(bucket).blob(name).upload_from_string(data)


def gcs_objects_at(endpoint: str) -> GcsObjects:
    """GcsObjects on a Cloud Storage emulator at `endpoint` (http://127.0.0.1:PORT), anonymous."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="sim", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )
    return GcsObjects(client)
