"""CPU memory kept for reuse: once the heap has grown to a step's needs, large allocations fault in no new pages."""

import subprocess
import sys

import pytest

ALLOCATIONS = 32
CHILD = f"""
import resource, sys, torch
from longboat.utils.device import keep_freed_cpu_memory

torch.set_num_threads(8)  # worker threads' own small allocations fragment the heap, as in training
if sys.argv[1] == "keep":
    assert keep_freed_cpu_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({ALLOCATIONS}):
    torch.empty(16 << 20).fill_(1)  # 64 MiB, freed at once, as a step's activations are
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_is_reused_without_page_faults():
    pages = (64 << 20) // 4096
    # By default every allocation is mapped anew and faulted in page by page.
    assert _page_faults("default") > ALLOCATIONS * pages // 2
    # Kept, the heap grows by a block or a few (where small allocations split a freed block), then serves them all.
    assert _page_faults("keep") < ALLOCATIONS * pages // 4
