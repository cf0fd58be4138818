"""Which backend a project uses: --state, then $DSTACK_STATE, then .dstack/backend.yml, then
.dstack/state.json; and the located errors of backend.yml."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import ConfigError, DstackPlanError, StateError
from dstack_plan.inspect.state_init import backend_config_from_flags, check_switch
from dstack_plan.state.backend_config import (
    LocalBackendConfig,
    S3BackendConfig,
    load_backend_config,
    parse_backend_config,
    save_backend_config,
)
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.state.s3_location import S3Location
from dstack_plan.state.select import choose, open_backend

S3_YML = "backend: s3\nbucket: team-state\nkey: p/state.json\nregion: eu-west-1\n"


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSTACK_STATE", raising=False)


def write_yml(project: Path, text: str) -> None:
    (project / ".dstack").mkdir(exist_ok=True)
    (project / ".dstack" / "backend.yml").write_text(text)


def test_default_is_the_local_state_of_the_project(tmp_path: Path) -> None:
    choice = choose(tmp_path)
    assert (choice.where, choice.source) == (tmp_path / ".dstack" / "state.json", "default")
    backend = open_backend(tmp_path)
    assert isinstance(backend, LocalBackend) and backend.path == choice.where


def test_backend_yml_then_env_then_flag_each_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_yml(tmp_path, S3_YML)
    assert choose(tmp_path) == (
        S3Location("team-state", "p/state.json", region="eu-west-1"),
        ".dstack/backend.yml",
    )
    monkeypatch.setenv("DSTACK_STATE", "s3://ci-bucket/x/state.json?region=us-east-1")
    assert choose(tmp_path).where == S3Location("ci-bucket", "x/state.json", region="us-east-1")
    assert choose(tmp_path).source == "DSTACK_STATE"
    assert choose(tmp_path, "other.json") == (Path("other.json"), "--state")


def test_local_backend_yml_path_is_relative_to_the_project(tmp_path: Path) -> None:
    write_yml(tmp_path, "backend: local\npath: states/dev.json\n")
    assert choose(tmp_path).where == tmp_path / "states" / "dev.json"
    write_yml(tmp_path, "backend: local\n")
    assert choose(tmp_path).where == tmp_path / ".dstack" / "state.json"


def test_open_backend_does_not_import_boto3_for_local(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from dstack_plan.state.select import open_backend;"
        f" open_backend({str(tmp_path)!r}).read();"
        " print('boto3' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (
            "backend: s3\nbucket: b-1\nkey: k\naccess_key: AKIA\n",
            "4:1",
            "unknown key 'access_key'",
        ),
        ("backend: s3\nkey: k\n", "1:1", "missing required key 'bucket'"),
        ("backend: gcs\n", "1:10", "backend: expected 's3' or 'local', got 'gcs'"),
        ("bucket: b\n", "1:1", "missing required key 'backend'"),
        ("backend: s3\nbucket: b-1\nkey: [1]\n", "3:6", "key:"),
        ("backend: local\npath: a\nregion: r\n", "3:1", "unknown key 'region'"),
        ("- a\n", "1:1", "expected a mapping with a 'backend' key"),
    ],
)
def test_backend_yml_errors_are_located(text: str, where: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_backend_config(text)
    shown = str(caught.value)
    assert shown.startswith(f".dstack/backend.yml:{where}: "), shown
    assert message in shown


def test_saved_config_reads_back(tmp_path: Path) -> None:
    config = S3BackendConfig(
        backend="s3", bucket="b-1", key="k/s.json", endpoint_url="http://127.0.0.1:9"
    )
    save_backend_config(tmp_path, config)
    assert load_backend_config(tmp_path) == config
    assert "region" not in (tmp_path / ".dstack" / "backend.yml").read_text()


def test_bad_bucket_in_backend_yml_is_a_state_error(tmp_path: Path) -> None:
    write_yml(tmp_path, "backend: s3\nbucket: Bad_Bucket\nkey: k\n")
    with pytest.raises(StateError, match="invalid bucket name"):
        choose(tmp_path)


def test_init_flags(tmp_path: Path) -> None:
    flags = dict(
        bucket=None, key=None, region=None, endpoint_url=None, profile=None, kms_key_id=None
    )
    assert backend_config_from_flags("local", **flags, path=None) == LocalBackendConfig(
        backend="local"
    )
    with pytest.raises(DstackPlanError, match="needs --bucket and --key"):
        backend_config_from_flags("s3", **flags, path=None)
    with pytest.raises(DstackPlanError, match="--region: only for --backend s3"):
        backend_config_from_flags("local", **{**flags, "region": "r"}, path=None)
    with pytest.raises(DstackPlanError, match="expected s3 or local"):
        backend_config_from_flags("gcs", **flags, path=None)


def test_init_refuses_to_leave_a_local_state_with_resources(tmp_path: Path) -> None:
    s3 = S3BackendConfig(backend="s3", bucket="b-1", key="k")
    check_switch(tmp_path, s3)  # no state: fine
    backend = LocalBackend.for_project(tmp_path)
    entry = ResourceState.create(
        "task.a", provider="local", spec={}, status="done", now=timestamp(FakeClock())
    )
    backend.write(State.empty().with_resource(entry), "absent")
    with pytest.raises(DstackPlanError, match="state migrate"):
        check_switch(tmp_path, s3)
    check_switch(tmp_path, LocalBackendConfig(backend="local"))  # not a switch
