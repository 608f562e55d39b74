"""Robot policies: the shared contract (``base``), keyed randomness, and one folder per policy family."""

from longboat.models.policy.base import Policy, PolicyConfig
from longboat.models.generative.keyed_random import keyed_normal, keyed_randint, keyed_uniform, noise_key
from longboat.models.policy import act, diffusion, flow_vla, mlp  # noqa: F401  (each registers its architecture)

__all__ = ["Policy", "PolicyConfig", "keyed_normal", "keyed_randint", "keyed_uniform", "noise_key"]
