"""Tasks: what a training step computes. Importing this package registers every task."""

from longboat.tasks import diffusion, policy, preference, pretrain, sft  # noqa: F401  (register every task)
from longboat.tasks.base import Task, TaskData, fill_from_data, get_task, register_task

__all__ = ["Task", "TaskData", "fill_from_data", "get_task", "register_task"]
