"""CPU memory kept for reuse: the second large allocation of a step faults in no new pages."""

import subprocess
import sys

import pytest

CHILD = """
import resource, sys, torch
from longboat.utils.device import keep_freed_cpu_memory

if sys.argv[1] == "keep":
    assert keep_freed_cpu_memory()
torch.empty(16 << 20).fill_(1)  # 64 MiB, freed at once, as a step's activations are
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(16 << 20).fill_(1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_is_reused_without_page_faults():
    pages = (64 << 20) // 4096
    assert _page_faults("default") > pages // 2  # mapped anew and faulted in page by page
    assert _page_faults("keep") < pages // 100
