"""The ceiling MFU divides by: a GPU's table entry, or the best matmul rate measured on this CPU."""

import torch

from longboat.trainer.mfu import gpu_peak_flops, measured_cpu_peak_flops, peak_flops


def test_gpu_names_match_their_most_specific_entry():
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_peak_flops("Some Accelerator") is None


def test_a_bf16_run_on_cpu_is_measured_against_the_best_rate_of_either_dtype():
    """A CPU without native bf16 multiplies bf16 at a small fraction of its fp32 rate; against that rate a bf16 run
    read MFU above 1. Where bf16 is native, its own rate is the higher one."""
    cpu = torch.device("cpu")
    fp32, bf16 = measured_cpu_peak_flops(torch.float32), measured_cpu_peak_flops(torch.bfloat16)  # measured once
    assert peak_flops(cpu, torch.bfloat16) == max(fp32, bf16)
    assert peak_flops(cpu, torch.float32) == fp32
