"""The cluster template and the generated per-cluster configs (`python -m ops update-configs [--check]`).

Real template, real registry, real Ray validation; the drift stories run on a copy of infra/ in tmp_path.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from functools import partial
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray._private.accelerators.tpu import get_num_tpu_visible_chips_per_host
from ray.autoscaler._private.docker import docker_start_cmds
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for

from ops.configs import (
    GENERATED_MARKER,
    INFRA_DIR,
    SECRETS_DIR,
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


# What each cluster offers, as Marin runs them (GCP_API_FACTS 7.4): the default single-host worker, then
# the slices; v4 clusters up to v4-256, big-run further. Warm pools: Marin's eight v6e-128 on us-east5,
# four default workers elsewhere (seeds/000).
V4 = ["v4-8", "v4-16", "v4-32", "v4-64", "v4-128", "v4-256"]
V5E = [
    "v5litepod-4",
    "v5litepod-8",
    "v5litepod-16",
    "v5litepod-32",
    "v5litepod-64",
    "v5litepod-128",
    "v5litepod-256",
]
V6E = ["v6e-4", "v6e-8", "v6e-16", "v6e-32", "v6e-64", "v6e-128", "v6e-256"]
OFFERED = {
    "us-central2": (V4, "tpu-ubuntu2204-base", {"v4-8": 4}),
    "big-run": (V4 + ["v4-512", "v4-1024", "v4-2048"], "tpu-ubuntu2204-base", {"v4-8": 4}),
    "us-west4": (V5E, "v2-alpha-tpuv5-lite", {"v5litepod-4": 4}),
    "eu-west4": (V5E, "v2-alpha-tpuv5-lite", {"v5litepod-4": 4}),
    "us-east5": (V6E, "v2-alpha-tpuv6e", {"v6e-128": 8}),
    "us-east1": (V6E, "v2-alpha-tpuv6e", {"v6e-4": 4}),
    "us-central1": (V6E, "v2-alpha-tpuv6e", {"v6e-4": 4}),
}


def tpu_types(config: dict) -> dict[str, dict]:
    """The TPU node types of a config, keyed by accelerator type."""
    return {
        t["node_config"]["acceleratorType"]: t
        for t in config["available_node_types"].values()
        if "acceleratorType" in t["node_config"]
    }


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_every_slice_type_the_cluster_offers_is_a_node_type_with_its_warm_pool(configs, registry, name):
    offered, runtime, warm = OFFERED[name]
    cluster, config = registry.get(name), configs[name]
    assert [t.tpu_type for t in cluster.worker_types] == offered
    types = tpu_types(config)
    assert list(types) == offered
    # The default worker keeps the node type name the VMs' labels carry; the slices are named as Marin's.
    nodes = config["available_node_types"]
    assert nodes["tpu_worker"]["node_config"]["acceleratorType"] == cluster.worker_tpu_type == offered[0]
    for accelerator in offered[1:]:
        assert nodes[f"tpu_slice_{accelerator.replace('-', '_')}"] is types[accelerator]
    for accelerator, node in types.items():
        assert node["node_config"]["runtimeVersion"] == runtime
        assert node["node_config"]["schedulingConfig"] == {"preemptible": True}
        # One warm slice type, 0 on the rest; each type capped at the cluster's max.
        assert node["min_workers"] == warm.get(accelerator, 0), accelerator
        assert node["max_workers"] == cluster.max_workers == config["max_workers"]
        # The chips Ray's raylet detects on each host of that type (8 on a v6e-8, 4 per host beyond).
        assert node["resources"] == {"CPU": 120, "TPU": get_num_tpu_visible_chips_per_host(accelerator)}
    # The cluster-level figures others read: min_workers is the warm slices in all.
    assert cluster.min_workers == sum(warm.values())
    assert cluster.min_workers_by_type() == {t: warm.get(t, 0) for t in offered}


def test_v6e_chips_per_host_are_rays_not_a_constant(configs):
    types = tpu_types(configs["us-east5"])
    assert {t: n["resources"]["TPU"] for t, n in types.items()} == {
        "v6e-4": 4, "v6e-8": 8, "v6e-16": 4, "v6e-32": 4, "v6e-64": 4, "v6e-128": 4, "v6e-256": 4,
    }  # fmt: skip


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_a_job_asking_for_a_slice_makes_rays_autoscaler_launch_that_slice(configs, name):
    """Through Ray's own steps: `ray up` fills in TPU-<type>-head (we do not write it), then the
    autoscaler's bin-packing picks the node type for a job's demand."""
    raw = configs[name]
    assert not any(
        key.startswith("TPU-") for t in raw["available_node_types"].values() for key in t["resources"]
    ), "TPU-<type>-head is Ray's to fill in"
    prepared = validate_ray_config(raw)
    nodes = prepared["available_node_types"]
    scorer = partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({}))
    for accelerator, node in tpu_types(raw).items():
        name_of_type = next(n for n, t in nodes.items() if t["node_config"] == node["node_config"])
        assert nodes[name_of_type]["resources"][f"TPU-{accelerator}-head"] == 1
        # What a job asks for to get one whole slice (seeds/002): host 0's chips and the slice's head.
        demand = {"TPU": node["resources"]["TPU"], f"TPU-{accelerator}-head": 1}
        launched, unmet = get_nodes_for(nodes, {}, prepared["head_node_type"], 10, [demand], scorer)
        assert (dict(launched), unmet) == ({name_of_type: 1}, []), accelerator


def test_a_slice_the_cluster_does_not_offer_stays_unmet(configs):
    prepared = validate_ray_config(configs["us-central2"])
    scorer = partial(_default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({}))
    demand = [{"TPU": 4, "TPU-v4-512-head": 1}]
    launched, unmet = get_nodes_for(prepared["available_node_types"], {}, "head_default", 10, demand, scorer)
    assert not launched and unmet == demand


def docker_run(config: dict, as_head: bool) -> list[str]:
    """The `docker run` command line Ray's command runner builds for a node of this config."""
    docker = config["docker"]
    options = docker["run_options"] + docker.get("head_run_options" if as_head else "worker_run_options", [])
    line = docker_start_cmds(
        "ray", docker["image"], {}, docker["container_name"], options, "c", "/home/ray", "docker"
    )
    return shlex.split(line)


def env_of(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_worker_containers_run_as_marins_do(configs, registry, name):
    cluster, argv = registry.get(name), docker_run(configs[name], as_head=False)
    assert argv[:2] == ["docker", "run"]
    # Ray puts --rm first; --rm=0 must come after it (the last wins), or Docker refuses --restart.
    assert "--rm" in argv and argv.index("--rm=0") > argv.index("--rm")
    assert "--restart=on-failure" in argv
    assert "--shm-size=200gb" in argv  # not Docker's 64 MB, and Ray's own shm guess is bypassed
    assert argv[argv.index("/var/run/docker.sock:/var/run/docker.sock") - 1] == "-v"
    assert "--privileged" in argv
    env = env_of(argv)
    assert env["BUCKET"] == cluster.bucket and env["MARIN_PREFIX"] == f"gs://{cluster.bucket}"
    assert (env["TPU_MIN_LOG_LEVEL"], env["TPU_STDERR_LOG_LEVEL"], env["TPU_LOG_DIR"]) == (
        "3",
        "3",
        "disabled",
    )
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == TOKEN_PATH


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_the_heads_autoscaler_waits_600_s_for_a_busy_tpu_host(configs, registry, name):
    argv = docker_run(configs[name], as_head=True)
    env = env_of(argv)
    assert env["AUTOSCALER_HEARTBEAT_TIMEOUT_S"] == "600"  # Ray's default 30 s is too short on TPU hosts
    assert env["BUCKET"] == registry.get(name).bucket
    assert "--restart=on-failure" not in argv and "--rm=0" not in argv


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_nodes_know_region_zone_and_fetch_the_workload_secrets_at_boot(configs, registry, name):
    cluster, config = registry.get(name), configs[name]
    setup = config["setup_commands"]
    assert f"gcloud config set compute/region {cluster.region}" in setup
    assert f"gcloud config set compute/zone {cluster.zone}" in setup
    assert cluster.workload_secrets == ["HF_TOKEN", "OPENAI_API_KEY"]
    for secret in cluster.workload_secrets:
        path = f"{SECRETS_DIR}/{secret}"
        fetch = [c for c in setup if f"--secret={secret}" in c]
        assert len(fetch) == 1
        assert (
            f"gcloud secrets versions access latest --secret={secret} --project={cluster.project}" in fetch[0]
        )
        assert "umask 077" in fetch[0] and f"mv {path}.tmp {path}" in fetch[0]
        # Every Ray process, and so every job, gets it as an environment variable of the same name.
        for key in ("head_start_ray_commands", "worker_start_ray_commands"):
            start = " ".join(config[key])
            assert f'export {secret}="$(cat {path})";' in start
            assert start.index(f"export {secret}=") < start.index("ray start")
    assert not SECRETS_DIR.startswith("/tmp")  # the host's /tmp is mounted into every container


def test_no_secret_value_is_in_any_generated_file(registry):
    """Only names: each secret is read at boot by `gcloud secrets versions access` or by its file."""
    names = {"RAY_AUTH_TOKEN", "HF_TOKEN", "OPENAI_API_KEY"}
    for text in render_all(registry).values():
        for name in names:
            for m in re.finditer(rf"\b{name}=([^\n]*)", text):
                assert m.group(1).startswith('"$(cat '), m.group(0)
        assert "-----BEGIN" not in text  # no key material (a PEM header)


@pytest.mark.parametrize("name", GCP_CLUSTERS)
def test_every_node_installs_the_clusters_one_public_key_from_secret_manager(configs, registry, name):
    cluster, config = registry.get(name), configs[name]
    key = cluster.ssh_key
    assert key.public_secret == f"{cluster.ray_cluster_name}-ssh-public-key"
    assert key.private_secret == f"{cluster.ray_cluster_name}-ssh-private-key"
    assert config["auth"] == {"ssh_user": "ray"}  # the private half is this machine's, added by the driver
    nodes = config["available_node_types"]
    head_items = nodes["head_default"]["node_config"]["metadata"]["items"]
    (script,) = [i["value"] for i in head_items if i["key"] == "startup-script"]
    assert (
        f"gcloud secrets versions access latest --secret={key.public_secret} --project={cluster.project}"
        in script
    )
    assert "/home/ray/.ssh/authorized_keys" in script
    for accelerator, node in tpu_types(config).items():
        assert node["node_config"]["metadata"] == {"startup-script": script}, accelerator
    # One pair per cluster: no two clusters share a key or its secrets.
    others = [c.ssh_key for n, c in registry.clusters.items() if n != name and c.ssh_key]
    assert all(key.public_secret != o.public_secret and key.file != o.file for o in others)


def test_a_cluster_without_secrets_or_key_secrets_renders_without_them(registry):
    cluster = registry.get("us-east1")
    cluster.workload_secrets = []
    cluster.ssh_key.public_secret = None
    cluster.bucket = None
    config = yaml.safe_load(render_all(registry)[INFRA_DIR / "us-east1.yaml"])
    assert not any(SECRETS_DIR in c for c in config["setup_commands"])
    assert "export" not in " ".join(config["worker_start_ray_commands"])
    assert all("metadata" not in t["node_config"] for t in config["available_node_types"].values())
    assert "BUCKET" not in env_of(docker_run(config, as_head=False))


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
    text = template.read_text()
    assert "  {{ node.name }}:\n" in text
    template.write_text(text.replace("  {{ node.name }}:\n", "  {{ node.name }}:\n    spot: true\n"))
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
