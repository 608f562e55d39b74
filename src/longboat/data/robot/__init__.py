"""Robot data: LeRobot datasets (read v3.0 and v2.1, write v3.0), their statistics, and the transforms
(``longboat.data.robot.transforms``) a policy trains and serves with.

The names below load on first use, so a process that only needs a submodule (a simulator worker importing
``longboat.data.robot.record``) does not pay for torch and the dataset reader.
"""

from importlib import import_module

_EXPORTS = {
    "DatasetMeta": "meta", "RobotDataError": "errors", "RobotDataset": "dataset", "RobotDatasetWriter": "writer",
    "UnknownFeatureError": "errors", "VideoDecodeError": "errors", "VideoOptions": "encode", "split_episodes": "split",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
