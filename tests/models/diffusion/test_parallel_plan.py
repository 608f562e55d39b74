import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from longboat.config.base import ConfigError
from longboat.distributed.parallelize import apply_tensor_parallel, plan_entry_matches
from longboat.models import get_model
from longboat.models.diffusion import DiT, DiTConfig

CFG = dict(image_size=8, in_channels=3, patch_size=2, hidden_size=32, depth=2, num_heads=4, num_classes=5,
           learn_sigma=True)


def model_and_batch() -> tuple[DiT, tuple]:
    torch.manual_seed(0)
    model = DiT(DiTConfig(**CFG))
    with torch.no_grad():  # away from adaLN-Zero's zeros, so the split layers all take part
        for p in model.parameters():
            p.normal_(0, 0.2)
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(2, 3, 8, 8, generator=g), torch.rand(2, generator=g), torch.tensor([1, 5]))


def forward_backward(model: DiT, batch: tuple) -> tuple[torch.Tensor, dict]:
    out = model(*batch)
    out.square().mean().backward()
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for n, p in model.named_parameters()}
    return out.detach(), grads


def _rank(rank: int, world: int, store: str, result: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model, batch = model_and_batch()
        mesh = init_device_mesh("cpu", (world,))
        apply_tensor_parallel(model, mesh, get_model("dit").tensor_parallel_plan(model.cfg, world))
        assert type(model.blocks[0].attn.qkv.weight).__name__ == "DTensor"
        out, grads = forward_backward(model, batch)
        if rank == 0:
            torch.save({"out": out, "grads": grads}, result)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_way_tensor_parallel_equals_one_process(tmp_path):
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "result.pt")), nprocs=2, join=True)
    split = torch.load(tmp_path / "result.pt", weights_only=True)
    out, grads = forward_backward(*model_and_batch())
    torch.testing.assert_close(split["out"], out, rtol=1e-5, atol=1e-5)
    assert split["grads"].keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(split["grads"][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_tensor_parallel_plan_names_real_modules():
    spec = get_model("dit")
    cfg = DiTConfig(**CFG)
    names = [n for n, _ in DiT(cfg).named_modules()]
    plan = spec.tensor_parallel_plan(cfg, 2)
    for pattern in plan:
        assert sum(plan_entry_matches(n, pattern) for n in names) == cfg.depth, pattern
    with pytest.raises(ConfigError, match="parallel.tp=3 must divide the model's num_heads"):
        spec.tensor_parallel_plan(cfg, 3)
    assert spec.parallel_units == ("blocks",) and spec.pipeline is None
