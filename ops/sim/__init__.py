"""A simulated Cloud TPU service: the v2 and v2alpha1 gRPC APIs over one state, with long-running
operations, provisioning over time, hooks when a TPU VM becomes READY or goes away, and faults on demand.

Run in-process (`SimServer`) or as a process of its own (`python -m ops.sim --state-dir DIR`). The real
google-cloud-tpu clients talk to it; no operation imports this package (ops talks to an endpoint).
"""

from ops.sim.catalog import DEFAULT_ZONES, LOCAL_REGION, LOCAL_ZONE
from ops.sim.faults import Fault, FaultKind
from ops.sim.server import SimServer
from ops.sim.state import Hooks, Latency, SimNode, TpuState

__all__ = [
    "DEFAULT_ZONES",
    "LOCAL_REGION",
    "LOCAL_ZONE",
    "Fault",
    "FaultKind",
    "Hooks",
    "Latency",
    "SimNode",
    "SimServer",
    "TpuState",
]
