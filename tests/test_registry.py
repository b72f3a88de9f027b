"""The cluster registry (infra/clusters.yaml): the real one, and malformed ones failing clearly.

A malformed registry must give exactly one BadInput that names the file, the cluster and the field, so an
operator can fix it from the message alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ops.errors import BadInput, ExitCode
from ops.registry import DEFAULT_REGISTRY, Cluster, load_registry

GCP_CLUSTERS = {"us-central2", "us-west4", "eu-west4", "us-east5", "us-east1", "us-central1", "big-run"}

# Where each generation's TPUs exist (GCP_API_FACTS.md 1.10; europe-west4-b for v5e from Marin's configs).
TPU_ZONES = {
    "v4": {"us-central2-b"},
    "v5e": {"us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"},
    "v6e": {"us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"},
    "v5p": {"us-central1-a", "us-east5-a"},
}


# --- the real registry -------------------------------------------------------------------------------


def test_the_real_registry_has_seven_gcp_clusters_and_local():
    registry = load_registry(DEFAULT_REGISTRY)
    assert set(registry.clusters) == GCP_CLUSTERS | {"local"}
    assert {n for n, c in registry.clusters.items() if c.driver == "gcp"} == GCP_CLUSTERS
    assert registry.get("local").driver == "local"
    assert registry.get("local").gcs_address == "127.0.0.1:6379"


def test_only_big_run_is_protected():
    registry = load_registry(DEFAULT_REGISTRY)
    assert {n for n, c in registry.clusters.items() if c.protected} == {"big-run"}


@pytest.mark.parametrize("name", sorted(GCP_CLUSTERS))
def test_each_gcp_cluster_sits_in_a_zone_of_its_tpu_generation(name):
    cluster = load_registry(DEFAULT_REGISTRY).get(name)
    assert cluster.zone in TPU_ZONES[cluster.tpu_generation]
    assert cluster.zone.startswith(f"{cluster.region}-")
    assert cluster.worker_tpu.generation == cluster.tpu_generation


def test_ray_cluster_names_and_dashboard_ports_are_distinct():
    clusters = load_registry(DEFAULT_REGISTRY).clusters.values()
    assert len({c.ray_cluster_name for c in clusters}) == len(clusters)
    assert len({c.dashboard_url for c in clusters}) == len(clusters)


def test_an_unknown_cluster_lists_the_valid_names():
    registry = load_registry(DEFAULT_REGISTRY)
    with pytest.raises(BadInput) as e:
        registry.get("us-west9")
    assert e.value.reason == "unknown cluster 'us-west9'"
    for name in GCP_CLUSTERS | {"local"}:
        assert name in e.value.hint
    assert e.value.code == ExitCode.BAD_INPUT


def test_worker_types_shorthand_spelling_and_defaults():
    registry = load_registry(DEFAULT_REGISTRY)
    east5 = registry.get("us-east5")
    # A bare name is a type with no warm pool, capped at the cluster's max_workers.
    assert [(t.tpu_type, t.min_workers, t.max_workers) for t in east5.worker_types[:2]] == [
        ("v6e-4", 0, 1024),
        ("v6e-8", 0, 1024),
    ]
    assert list(east5.node_types())[:3] == ["tpu_worker", "tpu_slice_v6e_8", "tpu_slice_v6e_16"]
    assert east5.min_workers == 8 and east5.min_workers_by_type()["v6e-128"] == 8
    # v5e-8 is how people say v5litepod-8: the registry keeps the API's spelling.
    west4 = registry.get("us-west4")
    assert west4.worker_types[1].tpu_type == "v5litepod-8"


def test_the_local_cluster_keeps_one_worker_type_from_its_min_workers():
    local = load_registry(DEFAULT_REGISTRY).get("local")
    assert [(t.tpu_type, t.min_workers, t.max_workers) for t in local.worker_types] == [("v4-8", 0, 4)]
    assert local.min_workers == 0 and local.max_workers == 4
    assert list(local.node_types()) == ["tpu_worker"]
    assert local.workload_secrets == [] and local.ssh_key is None


@pytest.mark.parametrize("name", ["us-east5", "local"])
def test_a_cluster_read_back_from_its_dump_is_the_same(name):
    cluster = load_registry(DEFAULT_REGISTRY).get(name)
    assert Cluster.model_validate(cluster.model_dump()) == cluster


def test_each_gcp_cluster_has_its_own_key_pair_in_secret_manager():
    clusters = [c for c in load_registry(DEFAULT_REGISTRY).clusters.values() if c.driver == "gcp"]
    keys = [c.ssh_key for c in clusters]
    assert all(k and k.private_secret and k.public_secret for k in keys)
    for attr in ("file", "private_secret", "public_secret"):
        assert len({getattr(k, attr) for k in keys}) == len(keys), attr


# --- malformed registries ----------------------------------------------------------------------------


def real_registry() -> dict:
    return yaml.safe_load(DEFAULT_REGISTRY.read_text())


def write(tmp_path: Path, data: dict | str) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def unknown_field(d):
    d["clusters"]["us-west4"]["zonee"] = "us-west4-a"


def wrong_type(d):
    d["clusters"]["us-west4"]["min_workers"] = "lots"


def other_generations_worker(d):
    d["clusters"]["us-west4"]["worker_tpu_type"] = "v6e-4"


def not_a_tpu_type(d):
    d["clusters"]["us-west4"]["worker_tpu_type"] = "v9-8"


def a_reservation_that_is_no_tpu_type(d):
    d["clusters"]["us-west4"]["reservations"] = ["v5litepod-4", "v6e-8x"]


def min_above_max(d):
    d["clusters"]["us-west4"].update(
        worker_types=[{"tpu_type": "v5litepod-4", "min_workers": 8}], max_workers=4
    )


def min_above_max_without_worker_types(d):
    del d["clusters"]["us-west4"]["worker_types"]
    d["clusters"]["us-west4"].update(min_workers=8, max_workers=4)


def a_types_max_above_the_clusters(d):
    d["clusters"]["us-west4"]["worker_types"][1] = {"tpu_type": "v5litepod-8", "max_workers": 2048}


def a_slice_of_another_generation(d):
    d["clusters"]["us-west4"]["worker_types"].append("v6e-8")


def a_slice_given_twice(d):
    d["clusters"]["us-west4"]["worker_types"].append("v5e-8")  # v5litepod-8, spelt otherwise


def worker_types_without_the_default_worker(d):
    d["clusters"]["us-west4"]["worker_types"] = ["v5litepod-8", "v5litepod-16"]


def min_workers_for_the_cluster_and_per_type(d):
    d["clusters"]["us-west4"]["min_workers"] = 5  # its worker types keep 4 warm


def no_min_workers_at_all(d):
    del d["clusters"]["us-west4"]["worker_types"]


def a_workload_secret_that_is_no_env_name(d):
    d["clusters"]["us-west4"]["workload_secrets"] = ["HF_TOKEN", "openai-key"]


def a_key_secret_that_is_no_secret_id(d):
    d["clusters"]["us-west4"]["ssh_key"]["public_secret"] = "ray key"


def missing_field(d):
    del d["clusters"]["us-west4"]["zone"]


def zone_of_another_region(d):
    d["clusters"]["us-west4"]["zone"] = "us-west1-c"


def unknown_generation(d):
    d["clusters"]["us-west4"]["tpu_generation"] = "v7"


def shared_ray_cluster_name(d):
    d["clusters"]["us-west4"]["ray_cluster_name"] = "marin-us-central2"


@pytest.mark.parametrize(
    "mutate, field, says",
    [
        (unknown_field, "zonee", "Extra inputs are not permitted"),
        (wrong_type, "min_workers", "valid integer"),
        (
            other_generations_worker,
            "worker_tpu_type",
            "v6e-4 is v6e, but tpu_generation is v5e",
        ),
        (not_a_tpu_type, "worker_tpu_type", "'v9-8' is not a TPU type"),
        (a_reservation_that_is_no_tpu_type, "reservations", "'v6e-8x' is not a TPU type"),
        (min_above_max, "max_workers", "min_workers 8 exceeds max_workers 4"),
        (min_above_max_without_worker_types, "max_workers", "min_workers 8 exceeds max_workers 4"),
        (a_types_max_above_the_clusters, "max_workers", "v5litepod-8's max_workers 2048 exceeds it (1024)"),
        (a_slice_of_another_generation, "worker_types", "v6e-8 is v6e, but tpu_generation is v5e"),
        (a_slice_given_twice, "worker_types", "a TPU type is given twice"),
        (worker_types_without_the_default_worker, "worker_types", "worker_tpu_type v5litepod-4 must be one"),
        (min_workers_for_the_cluster_and_per_type, "min_workers", "5 is not the worker types' 4"),
        (no_min_workers_at_all, "min_workers", "Field required"),
        (a_workload_secret_that_is_no_env_name, "workload_secrets", "'openai-key' is not a secret id"),
        (a_key_secret_that_is_no_secret_id, "ssh_key.public_secret", "'ray key' is not a Secret Manager"),
        (missing_field, "zone", "Field required"),
        (zone_of_another_region, "zone", "zone us-west1-c is not in region us-west4"),
        (unknown_generation, "tpu_generation", "'v4', 'v5e', 'v6e' or 'v5p'"),
        (shared_ray_cluster_name, "ray_cluster_name", "is already cluster 'us-central2'"),
    ],
)
def test_a_malformed_cluster_is_one_bad_input_naming_file_cluster_and_field(tmp_path, mutate, field, says):
    data = real_registry()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(BadInput) as e:
        load_registry(path)
    reason = e.value.reason
    assert reason.startswith(f"{path}: cluster 'us-west4', field '{field}'"), reason
    assert says in reason
    assert "more)" not in reason  # one problem, one message


def test_several_problems_are_still_one_bad_input(tmp_path):
    data = real_registry()
    unknown_field(data)
    wrong_type(data)
    with pytest.raises(BadInput, match=r"cluster 'us-west4', field .*\(and 1 more\)"):
        load_registry(write(tmp_path, data))


def test_a_bad_default_names_the_first_cluster_it_breaks(tmp_path):
    data = real_registry()
    data["defaults"]["max_workers"] = -1
    with pytest.raises(BadInput, match=r"cluster 'us-central2', field 'max_workers'"):
        load_registry(write(tmp_path, data))


def test_bad_yaml_names_the_file_and_line(tmp_path):
    text = DEFAULT_REGISTRY.read_text().replace("    zone: us-west4-a", "    zone: [us-west4-a", 1)
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        load_registry(path)
    assert e.value.reason.startswith(f"{path}: not valid YAML")
    assert "line" in e.value.reason


def test_a_cluster_given_twice_is_refused_not_silently_replaced(tmp_path):
    text = DEFAULT_REGISTRY.read_text()
    start = text.index("  us-west4:\n")
    block = text[start : text.index("  eu-west4:\n")]
    path = write(tmp_path, text + block.replace("us-west4-a", "us-west4-b"))
    with pytest.raises(BadInput, match=r"(?s)not valid YAML.*duplicate key 'us-west4'"):
        load_registry(path)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "expected a mapping with a 'clusters' mapping"),
        ("clusters: [us-west4]\n", "expected a mapping with a 'clusters' mapping"),
        ("image_repository: r\nimage_name: i\nclusters:\n  us-west4: v5e\n", "cluster 'us-west4'"),
        ("defaults: [1]\nclusters: {}\n", "'defaults' must be a mapping"),
    ],
)
def test_a_malformed_shape_is_bad_input(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        load_registry(path)
    assert e.value.reason.startswith(f"{path}:") and says in e.value.reason


def test_a_missing_registry_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="cannot read the cluster registry"):
        load_registry(tmp_path / "nope.yaml")


def test_the_registry_path_can_come_from_the_environment(tmp_path, monkeypatch):
    data = real_registry()
    del data["clusters"]["big-run"]
    monkeypatch.setenv("CLUSTERBOT_REGISTRY", str(write(tmp_path, data)))
    assert "big-run" not in load_registry().clusters
