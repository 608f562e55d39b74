"""Simulators (MuJoCo, pymunk) with scripted experts, by name: evaluation steps them, and recording writes their
experts' demonstrations into LeRobot v3.0 datasets."""

from longboat.sim import fetch_env, metaworld_env, pusht_env  # noqa: F401  (register the simulators)
from longboat.sim.env import SimEnv
from longboat.sim.errors import RenderError, SimError
from longboat.sim.registry import known_envs, make_env, register_simulator
from longboat.utils.lazy import lazy_exports

# The recorder (parquet and video writers) loads on first use: an evaluation's env worker imports this package for
# the simulators alone and would pay for pyarrow and av at every start.
_RECORDER = ("EnvResult", "RecordError", "RecordResult", "record")
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_RECORDER, "recorder"))

__all__ = ["EnvResult", "RecordError", "RecordResult", "RenderError", "SimEnv", "SimError", "known_envs", "make_env",
           "record", "register_simulator"]
