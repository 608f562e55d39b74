"""The largest token id in a ``.bin`` file, which its ``.idx`` does not record: scanned once, then cached.

The cache is a small JSON file keyed by the ``.bin``'s size and modification time, so a rewritten file is
scanned again. A read-only directory only costs the scan each time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from longboat.data.indexed import IndexedDataset, data_path

_CHUNK = 1 << 26  # tokens per slice of the memory map: bounded memory for any file size


def max_token_id(dataset: IndexedDataset, cache_dir: str | os.PathLike) -> int:
    """The largest token id in ``dataset`` (-1 when it holds no tokens)."""
    bin_file = data_path(dataset.prefix)
    stat = bin_file.stat()
    cache = Path(cache_dir) / f"{bin_file.name}.max_token_id.json"
    key = {"bin_size": stat.st_size, "bin_mtime_ns": stat.st_mtime_ns}
    try:
        cached = json.loads(cache.read_text())
        if {k: cached.get(k) for k in key} == key:
            return int(cached["max_token_id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    tokens = dataset._bin
    found = max((int(tokens[i : i + _CHUNK].max()) for i in range(0, len(tokens), _CHUNK)), default=-1)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**key, "max_token_id": found}) + "\n")
        os.replace(tmp, cache)
    except OSError:
        pass
    return found
