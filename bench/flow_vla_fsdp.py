"""Peak resident memory per rank of a flow VLA training step under FSDP2 on 2 gloo ranks, at the ``smollm2`` preset's
shapes: the backbone sharded as one unit (with the root, as before its layers returned their keys and values) against
layer by layer (``PrefixBlock`` units, the spec's default).

The model is the ``smollm2`` preset with SmolLM2-135M's decoder shapes (``models/llm/presets/smollm2-135m.yaml``)
in place of its checkpoint directory, random weights, built on the meta device and materialised shard by shard; one
64×64 camera, a 24-token prompt, a 14-d state and action. Parameters the policy does not train are frozen as
``longboat train`` freezes them; AdamW. Each setting runs in a fresh ``torchrun`` launch: after a first step
(which allocates the optimizer's state) each rank resets its peak (``/proc/self/clear_refs``), runs a second step,
and reports its peak resident set (VmHWM) and its resident set before the step.

    python -P bench/flow_vla_fsdp.py [--batch 4] [--backbone-layers 30]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TOKENIZER = "tests/fixtures/sft/tokenizer"  # only its presence matters: the prompt tokens are drawn at random
CAMERA = "observation.images.top"
IMAGE, STATE, ACTION = 64, 14, 14
SETTINGS = {"one unit": ("vision.blocks", "expert.layers"),
            "layer by layer": ("vision.blocks", "backbone.layers", "expert.layers")}


def model_fields(backbone_layers: int | None) -> dict:
    from longboat.models import get_model

    fields = {k: v for k, v in get_model("flow_vla").load_preset("smollm2").items() if k != "backbone_hf"}
    return {**fields, "backbone": get_model("decoder").load_preset("smollm2-135m"), "backbone_layers": backbone_layers,
            "tokenizer": TOKENIZER, "image_features": {CAMERA: [3, IMAGE, IMAGE]}, "state_dim": STATE,
            "action_dim": ACTION}


def batch_of(cfg, n: int, rank: int) -> dict:
    g = torch.Generator().manual_seed(rank)
    return {CAMERA: torch.rand(n, 1, 3, IMAGE, IMAGE, generator=g),
            "observation.state": torch.randn(n, 1, STATE, generator=g),
            "action": torch.randn(n, cfg.horizon, ACTION, generator=g),
            "action_is_pad": torch.zeros(n, cfg.horizon, dtype=torch.bool),
            "noise_key": torch.arange(n, dtype=torch.int64) + 1000 * rank,
            "prompt_tokens": torch.randint(0, cfg.backbone.vocab_size, (n, cfg.max_prompt_len), generator=g),
            "prompt_mask": torch.ones(n, cfg.max_prompt_len, dtype=torch.bool)}


def resident_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def worker(setting: str, batch: int, backbone_layers: int | None, out: Path) -> None:
    import torch.distributed as dist

    from longboat.config.base import validate
    from longboat.distributed import ParallelConfig, ParallelMesh, resolve_dims
    from longboat.distributed.parallelize import parallelize
    from longboat.models import get_model
    from longboat.trainer.optim import ParamGroup, freeze_outside

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    parallel = ParallelConfig(data_parallel="fsdp", meta_init=True)
    mesh = ParallelMesh(resolve_dims(parallel, dist.get_world_size()), "cpu")
    spec = get_model("flow_vla")
    cfg = validate(spec.config, model_fields(backbone_layers), source="bench")
    with torch.device("meta"):
        model = spec.build(cfg)
    freeze_outside(model, [ParamGroup(names, scale) for names, scale in model.param_groups().values()])
    model = parallelize(model, mesh, parallel, None, "cpu", units=SETTINGS[setting])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    data = batch_of(cfg, batch, rank)

    def step() -> float:
        loss = model(data)["loss"].mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # allocates the optimizer's state
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from the current one
    before = resident_kib("VmRSS")
    loss = step()
    figures = torch.tensor([resident_kib("VmHWM"), before], dtype=torch.int64)
    gathered = [torch.zeros_like(figures) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, figures)
    if rank == 0:
        out.write_text(json.dumps({"peak_kib": [int(g[0]) for g in gathered], "before_kib": [int(g[1]) for g in gathered],
                                   "loss": loss, "params": sum(p.numel() for p in model.parameters())}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4, help="samples per rank")
    p.add_argument("--backbone-layers", type=int, default=None, help="the backbone's first N layers (default: all 30)")
    p.add_argument("--worker", choices=list(SETTINGS), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.batch, args.backbone_layers, args.out)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in SETTINGS:
            out = Path(tmp) / "result.json"
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            layers = [] if args.backbone_layers is None else ["--backbone-layers", str(args.backbone_layers)]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master-addr=127.0.0.1",
                   f"--master-port={port}", __file__, "--worker", setting, "--out", str(out), "--batch", str(args.batch),
                   *layers]
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            results[setting] = json.loads(out.read_text())
    first = next(iter(results.values()))
    print(f"flow VLA at the smollm2 preset's shapes ({first['params'] / 1e6:.0f}M parameters), FSDP2 on 2 gloo ranks, "
          f"{args.batch} samples per rank, AdamW; MiB per rank")
    print(f"{'backbone sharded':<18} {'peak (max rank)':>16} {'before the step':>16} {'loss':>8}")
    for setting, r in results.items():
        print(f"{setting:<18} {max(r['peak_kib']) / 1024:16.0f} {max(r['before_kib']) / 1024:16.0f} {r['loss']:8.4f}")
    one, per = (max(results[s]["peak_kib"]) for s in SETTINGS)
    print(f"peak, one unit / layer by layer: {one / per:.2f}×")


if __name__ == "__main__":
    main()
