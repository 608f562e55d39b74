"""Sample and blend indices cached as ``.npy`` files in a directory named by a hash of what they depend on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import numpy as np

from longboat.errors import LongboatError
from longboat.utils.outputs import cache_directory


class IndexCacheError(LongboatError, ValueError):
    """A cache directory exists but its arrays cannot be read."""


def cache_key(description: dict) -> str:
    """Stable short hash of a JSON-able description (names the cache directory)."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:32]


def cached_arrays(
    cache_dir: str | os.PathLike | None,
    kind: str,
    description: dict,
    build: Callable[[], dict[str, np.ndarray]],
    note: dict | None = None,
) -> tuple[dict[str, np.ndarray], bool]:
    """Load ``kind-<hash of description>/*.npy`` or build and save them; returns (arrays, cache_hit).

    ``description`` holds everything the arrays depend on; ``note`` is only written beside them for people.

    The directory is written under a temporary name and renamed, so readers never see a partial one and
    concurrent builders (several ranks) simply keep the first finished copy.
    """
    if cache_dir is None:
        return build(), False
    final = Path(cache_dir) / f"{kind}-{cache_key(description)}"
    if final.is_dir():
        try:
            arrays = {p.stem: np.load(p, mmap_mode="r") for p in sorted(final.glob("*.npy"))}
        except (OSError, ValueError) as err:
            raise IndexCacheError(f"{final}: unreadable index cache ({err}); delete the directory to rebuild") from None
        if not arrays:
            raise IndexCacheError(f"{final}: index cache holds no arrays; delete the directory to rebuild")
        return arrays, True
    arrays = build()
    with cache_directory(final) as tmp:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", array)
        (tmp / "description.json").write_text(json.dumps({**description, **(note or {})}, indent=2, sort_keys=True))
    return arrays, False
