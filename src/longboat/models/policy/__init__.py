"""Robot policies: the shared contract (``base``), keyed randomness, one folder per policy family, and LeRobot's
policy directories in and out (``lerobot``, reached from outside models/ through the names re-exported here)."""

from longboat.models.policy.base import Policy, PolicyConfig
from longboat.models.generative.keyed_random import keyed_normal, keyed_randint, keyed_uniform, noise_key
from longboat.models.policy import act, diffusion, flow_vla, mlp  # noqa: F401  (each registers its architecture)
from longboat.models.policy.lerobot import (LeRobotError, is_lerobot_dir, lerobot_manifest, lerobot_source,
                                            read_lerobot,
                                            write_lerobot)

__all__ = ["LeRobotError", "Policy", "PolicyConfig", "is_lerobot_dir", "keyed_normal", "keyed_randint",
           "keyed_uniform", "lerobot_manifest", "lerobot_source", "noise_key", "read_lerobot", "write_lerobot"]
