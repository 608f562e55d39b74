"""Caption embeddings encoded once and cached: safetensors shards of per-caption embeddings and masks in a folder
named by a hash of the caption set and the text encoder's fingerprint (weights, tokenizer files, settings).

A changed caption or encoder names another folder and is encoded; an unchanged one is read back and never encoded
again. The folder is written under a temporary name and renamed, so a reader never sees a partial cache and
several ranks building at once keep the first finished copy. The empty caption is always in the set: its embedding
is the null condition classifier-free guidance trains and samples with.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

from longboat.config.base import ConfigError
from longboat.utils.outputs import cache_directory

NULL_CAPTION = ""
SHARD_CAPTIONS = 4096  # captions per shard file
CAPTIONS_FILE = "captions.json"


class CaptionEncoder(Protocol):
    def fingerprint(self) -> str: ...
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class CaptionTable:
    """Unique captions with their embeddings [U, L, D] and masks [U, L]; ``row`` maps a caption to its index."""

    captions: list[str]
    embeddings: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self):
        self.row = {c: i for i, c in enumerate(self.captions)}

    def rows(self, captions: list[str]) -> torch.Tensor:
        return torch.tensor([self.row[c] for c in captions], dtype=torch.long)

    @property
    def null(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The empty caption's (embeddings [L, D], mask [L])."""
        i = self.row[NULL_CAPTION]
        return self.embeddings[i], self.mask[i]


def caption_key(captions: list[str], fingerprint: str) -> str:
    h = hashlib.sha256(fingerprint.encode())
    h.update(json.dumps(captions, ensure_ascii=False).encode())
    return h.hexdigest()[:32]


def caption_table(encoder: CaptionEncoder, captions: list[str], cache_dir: str | os.PathLike) -> CaptionTable:
    """The table of ``captions`` (plus the empty one), from ``cache_dir/text-<key>`` or encoded and saved there."""
    unique = sorted(set(captions) | {NULL_CAPTION})
    final = Path(cache_dir) / f"text-{caption_key(unique, encoder.fingerprint())}"
    if final.is_dir():
        return _read(final, unique)
    embeddings, mask = encoder.encode(unique)
    with cache_directory(final) as tmp:
        for shard, start in enumerate(range(0, len(unique), SHARD_CAPTIONS)):
            end = start + SHARD_CAPTIONS
            save_file({"embeddings": embeddings[start:end].contiguous(), "mask": mask[start:end].contiguous()},
                      str(tmp / f"shard-{shard:05d}.safetensors"))
        (tmp / CAPTIONS_FILE).write_text(json.dumps(unique, ensure_ascii=False))
    return CaptionTable(unique, embeddings, mask)


def _read(folder: Path, unique: list[str]) -> CaptionTable:
    try:
        stored = json.loads((folder / CAPTIONS_FILE).read_text())
        shards = [load_file(str(p)) for p in sorted(folder.glob("shard-*.safetensors"))]
    except (OSError, ValueError, SafetensorError) as e:
        raise ConfigError(f"{folder}: unreadable caption cache ({e}); delete the folder to encode again") from None
    if stored != unique or not shards:
        raise ConfigError(f"{folder}: the caption cache does not hold the captions its name promises; delete the "
                          "folder to encode again")
    return CaptionTable(unique, torch.cat([s["embeddings"] for s in shards]), torch.cat([s["mask"] for s in shards]))


def default_cache_dir(source: str) -> Path:
    """Caption caches beside a source file or folder, else (a named source) in the user's cache folder."""
    path = Path(source)
    if path.exists():
        return (path.parent if path.is_file() else path) / "text_cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longboat" / "text_embeddings"


class Captioned(Dataset):
    """The items of ``samples`` (images, latents or any positioned set) with their caption's embeddings and mask,
    ``text`` [L, D] and ``text_mask`` [L], from ``table``."""

    positioned = True  # the loader calls __getitem__((row, position)), passed on to ``samples``

    def __init__(self, samples: Dataset, captions: list[str], table: CaptionTable):
        self.samples, self.table, self.rows = samples, table, table.rows(captions)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int | tuple[int, int]) -> dict:
        row = index[0] if isinstance(index, tuple) else index
        i = self.rows[row]
        return {**self.samples[index], "text": self.table.embeddings[i], "text_mask": self.table.mask[i]}
