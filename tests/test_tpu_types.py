"""TPU type facts: chips, hosts and chips per host as Ray detects them on each host of a slice."""

from __future__ import annotations

import pytest
from ray._private.accelerators.tpu import get_num_tpu_visible_chips_per_host

from ops.tpu_types import parse_tpu_type

CASES = [
    # name, chips, hosts, chips per host
    ("v4-8", 4, 1, 4),
    ("v4-16", 8, 2, 4),
    ("v5litepod-4", 4, 1, 4),
    ("v5litepod-8", 8, 1, 8),
    ("v5litepod-16", 16, 4, 4),
    ("v6e-4", 4, 1, 4),
    ("v6e-8", 8, 1, 8),
    ("v6e-16", 16, 4, 4),
    ("v6e-256", 256, 64, 4),
    ("v5p-8", 4, 1, 4),
]


@pytest.mark.parametrize(("name", "chips", "hosts", "per_host"), CASES)
def test_a_slice_has_the_hosts_and_chips_ray_sees(name: str, chips: int, hosts: int, per_host: int) -> None:
    tpu = parse_tpu_type(name)
    assert (tpu.name, tpu.chips, tpu.hosts, tpu.chips_per_host) == (name, chips, hosts, per_host)
    assert tpu.chips_per_host == get_num_tpu_visible_chips_per_host(name)  # Ray's own rule agrees
    assert tpu.hosts * tpu.chips_per_host == tpu.chips


def test_v5e_is_read_as_v5litepod() -> None:
    assert parse_tpu_type("v5e-16").name == "v5litepod-16"


@pytest.mark.parametrize("text", ["v4-4", "v6e-12", "v3-8", "tpu"])
def test_a_type_that_does_not_exist_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_tpu_type(text)
