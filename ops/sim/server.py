"""`SimServer`: the simulator's gRPC server on 127.0.0.1 — Cloud TPU (both API versions), Secret Manager,
Cloud Build and Artifact Registry on one port, with the one LRO service they share — and, optionally,
its control endpoint; a context manager for tests, and what `python -m ops.sim` runs.

    with SimServer(latency=Latency(queue_s=0.05, provision_s=0.05)) as sim:
        clients = ops.gcp.tpu.tpu_clients(sim.address)
        sim.state.add_fault(Fault(kind=FaultKind.STOCK_OUT, zone="local-sim-a"))

One fault list serves every service (`sim.fault("unavailable", method="AccessSecretVersion")`). Cloud
Build reads sources and writes logs through `objects` (a directory of buckets by default: `buckets_dir`,
else `<state dir>/buckets`, else a temporary directory removed at stop), and pushes into the Artifact
Registry state. `secrets` seeds Secret Manager: {project: {secret id: value}} (a value equal to the
latest enabled version adds nothing).
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from ops.gcp.objects import DirObjects, Objects
from ops.sim import versions
from ops.sim.artifacts import ArtifactState, artifacts_handler
from ops.sim.build import BuildState, build_handler
from ops.sim.control import ControlServer
from ops.sim.faults import Fault, FaultKind
from ops.sim.lro import operations_handler
from ops.sim.secrets import SecretState, secrets_handler
from ops.sim.state import Hooks, Latency, TpuState
from ops.sim.tpu import check_for_operations, tpu_handler


class SimServer:
    def __init__(
        self,
        port: int = 0,
        latency: Latency | None = None,
        hooks: list[Hooks] | None = None,
        zones: dict[str, tuple[str, ...]] | None = None,
        state_path: Path | None = None,
        control_port: int | None = None,
        objects: Objects | None = None,
        buckets_dir: Path | None = None,
        secrets: dict[str, dict[str, bytes | str]] | None = None,
    ) -> None:
        """`port` 0 picks a free one; `control_port` None: no HTTP control endpoint (0: a free port).
        With `state_path` (the TPU state's file) the other services keep theirs beside it."""
        self.state = TpuState(zones=zones, latency=latency, hooks=hooks, path=state_path)
        self._tmp: Path | None = None
        if objects is None:
            if buckets_dir is None:
                if state_path is not None:
                    buckets_dir = state_path.parent / "buckets"
                else:
                    buckets_dir = self._tmp = Path(tempfile.mkdtemp(prefix="sim-buckets-"))
            objects = DirObjects(buckets_dir)
        self.objects = objects
        self.buckets_dir = buckets_dir

        def beside(name: str) -> Path | None:
            return None if state_path is None else state_path.with_name(name)

        self.secrets = SecretState(path=beside("secrets.json"))
        for project, values in (secrets or {}).items():
            self.secrets.seed(project, values)
        self.artifacts = ArtifactState(self.state.ops, path=beside("artifacts.json"))
        self.builds = BuildState(
            self.state.ops,
            self.artifacts,
            objects,
            self.state.clock,
            self.state.faults,
            lambda: self.state.latency,
            path=beside("builds.json"),
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tpu-sim"))
        self._server.add_generic_rpc_handlers(
            (
                tpu_handler(self.state, versions.V2),
                tpu_handler(self.state, versions.V2ALPHA1),
                secrets_handler(self.secrets, self.state.faults),
                build_handler(self.builds, self.state.faults),
                artifacts_handler(self.artifacts, self.state.faults),
                operations_handler(self.state.ops, check_for_operations(self.state)),
            )
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        if self.port == 0:
            raise OSError(f"tpu-sim: cannot listen on 127.0.0.1:{port}")
        self._control_port = control_port
        self.control: ControlServer | None = None

    @property
    def address(self) -> str:
        """host:port for `grpc.insecure_channel` (and `tpu_clients(endpoint)`): every service is here."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> SimServer:
        self._server.start()
        if self._control_port is not None:
            self.control = ControlServer(self, self._control_port)
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        if self.control is not None:
            self.control.close()
        self._server.stop(grace_s).wait(grace_s + 1)
        self.state.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def fault(self, kind: FaultKind | str, **fields: object) -> None:
        """Arm a fault (see ops.sim.faults.Fault), e.g. `sim.fault("unavailable", times=2)`."""
        self.state.add_fault(Fault(kind=FaultKind(kind), **fields))

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
