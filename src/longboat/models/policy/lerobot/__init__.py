"""LeRobot policy directories in and out: importing this package registers the converters (act, diffusion)."""

from longboat.models.policy.lerobot import act, diffusion  # noqa: F401  (register "act", "diffusion")
from longboat.models.policy.lerobot.common import (ORIGINAL_CONFIG, LeRobotPolicy, is_lerobot_dir,
                                                   lerobot_manifest, lerobot_source, read_lerobot)
from longboat.models.policy.lerobot.registry import CONVERTERS, LeRobotError, converter_for_arch
from longboat.models.policy.lerobot.writer import write_lerobot

__all__ = ["CONVERTERS", "ORIGINAL_CONFIG", "LeRobotError", "LeRobotPolicy", "converter_for_arch",
           "is_lerobot_dir", "lerobot_manifest", "lerobot_source", "read_lerobot", "write_lerobot"]
