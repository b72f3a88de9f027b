"""`SimServer`: the TPU simulator's gRPC server on 127.0.0.1 (both API versions, the LRO service) and,
optionally, its control endpoint; a context manager for tests, and what `python -m ops.sim` runs.

    with SimServer(latency=Latency(queue_s=0.05, provision_s=0.05)) as sim:
        clients = ops.gcp.tpu.tpu_clients(sim.address)
        sim.state.add_fault(Fault(kind=FaultKind.STOCK_OUT, zone="local-sim-a"))
"""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from ops.sim import versions
from ops.sim.control import ControlServer
from ops.sim.faults import Fault, FaultKind
from ops.sim.lro import operations_handler
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
    ) -> None:
        """`port` 0 picks a free one; `control_port` None: no HTTP control endpoint (0: a free port)."""
        self.state = TpuState(zones=zones, latency=latency, hooks=hooks, path=state_path)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tpu-sim"))
        self._server.add_generic_rpc_handlers(
            (
                tpu_handler(self.state, versions.V2),
                tpu_handler(self.state, versions.V2ALPHA1),
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
        """host:port for `grpc.insecure_channel` (and `tpu_clients(endpoint)`)."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> SimServer:
        self._server.start()
        if self._control_port is not None:
            self.control = ControlServer(self.state, self._control_port)
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        if self.control is not None:
            self.control.close()
        self._server.stop(grace_s).wait(grace_s + 1)
        self.state.close()

    def fault(self, kind: FaultKind | str, **fields: object) -> None:
        """Arm a fault (see ops.sim.faults.Fault), e.g. `sim.fault("unavailable", times=2)`."""
        self.state.add_fault(Fault(kind=FaultKind(kind), **fields))

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
