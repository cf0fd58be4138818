"""Issue 35: what dstack 0.22.5's parser lets through, and what its server does with it.

- one-character (and other invalid) names: the parser takes them, the server refuses them
  when the configuration is applied (`validate_dstack_resource_name`,
  `^[a-z][a-z0-9-]{1,40}$`): refused here when the file loads, saying so;
- env names with `-`: the parser takes them in the mapping form (its list form takes
  identifiers only): accepted here in the same form, and passed on to the agent;
- `${{ run.<unknown> }}`: the parser takes it, `dstack apply` (commands) or the server (env,
  volume names) fails on "missing vars": refused here when the file loads, saying so.

The verdicts of dstack itself are in tests/conformance/identifiers.yml; docs/configuration.md
lists where we differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.agent.spec import SpecError, parse_job_spec
from dstack_plan.config.env import parse_env
from dstack_plan.config.loader import load_text
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job

CONTEXT = JobContext("envs", "run-id", 0, "abc123", 1, "127.0.0.1", ("127.0.0.1",))


def errors(text: str) -> list[str]:
    _, issues = load_text(text, "p.dstack.yml", name_hint="p")
    return [str(i) for i in issues]


def run_spec(text: str) -> RunSpec:
    [resource], issues = load_text(text, "p.dstack.yml", name_hint="p")
    assert not issues, [str(i) for i in issues]
    assert isinstance(resource.spec, RunSpec)
    return resource.spec


# --- (a) names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "type: task\ncommands: [ls]\n",
        "type: fleet\nnodes: 1\n",
        "type: volume\nbackend: aws\nregion: us-east-1\nsize: 10\n",
        "type: gateway\nbackend: aws\nregion: us-east-1\n",
    ],
)
def test_a_one_character_name_is_refused_as_dstacks_server_refuses_it(kind: str) -> None:
    [error] = errors(kind + "name: q\n")
    assert ":7: error: name: invalid name 'q': use 2-41 characters" in error
    assert "dstack's server refuses other names too" in error


def test_a_two_character_name_is_a_name() -> None:
    assert errors("type: task\ncommands: [ls]\nname: qa\n") == []


def test_namespaces_are_ours_and_say_nothing_of_dstack() -> None:
    [error] = errors("type: task\nname: tt\ncommands: [ls]\nnamespace: q\n")
    assert "invalid name 'q'" in error and "dstack's server" not in error


# --- (b) env names --------------------------------------------------------------------------


def test_env_mapping_names_may_hold_dashes_and_dots() -> None:
    spec = run_spec(
        "type: task\nname: envs\ncommands: [env]\n"
        "env: {MY-VAR: x, spring.profiles.active: dev, 1ST: one, 2: two}\n"
    )
    assert spec.env == {"1ST": "one", "2": "two", "MY-VAR": "x", "spring.profiles.active": "dev"}


def test_an_ssh_fleets_env_mapping_names_may_hold_dashes() -> None:
    [resource], issues = load_text(
        "type: fleet\nname: on-prem\nssh_config: {user: u, hosts: [h1]}\n"
        "env: {HTTP-PROXY: 'http://proxy:80'}\n",
        "f.dstack.yml",
    )
    assert not issues
    assert resource.spec.env == {"HTTP-PROXY": "http://proxy:80"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", ["MY-VAR=x", "MY-VAR"])
def test_the_list_form_takes_identifiers_as_dstack_does_and_points_at_the_mapping(
    entry: str,
) -> None:
    [error] = errors(f"type: task\nname: tt\ncommands: [ls]\nenv: [{entry}]\n")
    assert error.startswith("p.dstack.yml:4:7: error: env.0: invalid env variable name 'MY-VAR'")
    assert "write env as a mapping (MY-VAR: value)" in error


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ('"A=B"', "no '='"),
        ('""', "not empty"),
        ('"A\\tB"', "no control characters"),
        ("A" + "B" * 256, "at most 256 characters"),
    ],
)
def test_env_mapping_names_that_cannot_be_variables_are_refused(key: str, why: str) -> None:
    [error] = errors(f"type: task\nname: tt\ncommands: [ls]\nenv: {{{key}: x}}\n")
    assert "invalid env variable name" in error and why in error
    assert error.startswith("p.dstack.yml:4:")


def test_what_the_config_takes_the_agent_takes(tmp_path: Path) -> None:
    names = ["MY-VAR", "spring.profiles.active", "1ST", "A B", "X" * 256, "ÄÖ"]
    env = parse_env(dict.fromkeys(names, "v"))
    spec = run_spec(
        "type: task\nname: envs\ncommands: [env]\nenv:\n"
        + "".join(f"  {name!r}: v\n" for name in env)
    )
    job = build_job(spec, JobSlot(0, 0), CONTEXT, SecretStore(tmp_path, environ={}), environ={})
    checked = parse_job_spec(job.to_wire())
    assert {name: checked.env[name] for name in names} == dict.fromkeys(names, "v")


@pytest.mark.parametrize("name", ["A=B", "", "A\nB", "X" * 257])
def test_the_agent_refuses_names_no_variable_can_have(name: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job_spec({"run_name": "r", "commands": ["true"], "env": {name: "v"}})
    [(field, message)] = e.value.problems
    assert field == f"env.{name[:64]}" and "not a valid variable name" in message


# --- (c) ${{ run.<unknown> }} ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("commands: ['echo ${{ run.foo }}']\n", "p.dstack.yml:3:"),
        ("commands: [ls]\nenv: ['OUT=${{ run.foo }}']\n", "p.dstack.yml:4:"),
    ],
)
def test_an_unknown_run_name_is_refused_at_load_saying_dstack_refuses_it(
    extra: str, where: str
) -> None:
    [error] = errors("type: task\nname: tt\n" + extra)
    assert error.startswith(where)
    assert "unknown name 'foo' in namespace 'run' (known: args, name, project_name)" in error
    assert "dstack refuses it too, when the configuration is applied" in error


def test_known_run_names_load() -> None:
    run_spec("type: task\nname: tt\ncommands: ['echo ${{ run.args }} ${{ run.name }}']\n")
