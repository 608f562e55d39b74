"""Recording demonstrations: scripted experts in simulators (MuJoCo, pymunk) write LeRobot v3.0 datasets."""

from longboat.data.robot.record import fetch_env, metaworld_env, pusht_env  # noqa: F401  (register the simulators)
from longboat.data.robot.record.env import SimEnv
from longboat.data.robot.record.errors import RecordError
from longboat.data.robot.record.registry import known_envs, make_env, register_simulator
from longboat.utils.lazy import lazy_exports

# The recorder (parquet and video writers) loads on first use: an evaluation's env worker imports this package for
# the simulators alone and would pay for pyarrow and av at every start.
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(("EnvResult", "RecordResult", "record"), "recorder"))

__all__ = ["EnvResult", "RecordError", "RecordResult", "SimEnv", "known_envs", "make_env", "record",
           "register_simulator"]
