"""Shared GPUs on the agent: the allocator's shares, the spec field, the env a share gets."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dstack_plan.agent.api_models import HostFacts, JobInfo
from dstack_plan.agent.api_models import JobSpec as WireSpec
from dstack_plan.agent.gpualloc import WHOLE, GpuAllocator, GpuUnavailable
from dstack_plan.agent.gpushare import MpsDirs, mps_available, share_env, sharing_mode
from dstack_plan.agent.job import Job
from dstack_plan.agent.logstore import LogStore
from dstack_plan.agent.spec import SpecError, parse_job_spec


def test_shares_pack_onto_the_fullest_gpu_that_fits() -> None:
    alloc = GpuAllocator([0, 1, 2])
    assert alloc.allocate("a", 1, 500) == [0]
    assert alloc.allocate("b", 1, 300) == [0]  # 50% free on 0 beats 100% on 1
    assert alloc.allocate("c", 1, 300) == [1]  # 0 has only 20% left
    assert alloc.allocate("d", 1, 100) == [0]  # the fullest that fits: 0 (20% free)
    assert alloc.allocate("w", 1) == [2]  # a whole GPU only takes one nobody holds
    assert alloc.shares() == {0: {"a": 500, "b": 300, "d": 100}, 1: {"c": 300}, 2: {"w": WHOLE}}
    assert alloc.allocations() == {0: "a,b,d", 1: "c", 2: "w"}
    assert alloc.free() == []


def test_ties_go_to_the_lowest_index() -> None:
    alloc = GpuAllocator([3, 1, 2])
    assert alloc.allocate("a", 1, 250) == [1]


def test_a_share_that_fits_nowhere_is_busy_and_says_what_is_free() -> None:
    alloc = GpuAllocator([0])
    alloc.allocate("a", 1, 500)
    alloc.allocate("b", 1, 200)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("c", 1, 600)
    assert e.value.status == 409
    assert "GPU 0: 30% free (job a 50%, job b 20%)" in str(e.value)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("w", 1)  # a whole GPU is not free while shares hold it
    assert e.value.status == 409 and "only 0 are free" in str(e.value)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("x", (0,))
    assert e.value.status == 409 and "[0] are in use" in str(e.value)


def test_a_share_of_an_explicit_index_checks_that_gpu() -> None:
    alloc = GpuAllocator([0, 1])
    alloc.allocate("a", (1,), 900)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("b", (1,), 200)
    assert e.value.status == 409
    assert "asked for 20% of GPU 1 but it has 10% free" in str(e.value)
    assert alloc.allocate("b", (1,), 100) == [1]
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("c", (5,), 100)
    assert e.value.status == 422


def test_a_share_on_a_host_without_gpus_never_fits() -> None:
    with pytest.raises(GpuUnavailable) as e:
        GpuAllocator([]).allocate("a", 1, 500)
    assert e.value.status == 422 and "has none" in str(e.value)


def test_whole_gpu_holders_block_shares_and_release_frees_them() -> None:
    alloc = GpuAllocator([0])
    alloc.allocate("w", 1)
    with pytest.raises(GpuUnavailable) as e:
        alloc.allocate("s", 1, 100)
    assert e.value.status == 409 and "0 by job w" in str(e.value)
    alloc.release("w")
    assert alloc.allocate("s", 1, 100) == [0]
    alloc.release("s")
    assert alloc.shares() == {} and alloc.free() == [0]


def test_claim_restores_shares_after_a_restart() -> None:
    alloc = GpuAllocator([0])
    alloc.claim("old", [0], 600)
    with pytest.raises(GpuUnavailable):
        alloc.allocate("new", 1, 500)
    assert alloc.allocate("new", 1, 400) == [0]
    assert alloc.snapshot() == {
        "indices": [0],
        "allocated": {"0": "new,old"},
        "shares": {"0": {"new": 400, "old": 600}},
    }


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["share", "index", "whole", "release"]),
        st.integers(0, 7),  # which job
        st.integers(0, 3),  # a GPU index (one past the host's) or a count
        st.integers(1, 999),  # a share
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_random_allocations_never_over_commit_a_gpu(ops: list[tuple[str, int, int, int]]) -> None:
    alloc = GpuAllocator([0, 1, 2])
    for kind, n, index, share in ops:
        job = f"j{n}"
        alloc.release(job)
        try:
            if kind == "share":
                alloc.allocate(job, 1, share)
            elif kind == "index":
                alloc.allocate(job, (index,), share)
            elif kind == "whole":
                alloc.allocate(job, index)
        except GpuUnavailable as e:
            assert e.status in (409, 422)
        for gpu, held in alloc.shares().items():
            assert gpu in (0, 1, 2)
            assert sum(held.values()) <= WHOLE
            assert WHOLE not in held.values() or len(held) == 1  # a whole GPU is held alone
        assert set(alloc.free()).isdisjoint(alloc.shares())


def test_spec_share_needs_one_gpu_and_a_valid_amount() -> None:
    assert parse_job_spec({"run_name": "r", "commands": ["x"], "gpus": 1}).gpu_share is None
    spec = parse_job_spec({"run_name": "r", "commands": ["x"], "gpus": [2], "gpu_share": 250})
    assert spec.gpu_share == 250 and spec.to_dict()["gpu_share"] == 250
    assert "gpu_share" not in parse_job_spec({"run_name": "r", "commands": ["x"]}).to_dict()
    for gpus, share in ((2, 500), ([0, 1], 500), (0, 500), (1, 0), (1, 1000), (1, True)):
        with pytest.raises(SpecError) as e:
            parse_job_spec({"run_name": "r", "commands": ["x"], "gpus": gpus, "gpu_share": share})
        assert [f for f, _ in e.value.problems] == ["gpu_share"]


def test_wire_spec_validates_the_share_and_omits_it_when_unset() -> None:
    assert "gpu_share" not in WireSpec(run_name="r", gpus=1).to_wire()
    assert WireSpec(run_name="r", gpus=[3], gpu_share=500).to_wire()["gpu_share"] == 500
    for gpus, share in ((2, 500), (1, 1000), (1, 0)):
        with pytest.raises(ValidationError, match="gpu_share"):
            WireSpec(run_name="r", gpus=gpus, gpu_share=share)


def test_answers_from_older_agents_read_without_shares() -> None:
    info = JobInfo.model_validate(
        {"id": "a", "run_name": "r", "runtime": "process", "status": "running", "submitted_at": 1}
    )
    assert (info.gpu_share, info.gpu_sharing) == (None, None)
    facts = HostFacts.model_validate(
        {
            "hostname": "h",
            "os": "o",
            "kernel": "k",
            "arch": "x",
            "cpus": 1,
            "memory": {"total_bytes": 1, "available_bytes": 1},
            "disk": {"path": "/", "total_bytes": 1, "free_bytes": 1},
            "addresses": [],
            "python": "3",
            "docker": {"present": False},
            "gpus": [],
            "gpu_shares": {"0": {"a": 500}},
        }
    )
    assert facts.gpu_shares == {0: {"a": 500}}


def test_mps_is_detected_by_its_control_socket(tmp_path: Path) -> None:
    dirs = MpsDirs(str(tmp_path), str(tmp_path / "log"))
    (tmp_path / "control").write_text("not a socket")
    assert not mps_available(dirs.pipe)
    assert sharing_mode(500, "nvidia", dirs) == "time-slicing"
    (tmp_path / "control").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "control"))
        assert sharing_mode(500, "nvidia", dirs) == "mps"
        assert sharing_mode(500, "amd", dirs) == "time-slicing"  # MPS is NVIDIA's
        assert sharing_mode(None, "nvidia", dirs) is None


def test_share_env_under_mps_and_time_slicing() -> None:
    dirs = MpsDirs("/p", "/l")
    assert share_env(None, None, 81920, dirs) == {}
    assert share_env(125, "time-slicing", 81920, dirs) == {"DSTACK_GPU_SHARE": "12.5"}
    assert share_env(250, "mps", 81920, dirs) == {
        "DSTACK_GPU_SHARE": "25",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "CUDA_MPS_PIPE_DIRECTORY": "/p",
        "CUDA_MPS_LOG_DIRECTORY": "/l",
    }
    assert share_env(1, "mps", None, dirs)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in share_env(1, "mps", None, dirs)


def test_job_record_keeps_the_share(tmp_path: Path) -> None:
    spec = parse_job_spec(
        {"id": "a", "run_name": "r", "commands": ["x"], "gpus": 1, "gpu_share": 500}
    )
    logs = LogStore(tmp_path / "logs", 1024)
    job = Job(spec=spec, runtime="process", logs=logs, gpus=[0], gpu_vendor="nvidia")
    job.gpu_sharing = "mps"
    job.gpu_share_env = {"DSTACK_GPU_SHARE": "50"}
    back = Job.from_record(job.record(), logs)
    assert (back.spec.gpu_share, back.gpu_sharing, back.gpu_share_env) == (
        500,
        "mps",
        {"DSTACK_GPU_SHARE": "50"},
    )
    assert (back.info()["gpu_share"], back.info()["gpu_sharing"]) == (500, "mps")
    old = {k: v for k, v in job.record().items() if k not in ("gpu_sharing", "gpu_share_env")}
    old["spec"] = {k: v for k, v in old["spec"].items() if k != "gpu_share"}
    older = Job.from_record(old, logs)
    assert (older.spec.gpu_share, older.gpu_sharing, older.gpu_share_env) == (None, None, {})
    logs.close()
