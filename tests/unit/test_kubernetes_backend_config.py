"""`type: kubernetes` in `.dstack/backends.yml`: dstack's single-cluster form and the clusters
form accepted, mistakes located; `dstack init --backend kubernetes` adding a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.backends import (
    BACKENDS_FILE,
    AWSBackend,
    load_backends,
    parse_backends,
    render_backends,
)
from dstack_plan.config.kubernetes_backend import (
    KubernetesBackend,
    KubernetesCluster,
    cluster_from_flags,
    kubeconfig_context,
    with_cluster,
)
from dstack_plan.errors import ConfigError
from tests.conftest import run_main

DSTACK_FORM = """\
backends:
  - type: kubernetes
    kubeconfig:
      filename: ~/.kube/config
    namespace: ml
"""
CLUSTERS_FORM = """\
backends:
  - type: kubernetes
    clusters:
      - name: prod
        kubeconfig: /etc/k8s/prod.yaml
        context: prod-admin
        namespace: ml-team
        default_image: nvcr.io/nvidia/pytorch:24.01-py3
        gpu_label: nvidia.com/gpu.product
        image_pull_secret: regcred
      - name: lab
"""
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
  - name: kind
    cluster: {server: "https://127.0.0.1:6443"}
users:
  - name: admin
    user: {token: not-a-real-one}
contexts:
  - name: kind-dev
    context: {cluster: kind, user: admin}
  - name: kind-ci
    context: {cluster: kind, user: admin, namespace: ci}
current-context: kind-dev
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_backends(text)
    return [str(issue) for issue in info.value.issues]


def test_dstacks_single_cluster_form_is_one_cluster_named_kubernetes() -> None:
    (backend,) = parse_backends(DSTACK_FORM).backends
    assert isinstance(backend, KubernetesBackend)
    assert backend.clusters == [
        KubernetesCluster(name="kubernetes", kubeconfig="~/.kube/config", namespace="ml")
    ]
    cluster = backend.cluster(None)
    assert cluster is not None and cluster.context is None
    assert (cluster.default_image, cluster.gpu_label) == (
        "python:3.12-slim",
        "nvidia.com/gpu.product",
    )
    assert cluster.kubeconfig_path == Path.home() / ".kube" / "config"


def test_the_clusters_form_parses() -> None:
    (backend,) = parse_backends(CLUSTERS_FORM).backends
    assert isinstance(backend, KubernetesBackend)
    prod, lab = backend.clusters
    assert backend.cluster("prod") == prod and backend.cluster(None) == prod
    assert (prod.kubeconfig, prod.context, prod.namespace) == (
        "/etc/k8s/prod.yaml",
        "prod-admin",
        "ml-team",
    )
    assert prod.image_pull_secret == "regcred"
    assert (lab.kubeconfig, lab.namespace) == ("~/.kube/config", "default")
    assert backend.cluster("nope") is None


@pytest.mark.parametrize("text", [DSTACK_FORM, CLUSTERS_FORM])
def test_renders_and_parses_back(text: str) -> None:
    parsed = parse_backends(text)
    rendered = render_backends(parsed)
    assert "# credentials: each cluster's kubeconfig" in rendered
    assert "|kubernetes)" in rendered.splitlines()[0]
    assert parse_backends(rendered) == parsed


def test_two_clusters_of_one_name_are_located() -> None:
    (message,) = errors(CLUSTERS_FORM.replace("name: lab", "name: prod"))
    assert message.startswith(f"{BACKENDS_FILE}:11:15: error: ")
    assert "backends.0.clusters.1.name: a second cluster named 'prod'" in message


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        (
            DSTACK_FORM.replace("namespace: ml", "namespace: ML_Team"),
            "5:16",
            "backends.0.namespace: invalid namespace 'ML_Team'",
        ),
        (
            CLUSTERS_FORM.replace("namespace: ml-team", "namespace: -ml"),
            "7:20",
            "backends.0.clusters.0.namespace: invalid namespace '-ml'",
        ),
        (
            CLUSTERS_FORM.replace("name: lab", "name: Lab"),
            "11:15",
            "backends.0.clusters.1.name: invalid cluster name 'Lab'",
        ),
        (
            CLUSTERS_FORM.replace("gpu_label: nvidia.com/gpu.product", "gpu_label: 'gpu model'"),
            "9:20",
            "backends.0.clusters.0.gpu_label: invalid label key 'gpu model'",
        ),
    ],
)
def test_bad_values_are_located(text: str, where: str, says: str) -> None:
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:{where}: error: {says}")


def test_an_inline_kubeconfig_is_refused_where_it_is_written() -> None:
    # its credentials would be committed with the project
    text = DSTACK_FORM.replace("filename: ~/.kube/config", "data: 'apiVersion: v1'")
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:4:13: error: backends.0.kubeconfig.data: ")
    assert "an inline kubeconfig (data:) is refused: credentials never go in the project" in (
        message
    )
    text = CLUSTERS_FORM.replace("kubeconfig: /etc/k8s/prod.yaml", "kubeconfig: {data: x}")
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:5:28: error: backends.0.clusters.0.kubeconfig")
    (message,) = errors(DSTACK_FORM.replace("filename:", "file:"))
    assert "expected a path, or {filename: PATH}" in message


def test_proxy_jump_is_refused_at_its_key() -> None:
    text = DSTACK_FORM + "    proxy_jump:\n      hostname: bastion\n      port: 22\n"
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:6:5: error: proxy_jump is not supported yet")
    assert "a kubeconfig whose API server is reachable" in message
    text = CLUSTERS_FORM + "        proxy_jump: {hostname: bastion}\n"
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:12:9: error: proxy_jump is not supported yet")


def test_one_clusters_fields_beside_clusters_are_refused() -> None:
    text = CLUSTERS_FORM.replace("    clusters:\n", "    namespace: ml\n    clusters:\n")
    (message,) = errors(text)
    assert message.startswith(f"{BACKENDS_FILE}:3:5: error: backends.0.namespace: ")
    assert "only without clusters:" in message


def test_an_unknown_key_of_the_single_form_is_located() -> None:
    (message,) = errors(DSTACK_FORM + "    regions: [eu]\n")
    assert message.startswith(f"{BACKENDS_FILE}:6:5: error: unknown key 'regions'")


def test_flags_make_a_cluster_and_replace_the_one_of_its_name() -> None:
    prod = cluster_from_flags("prod", kubeconfig="/k/prod", context="admin", namespace="ml")
    assert (prod.kubeconfig, prod.context, prod.namespace) == ("/k/prod", "admin", "ml")
    assert cluster_from_flags("lab") == KubernetesCluster(name="lab")
    backend = with_cluster(with_cluster(None, prod), cluster_from_flags("lab"))
    again = with_cluster(backend, prod.model_copy(update={"namespace": "other"}))
    assert [(c.name, c.namespace) for c in again.clusters] == [
        ("lab", "default"),
        ("prod", "other"),
    ]
    with pytest.raises(ValueError, match="invalid namespace"):
        cluster_from_flags("prod", namespace="Bad")


def test_the_kubeconfig_must_name_the_context(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    assert kubeconfig_context(KubernetesCluster(name="a", kubeconfig=str(config))) == "kind-dev"
    ci = KubernetesCluster(name="a", kubeconfig=str(config), context="kind-ci")
    assert kubeconfig_context(ci) == "kind-ci"
    with pytest.raises(ValueError, match="no context 'prod' \\(it has kind-dev, kind-ci\\)"):
        kubeconfig_context(ci.model_copy(update={"context": "prod"}))
    config.write_text(KUBECONFIG.replace("current-context: kind-dev\n", ""))
    with pytest.raises(ValueError, match="no current-context"):
        kubeconfig_context(KubernetesCluster(name="a", kubeconfig=str(config)))
    with pytest.raises(ValueError, match="nope: no such file"):
        kubeconfig_context(KubernetesCluster(name="a", kubeconfig=str(tmp_path / "nope")))


# -- dstack init --backend kubernetes -----------------------------------------------------


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def test_init_adds_a_cluster_keeping_the_other_backends_and_clusters(
    tmp_path: Path,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = tmp_path / "project"
    project.mkdir()

    def init(*args: str) -> str:
        code, out, err = run_main(monkeypatch, capsys, "init", str(project), *args)
        assert code == 0, err
        return out

    init("--backend", "aws")
    out = init("--backend", "kubernetes", "--cluster", "dev", "--kubeconfig", str(kubeconfig))
    assert (
        f"Wrote {BACKENDS_FILE}: Kubernetes cluster dev through context kind-dev (the current "
        f"one) of {kubeconfig}, namespace default." in out
    )
    init(
        "--backend", "kubernetes", "--cluster", "ci", "--kubeconfig", str(kubeconfig),
        "--context", "kind-ci", "--namespace", "ci", "--default-image", "python:3.11",
    )  # fmt: skip
    out = init(
        "--backend", "kubernetes", "--cluster", "dev", "--kubeconfig", str(kubeconfig),
        "--namespace", "dev",
    )  # fmt: skip
    aws, backend = load_backends(project).backends
    assert aws == AWSBackend(type="aws")
    assert isinstance(backend, KubernetesBackend)
    assert [(c.name, c.context, c.namespace, c.default_image) for c in backend.clusters] == [
        ("ci", "kind-ci", "ci", "python:3.11"),
        ("dev", None, "dev", "python:3.12-slim"),
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("--cluster", "dev", "--context", "prod"),
            "no context 'prod' (it has kind-dev, kind-ci) (choose one with --context)",
        ),
        (
            ("--cluster", "dev", "--namespace", "Bad"),
            "--backend kubernetes: namespace: invalid namespace 'Bad'",
        ),
        (("--namespace", "ml"), "--backend kubernetes needs --cluster NAME"),
    ],
)
def test_init_refuses_what_would_not_work(
    tmp_path: Path,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    says: str,
) -> None:
    code, _, err = run_main(
        monkeypatch, capsys, "init", str(tmp_path), "--backend", "kubernetes",
        "--kubeconfig", str(kubeconfig), *args,
    )  # fmt: skip
    assert code == 1 and says in err and "Traceback" not in err
    assert not (tmp_path / BACKENDS_FILE).exists()


def test_init_refuses_a_missing_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    code, _, err = run_main(
        monkeypatch, capsys, "init", str(tmp_path), "--backend", "kubernetes",
        "--cluster", "dev", "--kubeconfig", str(missing),
    )  # fmt: skip
    assert code == 1 and f"kubeconfig {missing}: no such file" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--backend", "kubernetes", "--cluster", "x", "--login", "a@b"),
         "--login: only for --backend slurm"),
        (("--backend", "slurm", "--cluster", "x", "--namespace", "ml"),
         "--namespace: only for --backend kubernetes"),
        (("--backend", "aws", "--context", "c"), "--context: only for --backend kubernetes"),
        (("--backend", "aws", "--cluster", "x"),
         "--cluster: only for --backend slurm or kubernetes"),
    ],
)  # fmt: skip
def test_init_refuses_another_backends_flags(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    says: str,
) -> None:
    code, _, err = run_main(monkeypatch, capsys, "init", str(tmp_path), *args)
    assert code == 1 and says in err
    assert not (tmp_path / BACKENDS_FILE).exists()


def test_a_fleet_names_its_cluster_by_region_among_several(tmp_path: Path) -> None:
    from dstack_plan.errors import ProviderError
    from dstack_plan.fleets.kubernetes import cluster_for

    (tmp_path / ".dstack").mkdir()
    (tmp_path / ".dstack" / "backends.yml").write_text(
        "backends:\n"
        "  - type: kubernetes\n"
        "    clusters:\n"
        "      - {name: prod, kubeconfig: /k/prod.yaml, namespace: ml}\n"
        "      - {name: lab, kubeconfig: /k/lab.yaml, context: lab-admin}\n"
    )
    assert cluster_for({}, str(tmp_path)).name == "prod"  # no region: the first
    lab = cluster_for({"regions": ["lab"]}, str(tmp_path))
    assert (lab.kubeconfig, lab.context, lab.namespace) == ("/k/lab.yaml", "lab-admin", "default")
    with pytest.raises(ProviderError, match="no Kubernetes cluster named 'edge'.*prod, lab"):
        cluster_for({"regions": ["edge"]}, str(tmp_path))
