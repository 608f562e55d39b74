"""Recording demonstrations: scripted experts in simulators (MuJoCo, pymunk) write LeRobot v3.0 datasets."""

from longboat.data.robot.record import fetch_env, metaworld_env, pusht_env  # noqa: F401  (register the simulators)
from longboat.data.robot.record.env import SimEnv
from longboat.data.robot.record.errors import RecordError
from longboat.data.robot.record.recorder import EnvResult, RecordResult, record
from longboat.data.robot.record.registry import known_envs, make_env, register_simulator

__all__ = ["EnvResult", "RecordError", "RecordResult", "SimEnv", "known_envs", "make_env", "record",
           "register_simulator"]
