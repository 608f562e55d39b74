"""Reading DCP checkpoints without running code from them.

DCP pickles in two places: the ``.metadata`` file (read by ``FileSystemReader.read_metadata`` with a plain
``pickle.load``) and every non-tensor value of the state, such as scheduler state and optimizer param groups
(read by ``DefaultLoadPlanner.load_bytes`` with ``torch.load(weights_only=False)``). ``SafeFileSystemReader``
unpickles the metadata with an allow-list of the classes DCP metadata is made of, and ``SafeLoadPlanner`` reads
the values with ``torch.load(weights_only=True)``. ``load_dcp`` is the one DCP load longboat makes.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

from longboat.checkpoint.errors import CheckpointError

# What the ``.metadata`` of a DCP checkpoint is made of: DCP's own dataclasses (metadata.py, filesystem.py) and
# the torch and pathlib values they hold. Found by reading those modules and by logging ``find_class`` while
# unpickling the metadata of checkpoints written by longboat (format 1 and 2, language models and policies).
_METADATA_CLASSES = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),  # TensorProperties' memory format
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how torch pickles a torch.layout: a lookup by its name
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib._local", "PosixPath"),  # the same class as Python 3.13 names it
})


def _is_dtype(module: str, name: str) -> bool:
    """Whether ``module.name`` is a torch dtype (pickled as a global such as ``torch.float32``)."""
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only the classes of ``_METADATA_CLASSES`` and torch dtypes."""

    def __init__(self, file: io.BufferedIOBase, source: Path):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES or _is_dtype(module, name):
            return super().find_class(module, name)
        raise CheckpointError(f"{self.source}: refused to unpickle {module}.{name}, which is not part of DCP "
                              "checkpoint metadata (the file was not written by DCP, or was tampered with)")


def read_metadata(path: str | os.PathLike, rank: int | None = None) -> Metadata:
    """The DCP metadata of checkpoint ``path`` (``.metadata``, or ``__<rank>.metadata``), unpickled safely."""
    file = Path(path) / (".metadata" if rank is None else f"__{rank}.metadata")
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f, file).load()
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing; not a DCP checkpoint") from None
    except Exception as e:  # truncated or corrupt: pickle raises many kinds
        raise CheckpointError(f"{file}: unreadable DCP metadata ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{file}: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled through the allow-list of ``read_metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self.path, kwargs.get("rank"))
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _reason(e: BaseException) -> str:
    """What went wrong, in a line: for ``torch.load(weights_only=True)``, its unpickler's own reason."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # torch goes on to suggest allow-listing the refused global; for a checkpoint that is the wrong advice.
    first = lines[0].split(" Please use", 1)[0] if lines else ""
    return f"{type(e).__name__}: {first}"


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor values with ``torch.load(weights_only=True)``."""

    def __init__(self, source: str | os.PathLike, allow_partial_load: bool = False):
        super().__init__(allow_partial_load=allow_partial_load)
        self.source = source

    def create_local_plan(self) -> LoadPlan:
        try:
            return super().create_local_plan()
        except RuntimeError as e:
            if not str(e).startswith("Missing key in checkpoint"):
                raise
            raise CheckpointError(f"{self.source}: {self._missing()}") from None

    def _missing(self) -> str:
        """Which tensor the checkpoint lacks and, when it holds others beside it, their names: a renamed layout."""
        saved = set(self.metadata.state_dict_metadata)
        missing = sorted(k for k in self.state_dict if k not in saved)
        parent = missing[0].rpartition(".")[0]
        ours = sorted(k.rpartition(".")[2] for k in missing if k.rpartition(".")[0] == parent)
        theirs = sorted(k.rpartition(".")[2] for k in saved - set(self.state_dict) if k.rpartition(".")[0] == parent)
        text = f"no tensor {missing[0]} ({len(missing)} missing in all)"
        if theirs:
            text += (f"; at {parent} this model has {', '.join(ours)} where the checkpoint has {', '.join(theirs)}: "
                     "written by a model, or a longboat version, that names these tensors differently")
        return text

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            if "Unsupported global" in str(e):
                raise CheckpointError(f"{self.source}: refused to load {fqn}, a non-tensor value that is not plain "
                                      f"data (checkpoints are read without running code): {_reason(e)}") from None
            raise CheckpointError(f"{self.source}: {fqn} could not be read ({_reason(e)})") from None
        except Exception as e:
            raise CheckpointError(f"{self.source}: {fqn} could not be read ({_reason(e)})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _first_failure(e: CheckpointException) -> BaseException:
    """The exception behind DCP's per-rank failure report: this rank's, else the first rank's."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    failures = e.failures
    if rank in failures:
        return failures[rank][0]
    return next(iter(failures.values()))[0] if failures else e


def load_dcp(state: dict[str, Any], path: str | os.PathLike, allow_partial_load: bool = False) -> None:
    """``dcp.load`` of checkpoint ``path`` into ``state``, reading nothing that runs code.

    Every failure (a refused class, a damaged file, a state that does not match) is a ``CheckpointError``
    naming the checkpoint.
    """
    path = Path(path)
    # Read once up front so that a refused or damaged .metadata fails here, clearly, rather than inside DCP
    # (which would log it and fall back to per-rank metadata files that do not exist).
    read_metadata(path)
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(path),
                 planner=SafeLoadPlanner(path, allow_partial_load=allow_partial_load))
    except CheckpointError:
        raise
    except CheckpointException as e:  # a BaseException: raised by DCP on any rank's failure
        cause = _first_failure(e)
        if isinstance(cause, CheckpointError):
            raise cause from None
        raise CheckpointError(f"{path}: could not be loaded ({_reason(cause)})") from None
    except Exception as e:
        raise CheckpointError(f"{path}: could not be loaded ({_reason(e)})") from None


__all__ = ["SafeFileSystemReader", "SafeLoadPlanner", "load_dcp", "read_metadata"]
