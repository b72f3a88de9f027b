"""The cluster template and the generated per-cluster configs (`python -m ops update-configs [--check]`).

Real template, real registry, real Ray validation; the drift stories run on a copy of infra/ in tmp_path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml

from ops.configs import (
    GENERATED_MARKER,
    INFRA_DIR,
    TEMPLATE_NAME,
    TOKEN_PATH,
    render_all,
    update_configs,
    validate_ray_config,
)
from ops.errors import BadInput, OpsError
from ops.registry import Registry, load_registry

GCP_CLUSTERS = ["us-central2", "us-west4", "eu-west4", "us-east5", "us-east1", "us-central1", "big-run"]
RAY_SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


@pytest.fixture
def registry() -> Registry:
    return load_registry()


@pytest.fixture(scope="module")
def configs() -> dict[str, dict]:
    """Every generated config as Ray would read it, keyed by cluster name."""
    return {p.stem: yaml.safe_load(text) for p, text in render_all(load_registry()).items()}


@pytest.fixture
def infra(tmp_path: Path) -> Path:
    """A copy of the repository's infra/ (template, registry, committed configs)."""
    copy = tmp_path / "infra"
    shutil.copytree(INFRA_DIR, copy)
    return copy


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


# --- rendering ---------------------------------------------------------------------------------------


def test_one_config_per_gcp_cluster_and_none_for_local(registry):
    rendered = render_all(registry)
    assert [p.name for p in rendered] == [f"{name}.yaml" for name in GCP_CLUSTERS]
    assert all(p.parent == INFRA_DIR for p in rendered)


def test_render_is_deterministic(registry):
    first = render_all(registry)
    assert render_all(load_registry()) == first
    assert render_all(registry) == first


def test_every_config_says_it_is_generated(registry):
    for text in render_all(registry).values():
        first_lines = text.splitlines()[:3]
        assert first_lines[0] == GENERATED_MARKER
        assert "infra/cluster-template.yaml" in first_lines[0]
        assert "python -m ops update-configs" in first_lines[0]
        assert "Do not edit" in first_lines[1]


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_config_passes_rays_validation(configs, name):
    config = configs[name]
    # The file as written, against Ray's schema alone (no defaults filled in) ...
    jsonschema.validate(config, RAY_SCHEMA)
    # ... and as `ray up` checks it: merged with Ray's GCP defaults, then `validate_config`.
    prepared = validate_ray_config(config)
    # Every command list is ours: none of the defaults (which pip-install a Ray wheel) leaked in.
    for key in ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands"):
        assert key in config, key
        assert not any("pip install" in cmd for cmd in prepared[key]), key
    assert prepared["head_setup_commands"] == config["setup_commands"] + config["head_setup_commands"]


@pytest.mark.parametrize(
    "name, accelerator, runtime, chips",
    [
        ("us-central2", "v4-8", "tpu-ubuntu2204-base", 4),  # v4-8: 8 TensorCores = 4 chips, one host
        ("big-run", "v4-8", "tpu-ubuntu2204-base", 4),
        ("us-west4", "v5litepod-4", "v2-alpha-tpuv5-lite", 4),
        ("eu-west4", "v5litepod-4", "v2-alpha-tpuv5-lite", 4),
        ("us-east5", "v6e-4", "v2-alpha-tpuv6e", 4),
        ("us-east1", "v6e-4", "v2-alpha-tpuv6e", 4),
        ("us-central1", "v6e-4", "v2-alpha-tpuv6e", 4),
    ],
)
def test_worker_type_matches_the_clusters_tpu_type(configs, registry, name, accelerator, runtime, chips):
    cluster = registry.get(name)
    worker = configs[name]["available_node_types"]["tpu_worker"]
    assert worker["node_config"] == {
        "acceleratorType": accelerator,
        "runtimeVersion": runtime,
        "schedulingConfig": {"preemptible": True},
    }
    assert worker["resources"]["TPU"] == chips == cluster.worker_tpu.chips_per_host
    # What `ray up` would add itself (GCP_API_FACTS 2.5); jobs ask for it to get a whole slice.
    assert worker["resources"][f"TPU-{accelerator}-head"] == 1
    assert (worker["min_workers"], worker["max_workers"]) == (cluster.min_workers, cluster.max_workers)


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_config_carries_the_clusters_facts(configs, registry, name):
    cluster, config = registry.get(name), configs[name]
    assert config["cluster_name"] == cluster.ray_cluster_name
    assert config["provider"] == {
        "type": "gcp",
        "region": cluster.region,
        "availability_zone": cluster.zone,
        "project_id": cluster.project,
    }
    assert config["max_workers"] == cluster.max_workers
    assert config["docker"]["image"] == f"{registry.image(cluster)}:{cluster.image_tag}"
    assert config["docker"]["image"].startswith(f"{cluster.region}-docker.pkg.dev/{cluster.project}/")
    assert "-e RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    head = config["available_node_types"][config["head_node_type"]]
    assert head["node_config"]["machineType"] == cluster.head_machine_type == "n2-standard-8"
    assert head["resources"]["CPU"] == 0
    assert head["max_workers"] == 0
    token_fetch = " ".join(config["setup_commands"])
    assert f"gcloud secrets versions access latest --secret={cluster.token_secret}" in token_fetch
    assert TOKEN_PATH == "/home/ray/.ray/auth_token" and TOKEN_PATH in token_fetch
    assert any("ray start --head" in cmd for cmd in config["head_start_ray_commands"])
    assert any("ray start --address=$RAY_HEAD_IP:6379" in cmd for cmd in config["worker_start_ray_commands"])


def test_rays_validation_is_not_vacuous(configs):
    """The checks above would catch a template mistake: Ray refuses these."""
    config = configs["us-central2"]
    bad_resources = json.loads(json.dumps(config))
    bad_resources["available_node_types"]["tpu_worker"]["resources"]["TPU"] = 0.5
    unknown_key = json.loads(json.dumps(config))
    unknown_key["available_node_types"]["tpu_worker"]["preemptible"] = True
    too_many = json.loads(json.dumps(config))
    too_many["max_workers"] = 1
    no_head = json.loads(json.dumps(config))
    no_head["head_node_type"] = "head"
    for broken in (bad_resources, unknown_key, too_many, no_head):
        with pytest.raises((jsonschema.ValidationError, ValueError)):
            validate_ray_config(broken)


def test_a_template_mistake_is_an_ops_error_naming_the_template(registry, infra):
    template = infra / TEMPLATE_NAME
    # `spot` at the node-type level (instead of inside node_config.schedulingConfig): Ray's schema refuses it.
    template.write_text(template.read_text().replace("  tpu_worker:\n", "  tpu_worker:\n    spot: true\n"))
    with pytest.raises(OpsError) as e:
        render_all(registry, infra)
    assert "Ray rejects it" in e.value.reason and "'us-central2'" in e.value.reason
    assert TEMPLATE_NAME in e.value.hint

    template.write_text("cluster_name: {{ cluster.no_such_field }}\n")
    with pytest.raises(OpsError, match="no_such_field"):
        render_all(registry, infra)


def test_gcp_cluster_without_token_secret_is_bad_input(registry):
    registry.get("us-east1").token_secret = None
    with pytest.raises(BadInput, match=r"cluster 'us-east1': field 'token_secret'"):
        render_all(registry)


def test_value_that_would_need_quoting_is_bad_input(registry):
    registry.get("us-east1").token_secret = "RAY_TOKEN; rm -rf /"
    with pytest.raises(BadInput, match=r"cluster 'us-east1': field 'token_secret'"):
        render_all(registry)


# --- update-configs and --check ----------------------------------------------------------------------


def test_check_passes_on_the_committed_files(registry):
    result = update_configs(registry, check=True)
    assert result.ok, result.summary()
    assert result.unchanged == [f"infra/{name}.yaml" for name in GCP_CLUSTERS]
    assert not (result.written or result.differing or result.diffs)


def test_a_hand_edited_config_fails_check_with_a_diff_and_nothing_is_written(registry, infra):
    edited = infra / "us-central2.yaml"
    edited.write_text(edited.read_text().replace("max_workers: 1024", "max_workers: 2048", 1))
    before = snapshot(infra)

    result = update_configs(registry, check=True, infra_dir=infra)

    assert not result.ok
    assert result.differing == ["infra/us-central2.yaml"] and not result.missing
    diff = result.diffs["infra/us-central2.yaml"]
    assert "--- a/infra/us-central2.yaml" in diff and "+++ b/infra/us-central2.yaml" in diff
    assert "-max_workers: 2048" in diff and "+max_workers: 1024" in diff
    assert "infra/us-central2.yaml" in result.summary()
    assert snapshot(infra) == before
    assert json.loads(result.model_dump_json())["ok"] is False

    fixed = update_configs(registry, check=False, infra_dir=infra)
    assert fixed.ok and fixed.written == ["infra/us-central2.yaml"]
    assert len(fixed.unchanged) == len(GCP_CLUSTERS) - 1
    assert edited.read_text() == (INFRA_DIR / "us-central2.yaml").read_text()
    assert update_configs(registry, check=True, infra_dir=infra).ok


def test_a_missing_config_is_reported_and_regenerated(registry, infra):
    (infra / "us-east1.yaml").unlink()

    result = update_configs(registry, check=True, infra_dir=infra)
    assert not result.ok
    assert result.missing == result.differing == ["infra/us-east1.yaml"]
    assert result.diffs["infra/us-east1.yaml"].startswith("--- /dev/null\n+++ b/infra/us-east1.yaml\n")
    assert not (infra / "us-east1.yaml").exists()

    assert update_configs(registry, check=False, infra_dir=infra).written == ["infra/us-east1.yaml"]
    assert (infra / "us-east1.yaml").read_text() == (INFRA_DIR / "us-east1.yaml").read_text()


def test_a_config_of_a_removed_cluster_is_stale(registry, infra):
    shutil.copy(infra / "us-east1.yaml", infra / "us-south1.yaml")
    (infra / "notes.yaml").write_text("# someone else's file\n")

    result = update_configs(registry, check=True, infra_dir=infra)
    assert result.stale == result.differing == ["infra/us-south1.yaml"]
    assert "+++ /dev/null" in result.diffs["infra/us-south1.yaml"]
    assert (infra / "us-south1.yaml").exists()

    regenerated = update_configs(registry, check=False, infra_dir=infra)
    assert regenerated.removed == ["infra/us-south1.yaml"] and regenerated.ok
    assert not (infra / "us-south1.yaml").exists()
    assert (infra / "notes.yaml").exists() and (infra / "clusters.yaml").exists()


def test_a_template_edit_without_regenerating_fails_check_for_every_cluster(registry, infra):
    template = infra / TEMPLATE_NAME
    template.write_text(template.read_text().replace("diskSizeGb: 200", "diskSizeGb: 300"))
    result = update_configs(registry, check=True, infra_dir=infra)
    assert result.differing == [f"infra/{name}.yaml" for name in GCP_CLUSTERS]
    assert all("+            diskSizeGb: 300" in d for d in result.diffs.values())


def test_a_new_image_tag_changes_only_that_clusters_config(registry, infra):
    registry.get("us-west4").image_tag = "20260101"
    result = update_configs(registry, check=True, infra_dir=infra)
    assert result.differing == ["infra/us-west4.yaml"]
    assert (
        '+  image: "us-west4-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:20260101"'
        in (result.diffs["infra/us-west4.yaml"])
    )
