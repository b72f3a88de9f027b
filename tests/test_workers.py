"""add-worker, the ledger and the workers view against the TPU simulator through the real clients:
one queued resource per request however often it is retried, each fault ending in its message with
nothing left behind, --count, types valid per zone, the cluster inferred from the type, a preempted
worker flagged, re-adding after a restart, and the CLI's exit codes and JSON."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ops.context import Context
from ops.errors import BadInput, Refused
from ops.gcp.tpu import LABEL_CLUSTER, TpuApi, default_retry, tpu_clients
from ops.locks import acquire, current_lock
from ops.registry import Registry, TokenSource
from ops.sim import FaultKind, Latency, SimServer
from ops.store import LocalStore
from ops.workers import (
    Settings,
    add_worker,
    candidates,
    due_workers,
    ledger,
    readd_workers,
    resolve_cluster,
    startup_script,
    workers_view,
)

ZONE = "local-sim-a"
FAST = Settings(timeout_s=10, lease_s=30)


def registry() -> Registry:
    base = {"driver": "local", "project": "proj", "head_machine_type": "this machine", "min_workers": 0,
            "max_workers": 4, "token": None}  # fmt: skip
    return Registry.model_validate(
        {
            "image_repository": "marin",
            "image_name": "marin_cluster",
            "clusters": {
                "local": {
                    **base,
                    "name": "local",
                    "ray_cluster_name": "cb-local",
                    "region": "local-sim",
                    "zone": ZONE,
                    "tpu_generation": "v4",
                    "worker_tpu_type": "v4-8",
                    "dashboard_url": "http://127.0.0.1:9",
                },  # fmt: skip
                "sim-b": {
                    **base,
                    "name": "sim-b",
                    "ray_cluster_name": "cb-sim-b",
                    "region": "local-sim",
                    "zone": "local-sim-b",
                    "tpu_generation": "v5e",
                    "worker_tpu_type": "v5litepod-4",
                    "dashboard_url": "http://127.0.0.1:9",
                },  # fmt: skip
                "sim-a2": {
                    **base,
                    "name": "sim-a2",
                    "ray_cluster_name": "cb-sim-a2",
                    "region": "local-sim",
                    "zone": ZONE,
                    "tpu_generation": "v5e",
                    "worker_tpu_type": "v5litepod-4",
                    "dashboard_url": "http://127.0.0.1:9",
                },  # fmt: skip
                "big": {
                    **base,
                    "name": "big",
                    "ray_cluster_name": "cb-big",
                    "region": "local-sim",
                    "zone": ZONE,
                    "tpu_generation": "v4",
                    "worker_tpu_type": "v4-8",
                    "protected": True,
                    "dashboard_url": "http://127.0.0.1:9",
                },  # fmt: skip
            },
        }
    )


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(latency=Latency(queue_s=0.05, provision_s=0.05)) as server:
        yield server


@pytest.fixture
def ctx(sim: SimServer, tmp_path: Path) -> Iterator[Context]:
    clients = tpu_clients(sim.address)
    retry = default_retry(deadline_s=5, initial_s=0.01, maximum_s=0.05)
    api = TpuApi(clients, "proj", retry=retry, poll_s=0.02)
    context = Context(LocalStore(tmp_path / "store"), registry(), tpu_factory=lambda c: api)
    yield context
    context.close()


def cloud(ctx: Context) -> tuple[list[str], list[str]]:
    api = ctx.tpu(ctx.cluster("local"))
    return [q.qr_id for q in api.list_queued_resources(ZONE)], [n.node_id for n in api.list_nodes(ZONE)]


def test_alice_adds_a_reserved_v4_8_and_the_ledger_says_who_and_why(ctx: Context) -> None:
    lines: list[str] = []
    result = add_worker(ctx, "v4-8", "reserved", by="alice", cluster="local", reason="eval sweep",
                        hours=6, progress=lines.append, settings=FAST)  # fmt: skip
    assert result.ok and result.cluster == "local" and len(result.workers) == 1
    [record] = ledger(ctx, "local")
    assert (record.added_by, record.reason, record.capacity, record.state) == (
        "alice",
        "eval sweep",
        "reserved",
        "ready",
    )
    assert record.until is not None and record.until - record.added_at == timedelta(hours=6)
    assert any("WAITING_FOR_RESOURCES" in line for line in lines) and lines[-1].endswith("READY")
    node = ctx.tpu(ctx.cluster("local")).list_nodes(ZONE)[0]
    assert node.labels[LABEL_CLUSTER] == "local" and not any(k.startswith("ray-") for k in node.labels)
    assert current_lock(ctx.store, "local") is None  # the lock taken for it was given back
    assert "1 of 1 v4-8 (reserved) ready on local" in result.summary()


def test_the_same_request_twice_creates_one_queued_resource(ctx: Context) -> None:
    first = add_worker(ctx, "v4-8", "spot", by="alice", cluster="local", settings=FAST)
    again = add_worker(ctx, "v4-8", "spot", by="alice", cluster="local", settings=FAST)
    assert first.ok and again.ok and again.workers[0].already
    assert first.workers[0].qr_id == again.workers[0].qr_id
    assert cloud(ctx) == ([first.workers[0].qr_id], [first.workers[0].qr_id])
    assert len(ledger(ctx, "local")) == 1


def test_count_two_makes_two_and_a_retry_of_the_same_op_adds_none(ctx: Context) -> None:
    result = add_worker(ctx, "v6e-8", "best-effort", by="bob", cluster="local", count=2, key="op-1",
                        settings=FAST)  # fmt: skip
    assert result.ok and len({w.qr_id for w in result.workers}) == 2
    add_worker(ctx, "v6e-8", "best-effort", by="bob", cluster="local", count=2, key="op-1", settings=FAST)
    qrs, nodes = cloud(ctx)
    assert len(qrs) == 2 and sorted(qrs) == sorted(nodes)


@pytest.mark.parametrize(
    ("fault", "capacity", "says"),
    [
        ("quota", "spot", "quota for v4-8 in local-sim is used up"),
        ("stock_out", "spot", "no v4-8 capacity in local-sim-a right now (stock-out)"),
        ("reservation", "reserved", "the reservation has no free v4-8 capacity"),
        ("stay_waiting", "best-effort", "was not ready after 0.5 s (still WAITING_FOR_RESOURCES)"),
    ],
)
def test_each_fault_ends_in_its_message_with_nothing_left(
    ctx: Context, sim: SimServer, fault: str, capacity: str, says: str
) -> None:
    sim.fault(FaultKind(fault), zone=ZONE)
    result = add_worker(ctx, "v4-8", capacity, by="alice", cluster="local",
                        settings=Settings(timeout_s=0.5, lease_s=30))  # fmt: skip
    [worker] = result.workers
    assert not result.ok and worker.state == "failed" and worker.left == []
    assert says in worker.error and "Nothing is left in the cloud." in worker.error
    assert cloud(ctx) == ([], []) and ledger(ctx, "local") == []
    assert current_lock(ctx.store, "local") is None


def test_a_type_the_zone_does_not_offer_is_bad_input_listing_the_valid_ones(ctx: Context) -> None:
    with pytest.raises(BadInput) as bad:
        add_worker(ctx, "v6e-8", "spot", by="alice", cluster="sim-b", settings=FAST)
    assert "local-sim-b offers no v6e-8" in str(bad.value) and "v5litepod-4" in str(bad.value)
    with pytest.raises(BadInput, match="not a TPU type"):
        add_worker(ctx, "h100", "spot", by="alice", settings=FAST)
    with pytest.raises(BadInput, match="unknown capacity"):
        add_worker(ctx, "v4-8", "cheap", by="alice", cluster="local", settings=FAST)
    assert cloud(ctx) == ([], [])


def test_the_cluster_is_inferred_from_the_type(ctx: Context) -> None:
    # v4: local and big (protected, never inferred) are v4 in local-sim-a: local.
    assert resolve_cluster(ctx, "v4-8").name == "local"
    # v5e: sim-b (local-sim-b) and sim-a2 (local-sim-a) both offer v5litepod-4: pick one.
    with pytest.raises(BadInput, match="2 clusters could take v5litepod-4: sim-b, sim-a2"):
        resolve_cluster(ctx, "v5litepod-4")
    assert candidates(ctx, "v5litepod-4") == ["sim-b", "sim-a2"]
    # The registry's reservation names the cluster.
    object.__setattr__(ctx.registry.clusters["sim-b"], "reservations", ["v5litepod-4"])
    assert resolve_cluster(ctx, "v5litepod-4").name == "sim-b"
    result = add_worker(ctx, "v4-8", "reserved", by="alice", settings=FAST)
    assert result.cluster == "local" and result.ok


def test_refused_while_a_restart_holds_the_lock(ctx: Context) -> None:
    lease = acquire(ctx.store, "local", "local-restart-1", "restart", "carol", 30)
    try:
        with pytest.raises(Refused, match="restart local-restart-1 by carol"):
            add_worker(ctx, "v4-8", "reserved", by="alice", cluster="local", settings=FAST)
    finally:
        lease.release()
    assert cloud(ctx) == ([], [])


def test_workers_flags_a_preempted_worker_and_one_added_outside(ctx: Context, sim: SimServer) -> None:
    kept = add_worker(ctx, "v4-8", "reserved", by="alice", cluster="local", key="a", settings=FAST)
    lost = add_worker(ctx, "v4-8", "spot", by="bob", cluster="local", key="b", hours=1, settings=FAST)
    sim.state.preempt(lost.workers[0].qr_id)
    ctx.store.delete(f"workers/local/{kept.workers[0].qr_id}.json")  # as if added by hand
    view = workers_view(ctx, "local", now=datetime.now(UTC) + timedelta(hours=2))
    rows = {w.qr_id: w for w in view.workers}
    preempted = rows[lost.workers[0].qr_id]
    assert preempted.node_state == "PREEMPTED" and preempted.added_by == "bob"
    assert any(f.startswith("preempted: clean-preempted deletes it") for f in preempted.flags)
    assert any("past its --for time" in f for f in preempted.flags)
    outside = rows[kept.workers[0].qr_id]
    assert outside.added_by is None and any("not in the ledger" in f for f in outside.flags)
    assert view.ray_error is not None and preempted.in_ray is None  # nothing answers on port 9
    assert "PREEMPTED" in view.summary()
    due = due_workers(ctx, "local", now=datetime.now(UTC) + timedelta(hours=2))
    assert [(d.qr_id, d.added_by) for d in due] == [(lost.workers[0].qr_id, "bob")]


def test_after_a_restart_ready_workers_rejoin_and_gone_ones_are_recreated(
    ctx: Context, sim: SimServer
) -> None:
    stays = add_worker(ctx, "v4-8", "reserved", by="alice", cluster="local", key="a", settings=FAST)
    goes = add_worker(ctx, "v6e-8", "reserved", by="bob", cluster="local", key="b", settings=FAST)
    sim.state.preempt(goes.workers[0].qr_id)
    lines = readd_workers(ctx, ctx.cluster("local"), settings=FAST)
    assert sorted(lines) == sorted([
        f"{stays.workers[0].qr_id} (v4-8, alice): rejoins the new head",
        f"{goes.workers[0].qr_id} (v6e-8, bob): recreated",
    ])  # fmt: skip
    api = ctx.tpu(ctx.cluster("local"))
    assert {n.node_id: n.state for n in api.list_nodes(ZONE)} == {
        stays.workers[0].qr_id: "READY",
        goes.workers[0].qr_id: "READY",
    }
    assert readd_workers(ctx, ctx.cluster("sim-b")) == []


def test_the_startup_script_is_the_clusters_and_valid_bash(ctx: Context, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    local = ctx.cluster("local")
    cluster = type(local).model_validate({**local.model_dump(), "token": {"file": str(token)}})
    script = startup_script(ctx.registry, cluster)
    assert "{{" not in script and 'RAY_CLUSTER_NAME="cb-local"' in script
    assert "local-sim-docker.pkg.dev/proj/marin/marin_cluster:latest" in script
    assert "s3cret-token" in script and "set +x" in script and "ray start --address" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=10)


def _cli(ctx: Context, *argv: str) -> tuple[int, str, str]:
    """The CLI's commands as `ops/cli.py` runs them (its parser with our commands, its Out, its errors)."""
    from ops import cli
    from ops.cli_workers import add_commands

    parser = argparse.ArgumentParser(prog="ops")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true")
    common.add_argument("--as", dest="caller", default="alice")

    def add(name, fn, help):  # noqa: ANN001, ANN202, A002 - ops/cli.py's own `add`
        p = sub.add_parser(name, parents=[common], help=help)
        p.set_defaults(fn=fn)
        return p

    add_commands(add)
    args = parser.parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = args.fn(ctx, args, cli.Out(args.json))
        except cli.OpsError as e:
            code = cli._fail(e, args.json)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_adds_lists_and_reports_in_json_with_its_exit_codes(ctx: Context, sim: SimServer) -> None:
    code, out, err = _cli(ctx, "add-worker", "v4-8", "--capacity", "preemptible", "--cluster", "local",
                          "--reason", "ablation", "--for", "3", "--json", "--timeout", "10")  # fmt: skip
    assert code == 0, err
    added = json.loads(out)
    assert added["capacity"] == "spot" and added["workers"][0]["state"] == "ready"
    assert "WAITING_FOR_RESOURCES" in err  # progress on stderr
    code, out, _ = _cli(ctx, "workers", "--cluster", "local", "--json")
    assert code == 0 and json.loads(out)["workers"][0]["reason"] == "ablation"
    code, out, _ = _cli(ctx, "add-worker", "v6e-8", "--capacity", "spot", "--cluster", "sim-b", "--json")
    assert code == 2 and "valid types there" in json.loads(out)["hint"]
    sim.fault(FaultKind.STOCK_OUT, zone=ZONE)
    code, out, _ = _cli(
        ctx, "add-worker", "v6e-8", "--capacity", "spot", "--cluster", "local", "--timeout", "10"
    )
    assert code == 1 and "(stock-out)" in out and "Nothing is left in the cloud." in out
    lease = acquire(ctx.store, "local", "local-restart-2", "restart", "carol", 30)
    try:
        code, _, err = _cli(ctx, "add-worker", "v4-8", "--capacity", "reserved", "--cluster", "local")
        assert code == 3 and "restart local-restart-2" in err
    finally:
        lease.release()


def test_after_a_token_rotation_every_ledger_worker_is_made_again_with_the_new_token(
    ctx: Context, sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VM's startup script holds the token it was made with: after a rotation the new head refuses
    it, so the restart's re-add makes every ledger worker again (a READY one too)."""
    monkeypatch.setenv("CB_TEST_TOKEN", "old-token")
    local = ctx.cluster("local").model_copy(update={"token": TokenSource(env="CB_TEST_TOKEN")})
    ctx.registry.clusters["local"] = local
    added = add_worker(ctx, "v4-8", "reserved", by="alice", cluster="local", key="a", settings=FAST)
    qr_id = added.workers[0].qr_id
    node = f"projects/proj/locations/{ZONE}/nodes/{qr_id}"
    assert "old-token" in sim.state.get_node(node).metadata["startup-script"]

    monkeypatch.setenv("CB_TEST_TOKEN", "new-token")
    assert readd_workers(ctx, local, settings=FAST) == [f"{qr_id} (v4-8, alice): rejoins the new head"]
    assert readd_workers(ctx, local, settings=FAST, new_token=True) == [f"{qr_id} (v4-8, alice): recreated"]
    script = sim.state.get_node(node).metadata["startup-script"]
    assert "new-token" in script and "old-token" not in script
    assert sim.state.get_node(node).state.name == "READY"
