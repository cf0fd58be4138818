"""`type: slurm` in `.dstack/backends.yml`: dstack's form accepted, mistakes located."""

from __future__ import annotations

import pytest

from dstack_plan.config.backends import BACKENDS_FILE, parse_backends, render_backends
from dstack_plan.config.slurm_backend import SlurmBackend
from dstack_plan.errors import ConfigError

DSTACK_FORM = """\
backends:
  - type: slurm
    clusters:
      - name: gpu-cluster-a
        hostname: login.example.com
        user: admin
        identity_file: ~/.ssh/id_rsa
        gpu_partitions:
          - gpu: H100
            partitions: [gpu, gpu-long]
        cpu_partitions: [cpu]
        account: ml
        qos: normal
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_backends(text)
    return [str(issue) for issue in info.value.issues]


def test_dstacks_form_parses() -> None:
    (backend,) = parse_backends(DSTACK_FORM).backends
    assert isinstance(backend, SlurmBackend)
    cluster = backend.cluster(None)
    assert cluster is not None and cluster.name == "gpu-cluster-a"
    assert cluster.partitions == ["gpu", "gpu-long", "cpu"]
    gpu = cluster.gpu_of("gpu-long")
    assert gpu is not None and gpu.gpu == "H100" and gpu.gres == "gpu"
    assert cluster.gpu_of("cpu") is None
    assert (cluster.account, cluster.qos, cluster.containers) == ("ml", "normal", "none")
    assert backend.cluster("nope") is None


def test_renders_and_parses_back() -> None:
    parsed = parse_backends(DSTACK_FORM)
    assert parse_backends(render_backends(parsed)) == parsed


def test_a_cluster_without_partitions_is_refused() -> None:
    text = DSTACK_FORM.split("        gpu_partitions:")[0]
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:4:9: error: ")
    assert "a cluster needs gpu_partitions or cpu_partitions" in message


def test_a_partition_listed_twice_is_refused() -> None:
    text = DSTACK_FORM.replace("cpu_partitions: [cpu]", "cpu_partitions: [gpu]")
    (message,) = errors(text)
    assert "partition 'gpu' is listed twice" in message


def test_a_partition_name_that_is_no_slurm_name_is_located() -> None:
    # it would reach sbatch's command line: refused where it is written
    text = DSTACK_FORM.replace("[gpu, gpu-long]", "[gpu, 'a;rm -rf ~']")
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:10:")
    assert "invalid partition name 'a;rm -rf ~'" in message


def test_two_clusters_of_one_name_are_refused() -> None:
    second = DSTACK_FORM.split("    clusters:\n")[1]
    (message,) = errors(DSTACK_FORM + second)
    assert "a second cluster named 'gpu-cluster-a'" in message


def test_init_flags_make_a_cluster() -> None:
    from dstack_plan.config.slurm_backend import cluster_from_flags, with_cluster

    cluster = cluster_from_flags(
        "hpc",
        "alice@login.example.org:2222",
        identity_file="~/.ssh/id_ed25519",
        gpu_partitions=["A100=a100,a100-long", "H100=h100"],
        cpu_partitions=["cpu"],
        qos="normal",
    )
    assert (cluster.user, cluster.hostname, cluster.port) == ("alice", "login.example.org", 2222)
    assert cluster.partitions == ["a100", "a100-long", "h100", "cpu"]
    assert cluster.gpu_of("h100").gpu == "H100"  # type: ignore[union-attr]
    backend = with_cluster(None, cluster)
    other = cluster_from_flags("other", "bob@x", cpu_partitions=["batch"])
    both = with_cluster(backend, other)
    assert [c.name for c in both.clusters] == ["hpc", "other"]
    again = with_cluster(both, cluster.model_copy(update={"qos": "high"}))
    assert [(c.name, c.qos) for c in again.clusters] == [("other", None), ("hpc", "high")]
    for login in ("login.example.org", "alice@", "alice@host:ssh"):
        with pytest.raises(ValueError, match="--login"):
            cluster_from_flags("hpc", login, cpu_partitions=["cpu"])
    with pytest.raises(ValueError, match="--gpu-partition 'A100'"):
        cluster_from_flags("hpc", "a@h", gpu_partitions=["A100"])
