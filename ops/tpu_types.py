"""TPU generations and accelerator type names: pure facts and parsing (GCP_API_FACTS.md 1.10)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Accelerator type prefix as the TPU API spells it, per generation name people use.
_PREFIX = {"v4": "v4", "v5e": "v5litepod", "v6e": "v6e", "v5p": "v5p"}
# v4 and v5p name TensorCores in their type (2 per chip); v5e and v6e name chips.
_CORES_PER_CHIP = {"v4": 2, "v5e": 1, "v6e": 1, "v5p": 2}
# Chips per host as Ray detects them (ray/_private/accelerators/tpu.py, Ray 2.60,
# get_num_tpu_visible_chips_per_host): 4, except v5e/v6e slices of at most 8 chips, which are one host
# holding all of them. So a v6e-8 is one host of 8 chips and a v6e-16 four hosts of 4.
_DEFAULT_CHIPS_PER_HOST = 4
_SINGLE_HOST_UP_TO = {"v5e": 8, "v6e": 8}
RUNTIME_VERSION = {
    "v4": "tpu-ubuntu2204-base",
    "v5e": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
    "v5p": "v2-alpha-tpuv5",
}
GENERATIONS = tuple(_PREFIX)
_TYPE_RE = re.compile(r"^(v4|v5litepod|v5e|v6e|v5p)-(\d+)$")


@dataclass(frozen=True)
class TpuType:
    """One accelerator type, e.g. v4-8 (4 chips, one host) or v6e-16 (16 chips, four hosts of 4)."""

    generation: str
    size: int  # the number in the name: TensorCores for v4/v5p, chips for v5e/v6e

    @property
    def name(self) -> str:
        return f"{_PREFIX[self.generation]}-{self.size}"

    @property
    def chips(self) -> int:
        return self.size // _CORES_PER_CHIP[self.generation]

    @property
    def hosts(self) -> int:
        return max(1, -(-self.chips // self.chips_per_host))

    @property
    def chips_per_host(self) -> int:
        """What the raylet on each host detects as its TPU resource (Ray's rule, above)."""
        if self.chips <= _SINGLE_HOST_UP_TO.get(self.generation, 0):
            return self.chips
        return min(self.chips, _DEFAULT_CHIPS_PER_HOST)

    @property
    def head_resource(self) -> str:
        """The resource Ray puts on worker 0 of a slice: jobs ask for it to get a whole slice."""
        return f"TPU-{self.name}-head"

    @property
    def runtime_version(self) -> str:
        return RUNTIME_VERSION[self.generation]


def parse_tpu_type(text: str) -> TpuType:
    """Parse `v4-8`, `v5litepod-4` (or `v5e-4`), `v6e-8`; ValueError says what is valid."""
    m = _TYPE_RE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a TPU type; expected e.g. v4-8, v5litepod-4, v6e-8")
    prefix, size = m.group(1), int(m.group(2))
    generation = "v5e" if prefix in ("v5litepod", "v5e") else prefix
    if size < 1 or (size & (size - 1)) != 0:
        raise ValueError(f"{text!r}: the size must be a power of two")
    if _CORES_PER_CHIP[generation] == 2 and size < 8:
        raise ValueError(f"{text!r}: the smallest {generation} type is {_PREFIX[generation]}-8")
    return TpuType(generation, size)
