"""`type: preset` — what dstack's preset agent is asked to find: a model and its serving targets.

In dstack 0.22.5 `dstack apply` of a preset starts a coding agent (claude or codex) that tries
service configurations for `model` on the project's fleets, benchmarks them against the
targets below, and stores the best one as a verified preset. dstack-plan has no such agent:
it loads and checks preset files, so a dstack project with presets loads unchanged, but a
preset is a configuration, not a resource — `plan` and `apply` never create, change or delete
one (see `Desired.presets`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dstack_plan.config.base import (
    Described,
    DstackName,
    FieldConflict,
    Strict,
    null_in_schema,
)
from dstack_plan.config.env import Env
from dstack_plan.config.profile import EntityRef, ProfileParams

__all__ = ["PresetSpec"]

DEFAULT_INPUT_TOKENS = 1024
"""Input tokens per benchmark request when `input_tokens` is unset (dstack's default)."""
MAX_PROMPT_LENGTH = 10_000

PositiveInt = Annotated[int, Field(ge=1)]


def _model_name(value: Any, what: str) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{what} must not be empty")
    return value


class ModelRepo(Strict):
    """`model: {repo, name}`: exactly this repo or path; `name` is what clients ask for."""

    _described: ClassVar[Described] = Described("a model {repo, name} or {base}")
    repo: str
    name: str | None = None

    @field_validator("repo", "name")
    @classmethod
    def _not_blank(cls, value: Any) -> Any:
        return _model_name(value, "a model repo or path")


class ModelBase(Strict):
    """`model: {base}`: this base model or a compatible variant the agent chooses."""

    _described: ClassVar[Described] = Described("a model {repo, name} or {base}")
    base: str

    @field_validator("base")
    @classmethod
    def _not_blank(cls, value: Any) -> Any:
        return _model_name(value, "a base model")


class PromptFile(Strict):
    """`prompt: {path}`: the agent's extra instructions, from a file beside the config."""

    path: str

    @field_validator("path")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt path must not be empty")
        return value


class PresetAgent(Strict):
    """`agent:`: which agent CLI would create the preset, with which model and effort."""

    provider: Literal["claude", "codex"]
    model: str | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None

    @model_validator(mode="after")
    def _effort(self) -> PresetAgent:
        if self.provider == "codex" and self.effort == "max":
            raise FieldConflict("effort 'max' needs provider claude, not codex", "effort")
        return self


def _model_shorthand(value: Any) -> Any:
    # a blank repo is refused by ModelRepo, at the `model` key
    return {"repo": value} if isinstance(value, str) else value


def _preset_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    null_in_schema(schema, model)
    # `base:` or `repo:` may stand for `model:`, which a schema cannot say more simply
    required = [key for key in schema.get("required", ()) if key != "model"]
    if required:
        schema["required"] = required
    else:
        schema.pop("required", None)


class PresetSpec(ProfileParams):
    """A preset: the profile fields (placement and policies of the runs the agent would
    start) and what to serve and how well."""

    model_config = ConfigDict(defer_build=True, json_schema_extra=_preset_schema)

    type: Literal["preset"] = "preset"
    name: DstackName | None = None
    model: Annotated[
        ModelRepo | ModelBase,
        Field(union_mode="left_to_right"),
        Described("a model repo such as Qwen/Qwen3-8B, {repo, name} or {base}"),
    ]
    base: str | None = None
    """Shorthand for `model: {base: ...}`."""
    repo: str | None = None
    """Shorthand for `model: {repo: ...}`."""
    prompt: str | PromptFile | None = None
    min_context_length: PositiveInt | None = None
    max_ttft: PositiveInt | None = None
    """Highest p50 time to first token, in milliseconds."""
    trials: PositiveInt | None = None
    previous: tuple[str, ...] | None = None
    concurrency: PositiveInt | None = None
    input_tokens: PositiveInt | None = None
    output_tokens: Annotated[int, Field(ge=2)] | None = None
    shared_prefix_tokens: Annotated[int, Field(ge=0)] | None = None
    dataset: str | None = None
    baseline: bool | None = None
    gateway: bool | EntityRef | None = None
    agent: PresetAgent | None = None
    env: Env = {}

    null_kept: ClassVar[frozenset[str]] = frozenset({"env"})  # dstack refuses a null env

    @model_validator(mode="before")
    @classmethod
    def _model_from_shorthand(cls, data: Any) -> Any:
        # `base:` / `repo:` at the top level stand for `model:`; validation sees only `model`
        if not isinstance(data, dict):
            return data
        base, repo = data.get("base"), data.get("repo")
        if base and repo:
            raise FieldConflict("'base' and 'repo' are mutually exclusive", "repo")
        if base or repo:
            if data.get("model") is not None:
                raise FieldConflict(
                    "'model' cannot be combined with the 'base'/'repo' shorthand", "model"
                )
            key = "base" if base else "repo"
            if isinstance(data[key], str) and not data[key].strip():
                raise FieldConflict(f"{key} must not be empty", key)
            data = {k: v for k, v in data.items() if k not in ("base", "repo")}
            data["model"] = {"base": base} if base else {"repo": repo}
        elif "model" in data:
            data = {**data, "model": _model_shorthand(data["model"])}
        return data

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str | PromptFile | None) -> str | PromptFile | None:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("prompt must not be empty")
            if len(value) > MAX_PROMPT_LENGTH:
                raise ValueError(f"prompt must be at most {MAX_PROMPT_LENGTH} characters")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value:
            raise ValueError("dataset must not be empty (omit it for synthetic prompts)")
        if value == "random":
            raise ValueError("'random' is not a dataset: omit dataset for synthetic prompts")
        return value

    @model_validator(mode="after")
    def _request_shape(self) -> PresetSpec:
        shaped = [
            key
            for key in ("input_tokens", "output_tokens", "shared_prefix_tokens")
            if getattr(self, key) is not None
        ]
        if self.dataset is not None and shaped:
            raise FieldConflict(
                f"{', '.join(shaped)} shape synthetic prompts: not with 'dataset', which "
                "defines its own requests",
                *shaped,
            )
        if self.shared_prefix_tokens is not None:
            input_tokens = self.input_tokens or DEFAULT_INPUT_TOKENS
            if self.shared_prefix_tokens >= input_tokens:
                raise FieldConflict(
                    f"shared_prefix_tokens must be less than input_tokens ({input_tokens})",
                    "shared_prefix_tokens",
                )
        return self
