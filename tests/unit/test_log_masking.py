"""Masking secret values in a job's stored log (`agent/logstore.py`: SecretMask, MaskedLog)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dstack_plan.agent.logstore import (
    MASK,
    MIN_SECRET_LENGTH,
    LogStore,
    MaskedLog,
    SecretMask,
    maskable,
)
from dstack_plan.agent.spec import parse_job_spec


def reference(text: bytes, values: list[str]) -> bytes:
    """Every byte of every occurrence (overlapping ones too) masked, one MASK per run of
    overlapping occurrences: what streaming must produce, however the text is chunked."""
    runs: list[list[int]] = []
    found = sorted(
        (at, at + len(v))
        for v in maskable(values)
        for at in range(len(text))
        if text.startswith(v, at)
    )
    for start, stop in found:
        if runs and start < runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], stop)
        else:
            runs.append([start, stop])
    out, done = [], 0
    for start, stop in runs:
        out += [text[done:start], MASK]
        done = stop
    out.append(text[done:])
    return b"".join(out)


def stream(values: list[str], chunks: list[bytes]) -> bytes:
    mask = SecretMask(maskable(values))
    return b"".join(mask.feed(c) for c in chunks) + mask.flush()


def chunked(text: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def test_value_split_at_every_point_is_masked() -> None:
    token = "tok-8f3a91c2"
    text = f"before {token} after\n".encode()
    for cut in range(len(text) + 1):
        assert stream([token], chunked(text, [cut])) == b"before (sensitive) after\n"
    # one byte at a time
    assert stream([token], [bytes([b]) for b in text]) == b"before (sensitive) after\n"


def test_prefix_of_another_value_and_overlaps() -> None:
    short, long = "abcd1234", "abcd1234-extended"
    assert stream([short, long], [b"x abcd1234-extended y abcd1234 z"]) == (
        b"x (sensitive) y (sensitive) z"
    )
    # overlapping occurrences of one value: all their bytes go, under one marker
    assert stream(["abab"], [b"-ababab-"]) == b"-(sensitive)-"
    # two values overlapping each other: neither's tail is left visible
    assert stream(["abcdef", "defghi"], [b"abcdefghi!"]) == b"(sensitive)!"
    # touching, not overlapping: one marker each
    assert stream(["wxyz"], [b"wxyzwxyz"]) == b"(sensitive)(sensitive)"


def test_short_values_are_not_masked() -> None:
    assert MIN_SECRET_LENGTH == 4
    assert maskable(["", "1", "abc", "abcd"]) == (b"abcd",)
    assert stream(["abc"], [b"abc abc"]) == b"abc abc"


def test_only_a_possible_start_of_a_value_is_held_back() -> None:
    mask = SecretMask(maskable(["secret-value"]))
    assert mask.feed(b"progress 10%\n") == b"progress 10%\n"
    assert not mask.holding
    assert mask.feed(b"loss=0.1 secr") == b"loss=0.1 "
    assert mask.holding
    assert mask.feed(b"etary\n") == b"secretary\n"  # not the value after all
    assert mask.feed(b"sec") == b""
    assert mask.flush() == b"sec"


def test_non_ascii_values_match_as_utf8() -> None:
    value = "pässwörd-ключ"
    text = f"[{value}]".encode()
    for cut in range(1, len(text)):
        assert stream([value], chunked(text, [cut])) == b"[(sensitive)]"


@pytest.mark.parametrize("seed", range(300))
def test_streaming_equals_masking_the_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab-\n"
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(3)]
    pieces = [rng.choice([*values, *alphabet]) for _ in range(rng.randint(0, 60))]
    text = "".join(pieces).encode()
    cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 8))]
    assert stream(values, chunked(text, cuts)) == reference(text, values), (values, text, cuts)


def test_masked_log_masks_each_stream_and_holds_the_cursor(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "logs", 1 << 20)
    log = MaskedLog(store, ["hunter2-secret"])
    log.append(b"out: hunter2-", "c1", "out")
    assert store.cursor is None  # bytes held back: the cursor must not vouch for them
    log.append(b"err line\n", "c2", "err")  # the other stream writes in between
    assert store.cursor is None
    log.append(b"secret done\n", "c3", "out")
    assert store.cursor == "c3"
    log.append(b"tail hun", "c4", "out")
    log.flush()
    assert store.cursor == "c4"
    _, data = store.read(0, 1 << 20)
    assert data == b"out: err line\n(sensitive) done\ntail hun"


def test_masked_log_without_values_writes_through(tmp_path: Path) -> None:
    store = LogStore(tmp_path / "logs", 1 << 20)
    log = MaskedLog(store, ["abc"])  # too short to mask
    log.append(b"abc", "c1")
    assert store.cursor == "c1"
    assert store.read(0, 100)[1] == b"abc"
    log.set_values(["abcdef"])
    log.append(b" abcdef\n")
    assert store.read(0, 100)[1] == b"abc (sensitive)\n"


def test_spec_secret_values_and_a_record_holds_none() -> None:
    spec = parse_job_spec(
        {
            "run_name": "r",
            "commands": ["true"],
            "env": {"TOKEN": "value-1234", "PLAIN": "visible"},
            "secret_env": ["TOKEN"],
        }
    )
    assert spec.secret_values() == ["value-1234"]
    assert parse_job_spec(spec.to_dict(redact=True)).secret_values() == []
