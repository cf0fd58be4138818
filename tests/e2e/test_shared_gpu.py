"""Two runs share one GPU of the local host (a fake nvidia-smi reports one): both run at once,
both see GPU 0 with their share; `ps` says the GPU is time-sliced (no MPS daemon here); a
third run asking more than is left is pending with how much is free, and a whole-GPU run
waits for the GPU the shares hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import state, wait_for_status

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *memory.total,uuid*) echo "0, NVIDIA L4, 23034, GPU-fake-0" ;;
  *utilization.gpu*) echo "0, 0, 1024, 23034" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def one_gpu(cli_env: dict[str, str], tmp_path: Path) -> Dstack:
    """`dstack` whose local agent (started by the first apply) sees one fake GPU."""
    bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", FAKE_NVIDIA_SMI)
    return gpu_cli(cli_env, tmp_path / "project", bin_dir)


def task(name: str, gpu: str) -> str:
    return (
        f"type: task\nname: {name}\nstop_duration: 1s\n"
        "commands:\n"
        "  - echo visible=$CUDA_VISIBLE_DEVICES share=$DSTACK_GPU_SHARE\n"
        "  - exec sleep 300\n"
        f"resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB.., gpu: {gpu!r}}}\n"
    )


def planned(dstack: Dstack) -> dict[str, dict]:
    out = dstack("plan", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return {c["address"]: c for c in json.loads(out.stdout)["resource_changes"]}


def test_two_runs_share_one_gpu_and_both_see_it(one_gpu: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "a.dstack.yml").write_text(task("infer-a", "50%"))
    (project / "b.dstack.yml").write_text(task("infer-b", "L4:40%"))
    try:
        applied = one_gpu("apply", "-y")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        for name in ("infer-a", "infer-b"):
            wait_for_status(one_gpu, f"task.{name}", {"running"})
        assert one_gpu("logs", "infer-a").stdout.splitlines()[0] == "visible=0 share=50"
        assert one_gpu("logs", "infer-b").stdout.splitlines()[0] == "visible=0 share=40"

        shown = one_gpu("ps")
        assert shown.returncode == 0, shown.stderr
        assert "50% of GPU 0 (time-sliced: no limits)" in shown.stdout
        assert "40% of GPU 0 (time-sliced: no limits)" in shown.stdout
        jobs = {
            name: state(project)["resources"][f"task.{name}"]["attributes"]["jobs"]
            for name in ("infer-a", "infer-b")
        }
        assert all(len(j) == 1 for j in jobs.values())

        # 10% is left: a 20% share and a whole GPU both wait, saying for what
        (project / "c.dstack.yml").write_text(task("infer-c", "20%"))
        (project / "d.dstack.yml").write_text(task("train", "1"))
        changes = planned(one_gpu)
        note_c = changes["task.infer-c"]["placement"]["note"]
        assert note_c.startswith("pending: waits for 20% of a GPU on local"), note_c
        assert "task.infer-a" in note_c and "task.infer-b" in note_c
        note_d = changes["task.train"]["placement"]["note"]
        assert note_d.startswith("pending: waits for 1 GPU on local"), note_d
        # a 10% share still fits beside them
        (project / "c.dstack.yml").write_text(task("infer-c", "10%"))
        (project / "d.dstack.yml").unlink()
        assert planned(one_gpu)["task.infer-c"]["placement"]["placed"] is True
    finally:
        assert one_gpu("destroy", "-y").returncode == 0
