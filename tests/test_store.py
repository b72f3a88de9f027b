"""The durable store on both backends: a local directory and GCS (fake-gcs-server)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from ops.errors import BadInput
from ops.registry import DEFAULT_REGISTRY, REPO_ROOT
from ops.store import Conflict, GcsStore, LocalStore, Store, open_store
from tests.gcs_emulator import GcsEmulator, StoreFactory

JOIN_TIMEOUT_S = 30.0


def run_threads(target: Callable[[int], None], n: int) -> None:
    """Run `target(i)` in n threads released together; re-raise the first exception; bounded."""
    barrier = threading.Barrier(n, timeout=JOIN_TIMEOUT_S)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "threads did not finish in time"
    if errors:
        raise errors[0]


def test_read_missing(store: Store) -> None:
    assert store.read("nothing/here.json") is None


def test_create_then_create_again_conflicts(store: Store) -> None:
    v = store.create("a/key", b"first")
    got = store.read("a/key")
    assert got is not None and got.data == b"first" and got.version == v
    with pytest.raises(Conflict):
        store.create("a/key", b"second")
    with pytest.raises(Conflict):
        store.create("a/key", b"first")  # the same bytes are no excuse
    assert store.read("a/key").data == b"first"


def test_replace_with_right_version_and_stale_version(store: Store) -> None:
    v1 = store.create("k", b"one")
    v2 = store.replace("k", b"two", v1)
    assert v2 != v1
    got = store.read("k")
    assert got is not None and (got.data, got.version) == (b"two", v2)
    with pytest.raises(Conflict):
        store.replace("k", b"three", v1)
    assert store.read("k").data == b"two"
    v3 = store.replace("k", b"three", v2)
    assert store.read("k").version == v3


def test_replace_missing_conflicts(store: Store) -> None:
    v = store.create("k", b"x")
    with pytest.raises(Conflict):
        store.replace("other", b"y", v)
    assert store.read("other") is None


def test_put(store: Store) -> None:
    v1 = store.put("p/k", b"one")
    assert store.read("p/k").version == v1
    v2 = store.put("p/k", b"two")  # overwrites unconditionally
    got = store.read("p/k")
    assert (got.data, got.version) == (b"two", v2)
    v3 = store.replace("p/k", b"three", v2)
    assert store.read("p/k").version == v3
    with pytest.raises(Conflict):
        store.replace("p/k", b"four", v2)


def test_list_with_prefixes(store: Store) -> None:
    keys = ["locks/a.json", "locks/b.json", "jobs/x/1.json", "jobs/x/2.json", "jobs/xy.json", "top.json"]
    for k in keys:
        store.create(k, b"{}")
    # A compare-and-set must leave no side files in listings (LocalStore keeps a lock file next to it).
    store.replace("locks/a.json", b"{ }", store.read("locks/a.json").version)
    assert store.list("") == sorted(keys)
    assert store.list("locks/") == ["locks/a.json", "locks/b.json"]
    assert store.list("locks") == ["locks/a.json", "locks/b.json"]
    assert store.list("jobs/") == ["jobs/x/1.json", "jobs/x/2.json", "jobs/xy.json"]
    # A prefix is a string prefix (GCS semantics), not a directory.
    assert store.list("jobs/x") == ["jobs/x/1.json", "jobs/x/2.json", "jobs/xy.json"]
    assert store.list("jobs/x/") == ["jobs/x/1.json", "jobs/x/2.json"]
    assert store.list("locks/a") == ["locks/a.json"]
    assert store.list("t") == ["top.json"]
    assert store.list("nope/") == []
    assert store.list("nope") == []


def test_gcs_prefixes_are_isolated(gcs_server: GcsEmulator, gcs_bucket: str) -> None:
    a = GcsStore(f"gs://{gcs_bucket}/a", client=gcs_server.client())
    b = GcsStore(f"gs://{gcs_bucket}/b/", client=gcs_server.client())
    root = GcsStore(f"gs://{gcs_bucket}", client=gcs_server.client())
    a.create("k", b"in a")
    assert b.read("k") is None
    b.create("k", b"in b")
    assert a.read("k").data == b"in a"
    assert a.list("") == ["k"]
    assert root.list("") == ["a/k", "b/k"]


def test_local_rejects_keys_outside_root(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "s")
    for bad in ["../x", "/etc/passwd", "a/../../x"]:
        with pytest.raises(ValueError):
            s.read(bad)


@pytest.mark.parametrize("same_bytes", [False, True], ids=["distinct", "same-bytes"])
def test_concurrent_creates_exactly_one_wins(make_store: StoreFactory, same_bytes: bool) -> None:
    n = 8
    stores = [make_store() for _ in range(n)]
    wins: list[int] = []
    conflicts: list[int] = []

    def create(i: int) -> None:
        data = b"same" if same_bytes else f"writer {i}".encode()
        try:
            stores[i].create("race", data)
            wins.append(i)
        except Conflict:
            conflicts.append(i)

    run_threads(create, n)
    assert len(wins) == 1, wins
    assert len(conflicts) == n - 1
    if not same_bytes:
        assert stores[0].read("race").data == f"writer {wins[0]}".encode()


def test_concurrent_compare_and_set_counter(make_store: StoreFactory) -> None:
    n, per_thread, max_tries = 4, 10, 2000
    stores = [make_store() for _ in range(n)]
    stores[0].create("counter", b"0")
    done = [0] * n

    def increment(i: int) -> None:
        s = stores[i]
        for _ in range(max_tries):
            if done[i] == per_thread:
                return
            cur = s.read("counter")
            try:
                s.replace("counter", str(int(cur.data) + 1).encode(), cur.version)
            except Conflict:
                continue
            done[i] += 1
        raise AssertionError(f"thread {i} did only {done[i]} increments in {max_tries} tries")

    run_threads(increment, n)
    assert done == [per_thread] * n
    assert stores[0].read("counter").data == str(n * per_thread).encode()


class _LoseFirstUploadReply(requests.adapters.HTTPAdapter):
    """Sends the first upload to the server, then drops its reply: the client retries the upload."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def send(self, request, **kwargs):  # noqa: ANN001, ANN201
        resp = super().send(request, **kwargs)
        if request.method == "POST" and "/upload/" in request.url and self.dropped == 0:
            self.dropped += 1
            resp.close()
            raise requests.ConnectionError("reply lost (injected by the test)")
        return resp


@pytest.mark.parametrize("op", ["create", "replace"])
def test_gcs_retried_write_whose_first_try_landed(
    gcs_server: GcsEmulator,
    gcs_bucket: str,
    op: str,
) -> None:
    """The client retries an upload whose reply was lost; the retry gets 412 because the first try
    landed. The store must recognise its own write instead of reporting a Conflict."""
    plain = GcsStore(f"gs://{gcs_bucket}/p", client=gcs_server.client())
    base = plain.create("k", b"base") if op == "replace" else None
    client = gcs_server.client()
    lossy = _LoseFirstUploadReply()
    client._http.mount("http://", lossy)
    s = GcsStore(f"gs://{gcs_bucket}/p", client=client)
    v = s.create("k", b"mine") if op == "create" else s.replace("k", b"mine", base)
    assert lossy.dropped == 1
    got = plain.read("k")
    assert (got.data, got.version) == (b"mine", v)


def test_open_store_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = open_store(str(tmp_path / "here"))
    assert isinstance(s, LocalStore) and s.root == tmp_path / "here"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    s = open_store("~/st")
    assert isinstance(s, LocalStore) and s.root == tmp_path / "home" / "st"
    monkeypatch.setenv("CLUSTERBOT_STORE", str(tmp_path / "from-env"))
    assert open_store().root == tmp_path / "from-env"
    monkeypatch.delenv("CLUSTERBOT_STORE")
    monkeypatch.setenv("CLUSTERBOT_HOME", str(tmp_path / "cbhome"))
    assert open_store().root == tmp_path / "cbhome" / "store"


def test_open_store_gs_through_emulator_env(
    gcs_server: GcsEmulator,
    gcs_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    s = open_store(f"gs://{gcs_bucket}/pre")
    assert isinstance(s, GcsStore) and s.url == f"gs://{gcs_bucket}/pre"
    v = s.create("k", b"v")
    assert s.read("k").version == v
    direct = gcs_server.client().bucket(gcs_bucket).blob("pre/k")
    assert direct.download_as_bytes() == b"v"


@pytest.mark.parametrize("url", ["s3://bucket/prefix", "file:///tmp/x", "gs://", "gs:///prefix"])
def test_open_store_bad_urls(url: str) -> None:
    with pytest.raises(BadInput):
        open_store(url)


# -- the local store is private: job backups hold env-var secrets ------------------------------------
def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_local_store_files_are_0600_and_its_directories_0700(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which made 0644 files and 0755 directories
    try:
        s = open_store(str(tmp_path / "new" / "parents" / "store"))
        s.create("backups/op1/job-a.json", b'{"env_vars": {"WANDB_API_KEY": "secret"}}')
        v = s.put("locks/local.json", b"one")
        s.replace("locks/local.json", b"two", v)
        s.create("top.json", b"x")
    finally:
        os.umask(old)
    root = tmp_path / "new" / "parents" / "store"
    dirs = [tmp_path / "new", tmp_path / "new" / "parents", root, root / "backups", root / "backups" / "op1",
            root / "locks"]  # fmt: skip
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"job-a.json", "local.json", ".local.json.lock", "top.json"}
    assert not [p for p in files if p.name.endswith(".tmp") or p.name.startswith(".probe")]
    assert {str(d.relative_to(tmp_path)): oct(_mode(d)) for d in dirs} == {
        str(d.relative_to(tmp_path)): "0o700" for d in dirs
    }
    assert {p.name: oct(_mode(p)) for p in files} == {p.name: "0o600" for p in files}
    assert _mode(tmp_path) == 0o700  # pytest's own directory: existing directories are left alone


# -- a store that cannot be used: one line naming it and the fix, exit 2 ----------------------------
def test_open_store_refuses_a_file_in_process(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("not a directory")
    with pytest.raises(BadInput, match="is not a directory") as e:
        open_store(str(tmp_path / "f"))
    assert "CLUSTERBOT_STORE" in e.value.hint
    with pytest.raises(BadInput, match=r"is not a directory \(.*/f is a file\)"):
        open_store(str(tmp_path / "f" / "store"))


def test_open_store_refuses_a_missing_bucket(
    gcs_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    with pytest.raises(BadInput, match="bucket no-such-bucket does not exist"):
        open_store("gs://no-such-bucket/prefix")


def _bad_store(kind: str, base: Path) -> tuple[str, str, str]:
    """(CLUSTERBOT_STORE, what the line must say, the fix it must name) for one kind of bad store."""
    if kind == "read-only":
        ro = base / "ro-store"
        ro.mkdir()
        ro.chmod(0o555)
        # root writes into a 0555 directory: make it immutable instead (undone by _remove)
        if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(ro)], timeout=10).returncode != 0:
            pytest.skip("running as root and cannot make a directory immutable (chattr)")
        return str(ro), f"cannot write to the store {ro}: ", "make it writable"
    if kind == "a-file":
        f = base / "store-file"
        f.write_text("I am a file")
        return str(f), f"the store {f} is not a directory", "set CLUSTERBOT_STORE to a directory"
    url = "gs://clusterbot-state/prod"
    return url, f"no Google Cloud credentials for the store {url}", "GOOGLE_APPLICATION_CREDENTIALS"


def _remove(base: Path) -> None:
    ro = base / "ro-store"
    if ro.exists():
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(ro)], check=False, timeout=10)
        ro.chmod(0o755)
    shutil.rmtree(base)


@pytest.mark.parametrize("command", ["ops status", "bot"])
@pytest.mark.parametrize("kind", ["read-only", "a-file", "gs-without-credentials"])
def test_bad_store_is_one_line_and_exit_2(kind: str, command: str) -> None:
    """As a user meets it: the CLI and the bot at start-up, a child process each, stdin closed."""
    base = Path(tempfile.mkdtemp(prefix="cb-badstore-"))
    try:
        url, says, fix = _bad_store(kind, base)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CLUSTERBOT_", "RAY_AUTH", "GOOGLE_", "CLOUDSDK_"))
               and k not in ("STORAGE_EMULATOR_HOST", "DISCORD_TOKEN")}  # fmt: skip
        env.update(
            CLUSTERBOT_STORE=url,
            CLUSTERBOT_HOME=str(base / "home"),
            CLUSTERBOT_REGISTRY=str(DEFAULT_REGISTRY),
            HOME=str(base),  # no application default credentials of the person running the tests
            CLOUDSDK_CONFIG=str(base / "gcloud"),
            NO_GCE_CHECK="true",  # nor of a VM the tests may run on
        )
        argv = [sys.executable, "-m", *command.split()]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=60, cwd=REPO_ROOT)  # fmt: skip
    finally:
        _remove(base)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc
    assert len(lines) == 1 and says in lines[0] and fix in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
