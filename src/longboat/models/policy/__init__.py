"""Robot policies: the shared contract (``base``), keyed randomness, and one folder per policy family."""

from longboat.models.policy.base import Policy, PolicyConfig
from longboat.models.policy.keyed_random import keyed_normal, keyed_randint, keyed_uniform, noise_key
from longboat.models.policy import mlp  # noqa: F401  (registers "mlp"; one line per policy family)
from longboat.models.policy import flow_vla  # noqa: F401  (registers "flow_vla")

__all__ = ["Policy", "PolicyConfig", "keyed_normal", "keyed_randint", "keyed_uniform", "noise_key"]
