"""The ceiling MFU divides by: a GPU's table entry, or the best matmul rate measured once on this CPU and cached."""

import json

import pytest
import torch

from longboat.trainer.mfu import cpu_peak_cache_file, cpu_peak_key, gpu_peak_flops, measured_cpu_peak_flops, peak_flops

CPU = torch.device("cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The measured peaks' cache file, under a fresh $XDG_CACHE_HOME."""
    monkeypatch.delenv("LONGBOAT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    file = cpu_peak_cache_file()
    assert file == tmp_path / "longboat" / "cpu_peak_flops.json"
    return file


def test_gpu_names_match_their_most_specific_entry():
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peak_flops("Some Accelerator") is None


def test_a_bf16_run_on_cpu_is_measured_against_the_best_rate_of_either_dtype(cache):
    """A CPU without native bf16 multiplies bf16 at a small fraction of its fp32 rate; against that rate a bf16 run
    read MFU above 1. Where bf16 is native, its own rate is the higher one."""
    fp32, bf16 = measured_cpu_peak_flops(torch.float32), measured_cpu_peak_flops(torch.bfloat16)
    assert peak_flops(CPU, torch.bfloat16).flops == max(fp32, bf16)
    assert peak_flops(CPU, torch.float32).flops == fp32


def test_the_cpu_peak_is_measured_once_and_then_read_from_the_cache(cache):
    measured = measured_cpu_peak_flops(torch.float32)
    key = cpu_peak_key(torch.float32)
    assert json.loads(cache.read_text()) == {key: measured} and measured > 1e6
    # A later call reads the file instead of measuring: a value no measurement gives comes back as it is.
    cache.write_text(json.dumps({key: 1234.5}))
    assert measured_cpu_peak_flops(torch.float32) == 1234.5
    assert peak_flops(CPU, torch.float32).flops == 1234.5
    assert "torch " + torch.__version__ in key and "float32" in key and f"{torch.get_num_threads()} threads" in key


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[" * 100_000, b'{"KEY": "fast"}'])
def test_a_corrupt_cache_is_ignored_and_rewritten(cache, content):
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content.replace(b"KEY", cpu_peak_key(torch.float32).encode()))
    measured = measured_cpu_peak_flops(torch.float32)
    assert measured > 1e6
    assert json.loads(cache.read_text()) == {cpu_peak_key(torch.float32): measured}
    assert not list(cache.parent.glob(".*.tmp"))  # written through a temporary file, renamed into place


def test_mfu_on_a_cpu_is_at_most_one(cache):
    """A step that outruns the measured peak (measured while something else ran) raises the peak, in the cache too:
    MFU reads 1, not 1.8, and later runs divide by the higher peak."""
    key = cpu_peak_key(torch.float32)
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({key: 1e6, "another cpu": 5.0}))
    peak = peak_flops(CPU, torch.float32)
    assert peak.mfu(5e5) == 0.5
    assert peak.mfu(1.8e6) == 1.0
    assert peak.mfu(9e5) == 0.5
    assert json.loads(cache.read_text()) == {key: 1.8e6, "another cpu": 5.0}
    assert peak_flops(CPU, torch.float32).flops == 1.8e6


def test_a_table_peak_is_not_raised(cache):
    from longboat.trainer.mfu import Peak

    assert Peak(100.0).mfu(50.0) == 0.5
    assert not cache.exists()
