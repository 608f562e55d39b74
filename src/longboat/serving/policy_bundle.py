"""A trained policy ready to act: the model, its transform pipeline and ``policy.json``, from an opened export, run
directory or checkpoint, with nothing else at hand (the dataset it was trained on may be gone).

The caller opens the artifact (``recipes.artifact.open_artifact``: run directories, plugins, checkpoints) and hands
it over; what is read here is only what any opened artifact has: its model, config, assets and source.

``act`` maps raw observations (keyed by dataset features, in robot units) to action chunks in robot units: the
pipeline as in training (evaluation mode), the prompt tokenized when the policy reads one, ``predict``, then the
pipeline's inverse. A policy server calls this per batch of requests; action queues live in the client.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from longboat.checkpoint.export import ExportError
from longboat.data.robot.prompts import PromptTokens
from longboat.data.robot.transforms import Pipeline, pipeline_from_assets
from longboat.data.robot.transforms.export import TRANSFORMS_CONFIG, TRANSFORMS_STATS
from longboat.data.tokenizer import TOKENIZER_FILE, TOKENIZER_FILES, Tokenizer
from longboat.errors import LongboatError
from longboat.models.policy.base import Policy, PolicyConfig, observation_keys
from longboat.models.policy.manifest import POLICY_SPEC, read_policy_manifest


class ObservationError(LongboatError, ValueError):
    """An observation lacks a key the policy reads; the message names it and the keys that came."""


@dataclass
class PolicyBundle:
    policy: Policy  # in eval mode
    config: PolicyConfig
    pipeline: Pipeline  # in eval mode
    spec: dict  # policy.json
    prompts: PromptTokens | None
    source: Path

    @property
    def wire_keys(self) -> dict[str, str]:
        return dict(self.spec["wire_keys"])

    def from_wire(self, observation: dict) -> dict:
        """An observation keyed as on the wire, keyed by dataset features (``task`` kept; other keys dropped)."""
        out = {feature: observation[wire] for wire, feature in self.wire_keys.items() if wire in observation}
        missing = sorted(wire for wire in self.wire_keys if wire not in observation)
        if missing:
            raise ObservationError(f"the observation lacks {missing}, which {self.source} reads (it has: "
                                   f"{', '.join(sorted(observation))})")
        if "task" in observation:
            out["task"] = observation["task"]
        return out

    @torch.no_grad()
    def act(self, observation: dict, noise_key: torch.Tensor | None = None) -> torch.Tensor:
        """Action chunks [B, horizon, A] in robot units for raw observations: cameras float [B, T, C, H, W] in
        [0, 1], state [B, T, S] (T = n_obs_steps), and ``task`` (B prompts) when the policy reads prompts."""
        cfg = self.config
        missing = [key for key in observation_keys(cfg) if key not in observation]
        if missing:
            raise ObservationError(f"the observation lacks {missing}, which {self.source} reads (it has: "
                                   f"{', '.join(sorted(observation))})")
        raw = {key: observation[key] for key in observation_keys(cfg)}
        obs = self.pipeline.apply(raw)
        if self.prompts is not None:
            tokens, mask = self.prompts.batch(list(observation["task"]))
            device = next(self.policy.parameters()).device  # the tokenizer's ids are made on the CPU
            obs["prompt_tokens"], obs["prompt_mask"] = tokens.to(device), mask.to(device)
        if "task" in observation:
            obs["task"] = list(observation["task"])
        chunk = self.policy.predict(obs, noise_key=noise_key).float()
        context = {cfg.state_feature: obs[cfg.state_feature]} if cfg.state_feature is not None else {}
        return self.pipeline.unapply({**context, cfg.action_feature: chunk})[cfg.action_feature]


def _asset_bytes(artifact, name: str) -> bytes:
    value = artifact.assets.get(name)
    if value is None:
        raise ExportError(f"{artifact.source}: no {name}; it is not a policy trained by longboat's policy task")
    return value.read_bytes() if isinstance(value, Path) else value


def open_policy(artifact) -> PolicyBundle:
    """The policy of an opened artifact (``recipes.artifact.Artifact``: an export, a run directory's export, else its
    newest checkpoint, or a checkpoint)."""
    if not isinstance(artifact.model, Policy):
        raise ExportError(f"{artifact.source}: holds a '{artifact.arch}' model, not a policy")
    spec = read_policy_manifest(_asset_bytes(artifact, POLICY_SPEC), f"{artifact.source}/{POLICY_SPEC}")
    pipeline = pipeline_from_assets(_asset_bytes(artifact, TRANSFORMS_CONFIG), _asset_bytes(artifact, TRANSFORMS_STATS),
                                    f"{artifact.source}/{TRANSFORMS_CONFIG}")
    prompts = None
    if spec.get("prompt") is not None:
        prompts = PromptTokens(_tokenizer(artifact), spec["prompt"]["max_prompt_len"], spec["prompt"].get("suffix", ""))
    return PolicyBundle(artifact.model, artifact.config, pipeline, spec, prompts, artifact.source)


def _tokenizer(artifact) -> Tokenizer:
    """The artifact's tokenizer: the export's files, or a checkpoint's (held as bytes) read through a scratch dir."""
    value = artifact.assets.get(TOKENIZER_FILE)
    if isinstance(value, Path):
        return Tokenizer(value.parent)
    with tempfile.TemporaryDirectory(prefix="longboat-tokenizer-") as scratch:
        for name in TOKENIZER_FILES:
            content = artifact.assets.get(name)
            if isinstance(content, bytes):
                (Path(scratch) / name).write_bytes(content)
        return Tokenizer(scratch)
