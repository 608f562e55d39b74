"""Robot data: LeRobot datasets (read v3.0 and v2.1, write v3.0), their statistics, and the transforms
(``longboat.data.robot.transforms``) a policy trains and serves with.

The names below load on first use, so a process that only needs a submodule (the recorder in
``longboat.sim`` importing the writer) does not pay for torch and the dataset reader.
"""

from longboat.utils.lazy import lazy_exports

_EXPORTS = {
    "DatasetMeta": "meta", "RobotDataError": "errors", "RobotDataset": "dataset", "RobotDatasetWriter": "writer",
    "UnknownFeatureError": "errors", "VideoDecodeError": "errors", "VideoOptions": "encode", "split_episodes": "split",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
