"""The errors a user can act on: the command line prints their message alone, without a traceback."""

from longboat.checkpoint.dcp import CheckpointError
from longboat.checkpoint.export import ExportError
from longboat.config.base import ConfigError
from longboat.data.gpt import GPTDatasetError
from longboat.data.indexed import IndexedDataError
from longboat.data.tokenizer import TokenizerError
from longboat.models.llm.hf import HFConversionError
from longboat.trainer.trainer import TrainingError

USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    IndexedDataError,
    GPTDatasetError,
    TokenizerError,
    CheckpointError,
    ExportError,
    HFConversionError,
    TrainingError,
    FileNotFoundError,
)
