"""Which accelerator types each simulated zone offers, and their topologies (GCP_API_FACTS.md 1.10)."""

from __future__ import annotations

from ops.tpu_types import parse_tpu_type

LOCAL_REGION = "local-sim"
LOCAL_ZONE = "local-sim-a"

# local-sim-a is the local cluster's zone (v4, v5e, v6e); local-sim-b offers v5e only, so tests can
# ask "which zone offers this type".
DEFAULT_ZONES: dict[str, tuple[str, ...]] = {
    LOCAL_ZONE: (
        "v4-8",
        "v4-16",
        "v4-32",
        "v5litepod-1",
        "v5litepod-4",
        "v5litepod-8",
        "v5litepod-16",
        "v6e-1",
        "v6e-4",
        "v6e-8",
        "v6e-16",
    ),
    "local-sim-b": ("v5litepod-1", "v5litepod-4", "v5litepod-8"),
}

# AcceleratorConfig.Type names per generation (tpu types enum).
CONFIG_TYPE = {"v4": "V4", "v5e": "V5LITE_POD", "v6e": "V6E", "v5p": "V5P"}
_PREFIX = {"V4": "v4", "V5LITE_POD": "v5litepod", "V6E": "v6e", "V5P": "v5p"}
# Ray's topology table (ray tpu VALID_TPU_TOPOLOGY) for the shapes the simulator offers.
_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8"}
_TOPOLOGY_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4"}


def region_of(zone: str) -> str:
    """`local-sim-a` -> `local-sim`, `us-central2-b` -> `us-central2`."""
    return zone.rsplit("-", 1)[0]


def topology(accelerator_type: str) -> str:
    """The chip topology of a type, e.g. v4-8 -> 2x2x1, v6e-8 -> 2x4."""
    t = parse_tpu_type(accelerator_type)
    table = _TOPOLOGY_3D if t.generation in ("v4", "v5p") else _TOPOLOGY_2D
    return table.get(t.chips, f"{t.chips}")


def type_from_config(config_type: str, topo: str) -> str:
    """An AcceleratorConfig (type enum name, topology) as an accelerator type name, e.g. V4 2x2x1 -> v4-8."""
    chips = 1
    for part in topo.split("x"):
        chips *= int(part)
    prefix = _PREFIX[config_type]
    size = chips * 2 if prefix in ("v4", "v5p") else chips
    return f"{prefix}-{size}"
