"""Tasks: what a training step computes. Importing this package registers every task."""

from longboat.tasks import pretrain  # noqa: F401  (registers "pretrain")
from longboat.tasks.registry import TaskParts, get_task, register_task, task_names

__all__ = ["TaskParts", "get_task", "register_task", "task_names"]
