"""``policy.json``: what a policy export tells whoever serves or evaluates it, read as a typed, checked manifest.

The policy task writes it beside the weights: the features the policy reads (as stored and as the model sees them),
the action it writes, the observation keys expected on the wire, fps, tasks and prompt length. An export may come
from anyone, so what is read of it is validated here, once, and a malformed manifest is one error naming the file
and the key instead of a ``KeyError`` deep in the server.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator

from longboat.config.base import ConfigError, validate
from longboat.utils.json_files import parse_json

POLICY_SPEC = "policy.json"
POLICY_SPEC_VERSION = 1


class _Open(BaseModel):
    """Keys this reader does not use are kept, not refused: a newer writer may add some."""

    model_config = ConfigDict(extra="allow")


class FeatureInfo(_Open):
    shape: list[int] = Field(min_length=1)
    dtype: str | None = None
    model_shape: list[int] | None = None

    @field_validator("shape", "model_shape")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(n < 1 for n in value):
            raise ValueError(f"sizes must be positive, got {value}")
        return value


class PromptInfo(_Open):
    max_prompt_len: int = Field(gt=0)
    suffix: str = ""  # appended to a prompt lacking it before tokenising (SmolVLA's newline)


class PolicyManifest(_Open):
    format_version: int = POLICY_SPEC_VERSION
    fps: float | None = None
    robot_type: str | None = None
    horizon: int | None = Field(default=None, gt=0)
    n_obs_steps: int = Field(default=1, gt=0)
    input_features: dict[str, FeatureInfo] = Field(default_factory=dict)
    output_features: dict[str, FeatureInfo] = Field(default_factory=dict)
    wire_keys: dict[str, str]
    tasks: list[str] = Field(default_factory=list)
    prompt: PromptInfo | None = None

    @field_validator("fps")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"expected a finite positive number, got {value}")
        return value


def read_policy_manifest(content: bytes | str, source: str) -> dict:
    """The manifest in ``content`` (the bytes of ``source``), checked; as a plain dict, extra keys kept."""
    data = parse_json(content, source, ConfigError)
    if isinstance(data, dict) and data.get("format_version", POLICY_SPEC_VERSION) != POLICY_SPEC_VERSION:
        raise ConfigError(f"{source}: format_version {data['format_version']!r} is not one this longboat reads "
                          f"({POLICY_SPEC_VERSION})")
    return validate(PolicyManifest, data, source).model_dump(exclude_none=False)
