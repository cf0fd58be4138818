from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config import forkmap, loader
from dstack_plan.config.loader import discover, load_project
from dstack_plan.errors import ConfigError

TASK = "type: task\nname: {name}\ncommands: [echo hi]\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_discovers_config_files_and_skips_vcs_state_and_virtualenvs(tmp_path: Path) -> None:
    write(tmp_path / ".dstack.yml", TASK.format(name="root"))
    write(tmp_path / "a" / "train.dstack.yml", TASK.format(name="train"))
    write(tmp_path / "a" / "b" / "serve.dstack.yaml", TASK.format(name="serve"))
    write(tmp_path / "a" / ".dstack.yaml", TASK.format(name="a-dir"))
    write(tmp_path / ".git" / "x.dstack.yml", TASK.format(name="git"))
    write(tmp_path / ".dstack" / "y.dstack.yml", TASK.format(name="state"))
    write(tmp_path / "env" / "pyvenv.cfg", "")
    write(tmp_path / "env" / "lib" / "z.dstack.yml", TASK.format(name="venv"))
    write(tmp_path / "notes.yml", TASK.format(name="plain"))
    names = {r.name for r in load_project(tmp_path)}
    assert names == {"root", "train", "serve", "a-dir"}
    assert len(discover(tmp_path)) == 4


def test_several_documents_per_file(tmp_path: Path) -> None:
    write(tmp_path / "all.dstack.yml", "\n---\n".join(TASK.format(name=n) for n in list("abc")))
    with pytest.raises(ConfigError):  # names must be 2+ chars
        load_project(tmp_path)
    write(tmp_path / "all.dstack.yml", "\n---\n".join(TASK.format(name=n) for n in ["aa", "bb"]))
    assert [r.address for r in load_project(tmp_path)] == ["task.aa", "task.bb"]


def test_files_given_explicitly_and_stdin(tmp_path: Path) -> None:
    f = write(tmp_path / "one.dstack.yml", TASK.format(name="one"))
    write(tmp_path / "two.dstack.yml", TASK.format(name="two"))
    assert [r.name for r in load_project(tmp_path, [f])] == ["one"]
    stdin = TASK.format(name="piped")
    desired = load_project(tmp_path, ["-"], stdin=stdin)
    assert [(r.name, r.source.file) for r in desired] == [("piped", "<stdin>")]


def test_missing_name_is_derived_from_the_path_and_stable(tmp_path: Path) -> None:
    write(tmp_path / "jobs" / "Train_Big.dstack.yml", "type: task\ncommands: [x]\n")
    write(tmp_path / "llm" / ".dstack.yml", "type: service\ncommands: [x]\nport: 80\n")
    first = sorted(r.address for r in load_project(tmp_path))
    second = sorted(r.address for r in load_project(tmp_path))
    assert first == second == ["service.llm", "task.jobs-train-big"]


def test_unnamed_documents_in_one_file_get_distinct_names(tmp_path: Path) -> None:
    write(tmp_path / "x.dstack.yml", "type: task\ncommands: [a]\n---\ntype: task\ncommands: [b]\n")
    assert sorted(r.name for r in load_project(tmp_path)) == ["x-0", "x-1"]


def test_long_derived_names_stay_valid_and_unique(tmp_path: Path) -> None:
    long_dir = "a-very-long-directory-name-for-testing"
    write(tmp_path / long_dir / "first-config.dstack.yml", "type: task\ncommands: [a]\n")
    write(tmp_path / long_dir / "second-config.dstack.yml", "type: task\ncommands: [a]\n")
    names = [r.name for r in load_project(tmp_path)]
    assert len(set(names)) == 2
    assert all(2 <= len(n) <= 41 and n[0].isalpha() for n in names)


def test_duplicate_addresses_name_both_places(tmp_path: Path) -> None:
    write(tmp_path / "a.dstack.yml", TASK.format(name="train"))
    write(tmp_path / "b.dstack.yml", "# comment\n" + TASK.format(name="train"))
    with pytest.raises(ConfigError) as info:
        load_project(tmp_path)
    (issue,) = info.value.issues
    assert (issue.file, issue.line, issue.column) == ("b.dstack.yml", 3, 7)
    assert "duplicate resource task.train: already defined at a.dstack.yml:2:7" in issue.message


def test_same_name_different_kinds_is_fine(tmp_path: Path) -> None:
    write(
        tmp_path / "a.dstack.yml",
        TASK.format(name="gpu") + "---\ntype: fleet\nname: gpu\nnodes: 1\n",
    )
    assert sorted(r.address for r in load_project(tmp_path)) == ["fleet.gpu", "task.gpu"]


def test_errors_from_several_files_are_all_reported(tmp_path: Path) -> None:
    write(tmp_path / "a.dstack.yml", "type: task\nbogus: 1\ncommands: [x]\n")
    write(tmp_path / "b.dstack.yml", "type: fleet\nnodes: many\n")
    with pytest.raises(ConfigError) as info:
        load_project(tmp_path)
    assert [(i.file, i.line) for i in info.value.issues] == [
        ("a.dstack.yml", 2),
        ("b.dstack.yml", 2),
    ]


def test_unreadable_and_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read file"):
        load_project(tmp_path, [tmp_path / "nope.dstack.yml"])
    bad = tmp_path / "bin.dstack.yml"
    bad.write_bytes(b"type: task\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_project(tmp_path, [bad])


def test_interpolation_is_kept_symbolic(tmp_path: Path) -> None:
    write(
        tmp_path / "s.dstack.yml",
        "type: task\nname: sec\ncommands: ['echo ${{ run.args }}']\n"
        "env:\n  - TOKEN=${{ secrets.HF_TOKEN }}\n  - HOME_DIR=${{ env.HOME }}\n",
    )
    (resource,) = load_project(tmp_path)
    assert resource.spec.env["TOKEN"] == "${{ secrets.HF_TOKEN }}"
    assert resource.spec.commands == ("echo ${{ run.args }}",)


def test_defaults_are_filled_so_equivalent_configs_are_equal(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "t.dstack.yml", "type: task\nname: tt\ncommands: [x]\n")
    b = write(
        tmp_path / "b" / "t.dstack.yml",
        "name: tt\ncommands: [x]\ntype: task\nspot_policy: on-demand\nstop_duration: 5m\n"
        "resources: {cpu: '2..', memory: 8GB.., disk: 100GB..}\nenv: {}\n",
    )
    (ra,) = load_project(tmp_path, [a])
    (rb,) = load_project(tmp_path, [b])
    assert ra.spec.model_dump(mode="json") == rb.spec.model_dump(mode="json")


def test_loading_on_several_cores_gives_what_one_core_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big projects load in forked workers; resources, derived names and errors are the same."""
    for i in range(12):
        docs = [TASK.format(name=f"t{i}-{j}") for j in range(3)]
        docs.append("type: task\ncommands: [echo]\n")  # name derived from the file
        if i in (2, 9):  # broken files in the first and last slice
            docs.append("type: task\nname: bad\nmax_duration: forever\n")
        write(tmp_path / f"g{i:02d}.dstack.yml", "---\n".join(docs))
    write(tmp_path / "z-syntax.dstack.yml", "type: task\ncommands: [echo\n")

    def outcome() -> tuple[list[str], list[str]]:
        with pytest.raises(ConfigError) as info:
            load_project(tmp_path)
        return [str(i) for i in info.value.issues], sorted(discover(tmp_path.resolve()))

    serial = outcome()
    monkeypatch.setattr(loader, "PARALLEL_LOAD_BYTES", 0)
    monkeypatch.setattr(forkmap, "available_cores", lambda: 3)  # fork even on one core
    assert outcome() == serial
    assert len(serial[0]) == 3 and "g02.dstack.yml:" in serial[0][0]
    assert "z-syntax.dstack.yml:3:1: error: invalid YAML" in serial[0][-1]

    (tmp_path / "g02.dstack.yml").unlink()
    (tmp_path / "g09.dstack.yml").unlink()
    (tmp_path / "z-syntax.dstack.yml").unlink()
    parallel = load_project(tmp_path)
    monkeypatch.setattr(loader, "PARALLEL_LOAD_BYTES", 10**12)
    assert load_project(tmp_path) == parallel
    assert len(parallel.resources) == 40 and "task.g11" in parallel.resources


def test_normalised_forms_can_come_back_from_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(6):
        write(tmp_path / f"f{i}.dstack.yml", TASK.format(name=f"task-{i}"))
    monkeypatch.setattr(loader, "PARALLEL_LOAD_BYTES", 0)
    monkeypatch.setattr(forkmap, "available_cores", lambda: 3)
    desired = loader.start_loading(tmp_path, normalize=True).finish()
    for resource in desired:
        assert "normalized" in vars(resource)  # computed where the file was parsed
        fresh = resource.spec.model_dump(mode="json", exclude_none=True) | {"name": resource.name}
        assert resource.normalized == fresh and resource.normalized["type"] == "task"
