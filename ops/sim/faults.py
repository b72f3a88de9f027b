"""Faults the simulator injects on demand, with the codes and messages GCP_API_FACTS.md 1.8 records.

A fault matches by zone, accelerator type and (for `unavailable`, `permission_denied`) RPC method;
`times` is how many calls it hits (None: until cleared). `unavailable` and `permission_denied` with no
method hit any RPC of any service the simulator serves (TPU, Secret Manager, Cloud Build, Artifact
Registry); `build_failure` fails the next build at its first step with `message` as the log's tail.
"""

from __future__ import annotations

import secrets
import threading
from enum import StrEnum

from pydantic import BaseModel

from ops.sim.catalog import region_of
from ops.tpu_types import parse_tpu_type


class FaultKind(StrEnum):
    QUOTA = "quota"  # the create RPC fails: RESOURCE_EXHAUSTED "Quota limit ... has been exceeded"
    STOCK_OUT = "stock_out"  # capacity: the node's LRO / the QR (FAILED) carry RESOURCE_EXHAUSTED
    RESERVATION = "reservation"  # reserved capacity missing: like a stock-out, for reserved requests only
    UNAVAILABLE = "unavailable"  # the RPC answers UNAVAILABLE (HTTP 503); later calls succeed
    PREEMPT = "preempt"  # the created node is PREEMPTED `after_s` seconds after it is READY
    STAY_WAITING = "stay_waiting"  # the queued resource stays WAITING_FOR_RESOURCES
    PERMISSION_DENIED = "permission_denied"  # the RPC answers PERMISSION_DENIED naming the permission
    BUILD_FAILURE = (
        "build_failure"  # the build's first step fails (FAILURE, USER_BUILD_STEP) logging `message`
    )


class Fault(BaseModel):
    kind: FaultKind
    zone: str | None = None
    accelerator_type: str | None = None
    method: str | None = None  # UNAVAILABLE only: e.g. "CreateQueuedResource"; None: any RPC
    times: int | None = 1
    after_s: float = 0.0  # PREEMPT only
    message: str = ""  # BUILD_FAILURE only: the failing step's last log lines


class Faults:
    """The armed faults; `take` consumes one matching fault."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault.model_copy())

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def armed(self) -> list[Fault]:
        with self._lock:
            return [f.model_copy() for f in self._faults]

    def take(
        self, kind: FaultKind, zone: str = "", accelerator_type: str = "", method: str = ""
    ) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind != kind:
                    continue
                if fault.zone and fault.zone != zone:
                    continue
                if fault.accelerator_type and fault.accelerator_type != accelerator_type:
                    continue
                if fault.method and fault.method != method:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                return fault
        return None


def _eid() -> str:
    return f"[EID: 0x{secrets.token_hex(8)}]"


def quota_message(zone: str, accelerator_type: str, preemptible: bool) -> str:
    """Marin PR #1612's text. The on-demand metric names are made by analogy (not seen)."""
    gen = parse_tpu_type(accelerator_type).generation
    base = {
        "v4": "TPUV4sPodPerProjectPerRegionForTPUAPI",
        "v5e": "TPUV5sLitepodPerProjectPerRegionForTPUAPI",
        "v6e": "TPUV6EPerProjectPerRegionForTPUAPI",
        "v5p": "TPUV5pPerProjectPerRegionForTPUAPI",
    }[gen]
    if preemptible:
        base = {
            "v4": "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI",
            "v5e": "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI",
            "v6e": "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
        }.get(gen, base)
    return f"Quota limit '{base}' has been exceeded. Limit: 0 in region {region_of(zone)}."


def stock_out_message(zone: str) -> str:
    return (
        f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU '
        f"Nodes are offered (see https://cloud.google.com/tpu/docs/regions) {_eid()}"
    )


def reservation_message() -> str:
    return f"Insufficient reserved capacity. Contact customer support to increase your reservation. {_eid()}"


UNAVAILABLE_MESSAGE = "The service is currently unavailable."
