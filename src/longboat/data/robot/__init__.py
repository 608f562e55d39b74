"""Robot data: LeRobot datasets (read v3.0 and v2.1, write v3.0), their statistics, and the transforms
(``longboat.data.robot.transforms``) a policy trains and serves with."""

from longboat.data.robot.dataset import RobotDataset
from longboat.data.robot.encode import VideoOptions
from longboat.data.robot.errors import RobotDataError, UnknownFeatureError, VideoDecodeError
from longboat.data.robot.meta import DatasetMeta
from longboat.data.robot.split import split_episodes
from longboat.data.robot.writer import RobotDatasetWriter

__all__ = [
    "DatasetMeta", "RobotDataError", "RobotDataset", "RobotDatasetWriter", "UnknownFeatureError", "VideoDecodeError",
    "VideoOptions", "split_episodes",
]
