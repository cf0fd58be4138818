"""`dstack init --backend aws|gcp|azure` writes `.dstack/backends.yml` (the clouds), while
`--backend local|s3` keep writing `.dstack/backend.yml` (the state), as a user runs them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dstack_plan.config.backends import AWSBackend, GCPBackend, load_backends
from dstack_plan.state.backend_config import (
    LocalBackendConfig,
    S3BackendConfig,
    load_backend_config,
)
from tests.e2e.conftest import Dstack


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_aws_writes_backends_yml_and_a_second_run_replaces_it(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    first = ok(dstack("init", "--backend", "aws", "--region", "eu-west-1"))
    assert "Wrote .dstack/backends.yml: the aws backend in eu-west-1." in first.stdout
    assert load_backends(project).backends == [AWSBackend(type="aws", regions=["eu-west-1"])]
    assert not (project / ".dstack" / "backend.yml").exists()  # the state stays local

    ok(dstack("init", "--backend", "gcp", "--project-id", "my-project"))
    ok(dstack("init", "--backend", "aws", "--region", "us-east-1", "--profile", "ci"))
    assert load_backends(project).backends == [
        AWSBackend(type="aws", regions=["us-east-1"], profile="ci"),
        GCPBackend(type="gcp", project_id="my-project"),
    ]


def test_gitignore_lets_the_team_commit_backends_yml(dstack: Dstack, tmp_path: Path) -> None:
    ok(dstack("init", "--backend", "aws"))
    lines = (tmp_path / "project" / ".gitignore").read_text().splitlines()
    assert ".dstack/*" in lines
    assert "!.dstack/backends.yml" in lines and "!.dstack/backend.yml" in lines


def test_an_older_gitignore_gets_the_backends_line(dstack: Dstack, tmp_path: Path) -> None:
    gitignore = tmp_path / "project" / ".gitignore"
    gitignore.write_text(".dstack/*\n!.dstack/backend.yml\n")
    done = ok(dstack("init"))
    assert "Added !.dstack/backends.yml to .gitignore." in done.stdout
    assert gitignore.read_text() == ".dstack/*\n!.dstack/backend.yml\n!.dstack/backends.yml\n"
    assert ok(dstack("init")).stdout == "Already initialised: nothing to do.\n"


def test_missing_required_option_is_a_clear_error(dstack: Dstack, tmp_path: Path) -> None:
    for args, needed in (
        (("--backend", "gcp"), "--project-id"),
        (("--backend", "azure", "--region", "westeurope"), "--subscription-id"),
    ):
        done = dstack("init", *args)
        assert done.returncode == 1
        assert needed in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "project" / ".dstack" / "backends.yml").exists()


def test_flags_of_another_backend_are_refused(dstack: Dstack) -> None:
    done = dstack("init", "--backend", "aws", "--bucket", "b")
    assert done.returncode == 1 and "--bucket" in done.stderr
    done = dstack("init", "--backend", "s3", "--bucket", "b", "--key", "k", "--project-id", "p")
    assert done.returncode == 1 and "--project-id" in done.stderr
    done = dstack("init", "--backend", "gcp", "--project-id", "p", "--profile", "ci")
    assert done.returncode == 1 and "--profile" in done.stderr
    done = dstack("init", "--backend", "oracle")
    assert done.returncode == 1
    assert "aws, gcp or azure" in done.stderr and "Traceback" not in done.stderr


def test_help_explains_both_meanings(dstack: Dstack) -> None:
    text = " ".join(ok(dstack("init", "--help")).stdout.split())
    assert "backend.yml" in text and "backends.yml" in text
    assert "--project-id" in text and "--subscription-id" in text


def test_state_backends_still_work(
    dstack: Dstack, tmp_path: Path, moto_server, s3_bucket, cli_env: dict[str, str]
) -> None:
    # boto3 honours AWS_ENDPOINT_URL: should init reach S3, it reaches moto, never AWS
    cli_env.update(s3_bucket.env, AWS_ENDPOINT_URL=moto_server.endpoint_url)
    project = tmp_path / "project"
    ok(dstack("init", "--backend", "s3", "--bucket", s3_bucket.name, "--key", "a/state.json"))
    assert load_backend_config(project) == S3BackendConfig(
        backend="s3", bucket=s3_bucket.name, key="a/state.json"
    )
    ok(dstack("init", "--backend", "local"))
    assert load_backend_config(project) == LocalBackendConfig(backend="local")
    assert not (project / ".dstack" / "backends.yml").exists()


def test_slurm_adds_a_cluster_and_keeps_the_clouds_and_other_clusters(
    dstack: Dstack, tmp_path: Path
) -> None:
    from dstack_plan.config.slurm_backend import SlurmBackend

    project = tmp_path / "project"
    ok(dstack("init", "--backend", "aws"))
    first = ok(
        dstack(
            "init", "--backend", "slurm", "--cluster", "hpc", "--login", "alice@login.hpc",
            "--identity-file", "~/.ssh/id_ed25519", "--gpu-partition", "A100=gpu,gpu-long",
            "--cpu-partition", "cpu", "--account", "ml",
        )
    )  # fmt: skip
    assert (
        "Wrote .dstack/backends.yml: Slurm cluster hpc through alice@login.hpc, partitions "
        "gpu, gpu-long, cpu." in first.stdout
    )
    ok(dstack("init", "--backend", "slurm", "--cluster", "lab", "--login", "bob@lab:2200",
              "--cpu-partition", "batch"))  # fmt: skip
    aws, slurm = load_backends(project).backends
    assert aws == AWSBackend(type="aws")
    assert isinstance(slurm, SlurmBackend)
    assert [(c.name, c.user, c.port, c.account) for c in slurm.clusters] == [
        ("hpc", "alice", 22, "ml"),
        ("lab", "bob", 2200, None),
    ]

    missing = dstack("init", "--backend", "slurm", "--cluster", "x", "--login", "a@b")
    assert missing.returncode == 1
    assert "needs --cluster NAME, --login USER@HOST and at least one" in missing.stderr
    bad = dstack("init", "--backend", "slurm", "--cluster", "x", "--login", "b",
                 "--cpu-partition", "cpu")  # fmt: skip
    assert bad.returncode == 1 and "--login 'b': expected USER@HOST" in bad.stderr
    stray = dstack("init", "--backend", "aws", "--login", "a@b")
    assert stray.returncode == 1 and "--login: only for --backend slurm" in stray.stderr
