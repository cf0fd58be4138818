"""A real agent masks secret values in the log it stores: whatever a job prints, no reader and
no file of the data dir ever holds a value, also when a value arrives split across chunks,
shares a prefix with another or overlaps itself, and after an agent restart."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from pydantic import SecretStr

from dstack_plan.agent.api_models import JobSpec
from tests.infra.agent_helpers import wait_for_log
from tests.infra.agent_process import AgentProcess
from tests.integration.test_agent_process import assert_nowhere


def values() -> dict[str, str]:
    token = "tok-" + secrets.token_hex(12)
    short = "pw-" + secrets.token_hex(6)
    return {
        "TOKEN": token,
        "SHORT": short,
        "LONG": short + "-" + secrets.token_hex(6),  # SHORT is a prefix of LONG
        "OVERLAP": "q7" * 4,  # `q7q7q7q7q7` holds it twice, overlapping
    }


# Each `sleep` makes the agent read what came before as a chunk of its own.
COMMANDS = [
    'echo "$TOKEN"',
    'printf %s "$TOKEN" | cut -c1-3',
    'printf %s "$TOKEN" | head -c 7; sleep 0.3; printf "%s\\n" "$TOKEN" | tail -c +8',
    'echo "$LONG"; echo "$SHORT"; printf "%s+%s\\n" "$SHORT" "$LONG"',
    'printf "[%s" "$OVERLAP"; sleep 0.3; printf "q7]\\n"',
    'printf %s "$TOKEN"',  # the last bytes of output: held back until the end, then masked
]


def expected(token: str) -> bytes:
    return (
        b"(sensitive)\n"
        + token[:3].encode()
        + b"\n(sensitive)\n"
        + b"(sensitive)\n(sensitive)\n(sensitive)+(sensitive)\n"
        + b"[(sensitive)]\n"
        + b"(sensitive)"
    )


def secret_env(found: dict[str, str]) -> dict[str, str | SecretStr]:
    return {name: SecretStr(value) for name, value in found.items()}


async def test_a_process_job_printing_its_secrets(agent: AgentProcess) -> None:
    found = values()
    client = agent.client()
    await client.submit(JobSpec(id="p1", run_name="r", commands=COMMANDS, env=secret_env(found)))
    info = await client.wait("p1", timeout=20)
    assert info.status.value == "done", info
    assert await client.read_all_logs("p1") == expected(found["TOKEN"])
    for value in found.values():
        assert_nowhere(value, agent)


async def test_short_values_are_shown_and_plain_env_is_untouched(agent: AgentProcess) -> None:
    client = agent.client()
    await client.submit(
        JobSpec(
            id="p2",
            run_name="r",
            commands=['echo "$PIN $PLAIN"'],
            env={"PIN": SecretStr("123"), "PLAIN": "plain-value"},
        )
    )
    await client.wait("p2", timeout=20)
    assert await client.read_all_logs("p2") == b"123 plain-value\n"


@pytest.mark.docker
async def test_a_container_job_printing_its_secrets(
    agent: AgentProcess, busybox_image: str
) -> None:
    found = values()
    client = agent.client()
    commands = [
        *COMMANDS[:-1],
        # stderr writes between the two halves of a value on stdout
        'printf %s "$TOKEN" | head -c 9; echo err-line >&2; sleep 0.3;'
        ' printf "%s\\n" "$TOKEN" | tail -c +10',
        COMMANDS[-1],
    ]
    await client.submit(
        JobSpec(
            id="d1", run_name="r", image=busybox_image, commands=commands, env=secret_env(found)
        )
    )
    info = await client.wait("d1", timeout=30)
    assert info.status.value == "done", info
    log = await client.read_all_logs("d1")
    # stdout and stderr come through two pipes (dockerd copies each on its own), in no set
    # order between them: a busy machine may deliver the stderr line before stdout's earlier
    # bytes. Each stream keeps its own order, and stdout is masked whole.
    assert log.count(b"err-line\n") == 1
    head = expected(found["TOKEN"])[: -len(b"(sensitive)")]
    assert log.replace(b"err-line\n", b"") == head + b"(sensitive)\n(sensitive)"
    for value in found.values():
        assert_nowhere(value, agent)


@pytest.mark.docker
async def test_masking_goes_on_after_an_agent_restart(
    agent: AgentProcess, busybox_image: str, docker_client: Any
) -> None:
    token = "tok-" + secrets.token_hex(12)
    client = agent.client()
    await client.submit(
        JobSpec(
            id="d2",
            run_name="r",
            image=busybox_image,
            commands=[
                'echo "before $TOKEN"',
                'printf "half %s" "$TOKEN" | head -c 12',  # held back when the agent dies
                "sleep 3",
                'printf "%s\\n" "$TOKEN" | tail -c +8',
                'echo "after $TOKEN"',
            ],
            env={"TOKEN": SecretStr(token)},
        )
    )
    await wait_for_log(client, "d2", b"before (sensitive)\n", timeout=20)
    time.sleep(0.3)
    agent.kill()  # SIGKILL: the agent keeps no secret value on disk to come back with
    agent.start()
    client = agent.client()
    info = await client.wait("d2", timeout=30)
    assert info.status.value == "done", info
    log = await client.read_all_logs("d2")
    assert log == b"before (sensitive)\nhalf (sensitive)\nafter (sensitive)\n"
    assert_nowhere(token, agent)
