"""Every class of bad input gets FILE:LINE:COL pointing at the offending key or value."""

from __future__ import annotations

import textwrap

import pytest

from dstack_plan.config.loader import load_text

# (id, config text, expected line, expected column, a substring of the message)
CASES = [
    ("yaml-syntax", "type: task\ncommands: [echo hi\n", 3, 1, "invalid YAML"),
    (
        "yaml-tab-indent",
        "type: task\ncommands:\n\t- echo\n",
        3,
        1,
        "tabs are not allowed for indentation",
    ),
    (
        "unknown-key",
        "type: task\ncomands:\n  - echo hi\n",
        2,
        1,
        "unknown key 'comands' (did you mean 'commands'?)",
    ),
    (
        "unknown-nested-key",
        "type: task\ncommands: [x]\nresources:\n  gpus: 2\n",
        4,
        3,
        "unknown key 'gpus' (did you mean 'gpu'?)",
    ),
    ("unknown-type", "type: job\ncommands: [x]\n", 1, 7, "unknown type 'job'"),
    ("missing-type", "name: train\ncommands: [x]\n", 1, 1, "missing required key 'type'"),
    ("not-a-mapping", "- type: task\n", 1, 1, "expected a mapping"),
    ("bad-duration", "type: task\ncommands: [x]\nmax_duration: 5x\n", 3, 15, "invalid duration"),
    ("bad-memory", "type: task\ncommands: [x]\nresources:\n  memory: 8XB\n", 4, 11, "memory"),
    ("range-min-gt-max", "type: task\ncommands: [x]\nresources:\n  gpu: 8..2\n", 4, 8, "gpu"),
    ("empty-range", "type: task\ncommands: [x]\nresources:\n  cpu: '..'\n", 4, 8, "cpu"),
    ("gpu-two-counts", "type: task\ncommands: [x]\nresources:\n  gpu: 2:4\n", 4, 8, "gpu"),
    ("cpu-bad-arch", "type: task\ncommands: [x]\nresources:\n  cpu: mips:4\n", 4, 8, "cpu"),
    (
        "python-and-image",
        "type: task\ncommands: [x]\nimage: ubuntu\npython: '3.11'\n",
        4,
        1,
        "mutually exclusive",
    ),
    (
        "docker-and-python",
        "type: task\ncommands: [x]\npython: '3.11'\ndocker: true\n",
        4,
        1,
        "docker: true",
    ),
    (
        "nodes-and-groups",
        "type: task\nnodes: 2\ngroups:\n  - nodes: 1\n    commands: [x]\n",
        3,
        1,
        "mutually exclusive",
    ),
    ("task-without-commands", "type: task\nname: idle\n", 1, 1, "needs 'commands' or an 'image'"),
    (
        "service-without-port",
        "type: service\ncommands: [x]\n",
        1,
        1,
        "missing required key 'port'",
    ),
    ("bad-port-string", "type: service\ncommands: [x]\nport: abc\n", 3, 7, "invalid port mapping"),
    ("port-out-of-range", "type: service\ncommands: [x]\nport: 70000\n", 3, 7, "out of range"),
    (
        "replicas-range-without-scaling",
        "type: service\ncommands: [x]\nport: 80\nreplicas: 0..3\n",
        4,
        1,
        "needs 'scaling'",
    ),
    # a fleet without nodes or ssh_config, nodes with ssh_config, hosts without a user: dstack's
    # parser accepts them, the plan refuses them (tests/unit/test_limits.py)
    (
        "ssh-port-type",
        "type: fleet\nssh_config:\n  user: u\n  port: twenty\n  hosts: [h1]\n",
        4,
        9,
        "port",
    ),
    (
        "volume-without-region",
        "type: volume\nname: data\nbackend: aws\nsize: 100GB\n",
        3,
        1,
        "need a 'region'",
    ),
    (
        "gateway-without-region",
        "type: gateway\nname: gw\nbackend: aws\n",
        1,
        1,
        "missing required key 'region'",
    ),
    (
        "unknown-interpolation",
        "type: task\ncommands: [x]\nenv:\n  - A=${{ vars.X }}\n",
        4,
        5,
        "unknown interpolation namespace 'vars'",
    ),
    (
        "unterminated-interpolation",
        "type: task\ncommands: ['echo ${{ secrets.X']\n",
        2,
        12,
        "unterminated",
    ),
    ("bad-name", "type: task\nname: Train_1\ncommands: [x]\n", 2, 7, "invalid name"),
    (
        "bad-depends-on",
        "type: task\ncommands: [x]\ndepends_on: [foo.bar]\n",
        3,
        14,
        "invalid address",
    ),
    (
        "unknown-lifecycle-key",
        "type: task\ncommands: [x]\nlifecycle:\n  ignore: [x]\n",
        4,
        3,
        "unknown key 'ignore'",
    ),
    (
        "bad-env-name",
        "type: task\ncommands: [x]\nenv:\n  - 1BAD=x\n",
        4,
        5,
        "invalid env variable name",
    ),
    ("commands-not-a-list", "type: task\ncommands: echo hi\n", 2, 11, "commands"),
    (
        "bad-spot-policy",
        "type: task\ncommands: [x]\nspot_policy: sometimes\n",
        3,
        14,
        "spot_policy",
    ),
    (
        "empty-retry-events",
        "type: task\ncommands: [x]\nretry:\n  on_events: []\n",
        4,
        14,
        "must not be empty",
    ),
    ("priority-too-high", "type: task\ncommands: [x]\npriority: 200\n", 3, 11, "priority"),
    (
        "python-unsupported",
        "type: task\ncommands: [x]\npython: '2.7'\n",
        3,
        9,
        "unsupported python",
    ),
    ("resources-not-a-mapping", "type: task\ncommands: [x]\nresources: 5\n", 3, 12, "resources"),
    ("negative-max-price", "type: task\ncommands: [x]\nmax_price: -1\n", 3, 12, "max_price"),
    ("infinite-max-price", "type: task\ncommands: [x]\nmax_price: .inf\n", 3, 12, "finite"),
    ("bad-cron", "type: task\ncommands: [x]\nschedule:\n  cron: '* *'\n", 4, 9, "cron"),
    ("two-repos", "type: task\ncommands: [x]\nrepos: [a, b]\n", 3, 8, "repos"),
    (
        "mount-with-three-colons",
        "type: task\ncommands: [x]\nvolumes: ['/a:/b:/c:/d']\n",
        3,
        11,
        "invalid volume '/a:/b:/c:/d': expected NAME:/path or /host/path:/path (one ':', not 3)",
    ),
    (
        "zero-disk-mapping",
        "type: task\ncommands: [x]\nresources:\n  disk: {size: 0}\n",
        4,
        16,
        "resources.disk.size: disk size must be greater than 0GB",
    ),
    (
        "zero-disk-shorthand",
        "type: task\ncommands: [x]\nresources:\n  disk: 0GB\n",
        4,
        9,
        "resources.disk: disk size must be greater than 0GB",
    ),
    (
        "zero-memory",
        "type: fleet\nnodes: 1\nresources:\n  memory: 0GB\n",
        4,
        11,
        "resources.memory: memory must be greater than 0GB",
    ),
    (
        "zero-volume-size",
        "type: volume\nname: data\nbackend: aws\nregion: us-east-1\nsize: 0\n",
        5,
        7,
        "size: volume size must be greater than 0GB",
    ),
    (
        "ignore-changes-unknown-path",
        "type: task\ncommands: [x]\nlifecycle:\n  ignore_changes: [priority, resourcs.gpu]\n",
        4,
        30,
        "lifecycle.ignore_changes.1: a task has no field 'resourcs.gpu' "
        "(did you mean 'resources.gpu'?)",
    ),
    (
        "ignore-changes-other-kinds-field",
        "type: task\ncommands: [x]\nlifecycle:\n  ignore_changes: [replicas]\n",
        4,
        20,
        "a task has no field 'replicas'",
    ),
    (
        "ignore-changes-below-a-leaf",
        "type: task\ncommands: [x]\nlifecycle:\n  ignore_changes: [resources.gpu.count]\n",
        4,
        20,
        "a task has no field 'resources.gpu.count'",
    ),
    (
        "group-name",
        "type: task\ngroups:\n  - name: Big_Nodes\n    commands: [x]\n",
        3,
        11,
        "groups.0.name: invalid group name 'Big_Nodes'",
    ),
    (
        "second-document",
        "type: task\ncommands: [x]\n---\ntype: task\nname: b\nmax_duration: forever\n",
        6,
        15,
        "invalid duration",
    ),
]


@pytest.mark.parametrize(
    "text, line, column, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_broken_config_is_located(text: str, line: int, column: int, message: str) -> None:
    resources, issues = load_text(text, "bad.dstack.yml")
    assert issues, "expected an error"
    first = issues[0]
    assert (first.file, first.line, first.column) == ("bad.dstack.yml", line, column), str(first)
    assert message in first.message, str(first)
    assert str(first).startswith(f"bad.dstack.yml:{line}:{column}: error: ")


def test_there_are_at_least_30_failure_classes() -> None:
    assert len({c[0] for c in CASES}) >= 30


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    text = textwrap.dedent(
        """\
        type: task
        comands: [x]
        max_duration: soon
        resources:
          gpu: 8..2
        """
    )
    _, issues = load_text(text, "f.dstack.yml")
    lines = sorted(i.line for i in issues)
    assert lines == [2, 3, 5], [str(i) for i in issues]


def test_ignore_changes_accepts_what_each_kind_has() -> None:
    service = "type: service\ncommands: [x]\nport: 80\nenv: [A=1]\n"
    paths = "[replicas, resources.gpu, env.A, scaling, lifecycle.prevent_destroy, name]"
    resources, issues = load_text(service + f"lifecycle:\n  ignore_changes: {paths}\n", "s.yml")
    assert issues == [] and len(resources) == 1
    fleet = (
        "type: fleet\nnodes: 1\nlifecycle: {ignore_changes: [nodes, tags.team, retry.duration]}\n"
    )
    resources, issues = load_text(fleet, "f.yml")
    assert issues == [] and len(resources) == 1


def test_mounts_with_one_colon_and_sizes_above_zero_are_accepted() -> None:
    text = (
        "type: task\ncommands: [x]\nvolumes: ['/cache:/root/.cache', 'data:/data']\n"
        "resources: {disk: 0GB..100GB, memory: 0.., shm_size: 0}\n"
    )
    resources, issues = load_text(text, "t.yml")
    assert issues == [] and len(resources) == 1


def test_errors_in_several_documents_are_all_reported() -> None:
    text = "type: task\nfoo: 1\ncommands: [x]\n---\ntype: fleet\nbar: 2\nnodes: 1\n"
    _, issues = load_text(text, "f.dstack.yml")
    assert [(i.line, i.column) for i in issues] == [(2, 1), (6, 1)]
