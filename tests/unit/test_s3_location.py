"""`s3://` state URLs: parsed into an S3Location, refused with a clear reason, round-tripped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstack_plan.errors import StateError
from dstack_plan.state.s3_location import S3Location


def test_full_url() -> None:
    where = S3Location.from_url(
        "s3://team-bucket/envs/prod/state.json?region=eu-west-1"
        "&endpoint_url=http://127.0.0.1:5055&profile=ci&kms_key_id=alias/state"
    )
    assert where == S3Location(
        bucket="team-bucket",
        key="envs/prod/state.json",
        region="eu-west-1",
        endpoint_url="http://127.0.0.1:5055",
        profile="ci",
        kms_key_id="alias/state",
    )
    assert where.object_url == "s3://team-bucket/envs/prod/state.json"
    assert S3Location.from_url(where.url()) == where


def test_plain_url_has_no_query() -> None:
    where = S3Location.from_url("s3://bucket.example/state.json")
    assert where.region is None and where.url() == "s3://bucket.example/state.json"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("s3://bucket/", "no object key"),
        ("s3://bucket", "no object key"),
        ("s3://bucket/dir/", "no object key"),
        ("s3://bucket/a//b.json", "empty, '.' or '..'"),
        ("s3://bucket/../b.json", "empty, '.' or '..'"),
        ("s3://Bad_Bucket/state.json", "invalid bucket name"),
        ("s3://ab/state.json", "invalid bucket name"),
        ("s3://192.168.1.1/state.json", "invalid bucket name"),
        ("s3://bucket/s.json?regoin=x", "unknown query parameter 'regoin'"),
        ("s3://bucket/s.json?region=a&region=b", "given twice"),
        ("s3://bucket/s.json?region=", "is empty"),
        ("https://bucket/s.json", "not an S3 state URL"),
        ("s3://bucket/s.json#frag", "fragment"),
    ],
)
def test_refused_with_reason(url: str, reason: str) -> None:
    with pytest.raises(StateError) as info:
        S3Location.from_url(url)
    assert reason in str(info.value)
    assert url.split("?")[0].split("#")[0] in str(info.value)


def test_credentials_in_userinfo_refused_and_not_echoed() -> None:
    with pytest.raises(StateError) as info:
        S3Location.from_url("s3://AKIAEXAMPLE:wJalrSECRET@bucket/state.json")
    message = str(info.value)
    assert "credentials in the URL are refused" in message
    assert "AKIAEXAMPLE" not in message and "wJalrSECRET" not in message


@pytest.mark.parametrize(
    "name", ["aws_secret_access_key", "access_key", "session_token", "password", "token"]
)
def test_secret_looking_parameters_refused_and_not_echoed(name: str) -> None:
    with pytest.raises(StateError) as info:
        S3Location.from_url(f"s3://bucket/state.json?{name}=hunter2value")
    assert "credentials never go in the URL" in str(info.value)
    assert "hunter2value" not in str(info.value)


_segment = st.text(alphabet="abcXYZ019-_. +=é", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..")
)


@given(
    key=st.lists(_segment, min_size=1, max_size=4).map("/".join),
    region=st.none() | st.sampled_from(["us-east-1", "eu-west-1"]),
    endpoint=st.none() | st.sampled_from(["http://127.0.0.1:9000", "https://s3.example/x?y"]),
    kms=st.none() | st.sampled_from(["alias/a b", "arn:aws:kms:us-east-1:1:key/k&=1"]),
)
def test_url_round_trip(
    key: str, region: str | None, endpoint: str | None, kms: str | None
) -> None:
    where = S3Location("my-bucket", key, region=region, endpoint_url=endpoint, kms_key_id=kms)
    assert S3Location.from_url(where.url()) == where
