"""Forward+backward throughput of longboat's MoE layer against transformers' Qwen3MoeSparseMoeBlock.

Both run the same config and weights. transformers is timed with its two expert kernels: "eager"
(the per-expert loop in the modeling file, what a standalone block runs) and "grouped_mm" (what
from_pretrained selects by default); longboat's MoE module as the trainer calls it, with its "auto"
choice, and with the padded path forced. Variants are interleaved within every repeat so that load from
other processes hits them alike.

    python bench/moe.py                      # d_model 1024, 16 experts, top-2, ffn 512, 4096 tokens
    python bench/moe.py --tokens 1024 --repeats 3 --dtypes float32
    python bench/moe.py --shape qwen3-30b-a3b --tokens 16384   # one layer of Qwen3-30B-A3B, on a GPU
    python bench/moe.py --keep-freed-memory  # CPU memory kept for reuse, as train.keep_freed_memory=true does

Runs on CUDA when it is there (``--device`` to choose), timing with a device sync after each backward.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import Tensor, nn
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from longboat.models.moe import MoE, MoEConfig
from longboat.utils.device import keep_freed_cpu_memory
from worker_launch import positive

HF_EAGER, HF_GROUPED = "transformers (eager)", "transformers (grouped_mm)"
# Published MoE layers: (d_model, experts, top-k, expert ffn).
SHAPES = {"qwen3-30b-a3b": (2048, 128, 8, 768), "deepseek-v3": (7168, 256, 8, 2048)}


def build_variants(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, nn.Module]:
    """Every variant, all holding the same weights."""
    torch.manual_seed(0)
    # Qwen3-MoE's router computes its logits in the input dtype, as imports of it do here.
    cfg = MoEConfig(d_model=args.d_model, n_experts=args.experts, top_k=args.top_k, expert_ffn_dim=args.ffn,
                    norm_topk_prob=True, router_dtype="input")
    ours = MoE(cfg)
    variants: dict[str, nn.Module] = {"longboat (auto)": ours}
    padded = variants["longboat (padded)"] = MoE(cfg.model_copy(update={"experts_impl": "padded"}))
    padded.load_state_dict(ours.state_dict())
    gate_up = ours.experts.w13.detach().flatten(1, 2)  # [E, 2, ffn, d] is gate_up_proj's [gate; up] rows
    for impl, name in (("eager", HF_EAGER), ("grouped_mm", HF_GROUPED)):
        hf_cfg = Qwen3MoeConfig(hidden_size=args.d_model, moe_intermediate_size=args.ffn, num_experts=args.experts,
                                num_experts_per_tok=args.top_k, norm_topk_prob=True)
        hf_cfg._experts_implementation = impl
        hf = Qwen3MoeSparseMoeBlock(hf_cfg)
        with torch.no_grad():
            hf.gate.weight.copy_(ours.router.weight)
            hf.experts.gate_up_proj.copy_(gate_up)
            hf.experts.down_proj.copy_(ours.experts.w2)
        variants[name] = hf
    return {name: module.to(dtype).train() for name, module in variants.items()}


def fwd_bwd_seconds(module: nn.Module, x: Tensor, grad: Tensor) -> float:
    """One forward+backward; longboat's aux dict is dropped (its loss is zero with aux_loss='none')."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    out = module(x)
    (out[0] if isinstance(out, tuple) else out).backward(grad)
    sync()
    return time.perf_counter() - start


@torch.no_grad()
def check_same_outputs(variants: dict[str, nn.Module], x: Tensor, dtype: torch.dtype) -> None:
    """Every variant computes the same function (a timing of a wrong block would mean nothing)."""
    outs = {name: module(x) for name, module in variants.items()}
    ref = outs[HF_GROUPED].float()
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # relative error of the whole output; bf16 sums round by kernel
    for name, out in outs.items():
        err = ((out[0] if isinstance(out, tuple) else out).float() - ref).norm() / ref.norm()
        assert err < tol, f"{name} differs from {HF_GROUPED}: relative error {err:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=positive, default=1024)
    parser.add_argument("--experts", type=positive, default=16)
    parser.add_argument("--top-k", type=positive, default=2)
    parser.add_argument("--ffn", type=positive, default=512)
    parser.add_argument("--tokens", type=positive, default=4096)
    parser.add_argument("--repeats", type=positive, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a published model's layer (sets the four sizes)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="keep freed CPU memory for reuse (glibc), as train.keep_freed_memory=true does")
    args = parser.parse_args()
    if args.shape:
        args.d_model, args.experts, args.top_k, args.ffn = SHAPES[args.shape]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch sees no CUDA device")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    if args.keep_freed_memory and not keep_freed_cpu_memory():
        parser.error("--keep-freed-memory needs glibc's malloc")
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; d_model {args.d_model}, "
          f"{args.experts} experts, top-{args.top_k}, ffn {args.ffn}, {args.tokens} tokens, forward+backward, "
          f"median of {args.repeats}" + (", freed memory kept" if args.keep_freed_memory else ""))

    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        variants = {name: module.to(device) for name, module in build_variants(args, dtype).items()}
        x = torch.randn(1, args.tokens, args.d_model, dtype=dtype, device=device)
        grad = torch.randn_like(x)
        check_same_outputs(variants, x, dtype)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for rep in range(args.warmup + args.repeats):
            for name, module in variants.items():
                elapsed = fwd_bwd_seconds(module, x, grad)
                if rep >= args.warmup:
                    times[name].append(elapsed)
        median = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"\n{dtype_name:28s} {'tokens/s':>9s} {'median ms':>10s} {'min-max ms':>15s} "
              f"{'vs hf eager':>12s} {'vs hf grouped':>14s}")
        for name, ts in times.items():
            print(f"  {name:26s} {args.tokens / median[name]:9.0f} {median[name] * 1e3:10.1f} "
                  f"{min(ts) * 1e3:7.0f}-{max(ts) * 1e3:<7.0f} {median[HF_EAGER] / median[name]:11.2f}x "
                  f"{median[HF_GROUPED] / median[name]:13.2f}x")


if __name__ == "__main__":
    main()
