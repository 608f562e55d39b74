"""One training step (forward, MSE loss, backward, AdamW) of longboat's DiT against diffusers'
``DiTTransformer2DModel``, or of its Wan transformer against ``WanTransformer3DModel`` (``--family wan``: clips of
``--frames`` latent frames, text context of ``--text-tokens``), on the same config, weights and batch, fp32. The two
alternate step by step in one process, so both see the same machine load; the median of the timed steps after
warm-up is reported, and the ratio.

    python -P bench/dit_diffusers.py [--batch 16 --hidden 384 --depth 6 --heads 6 --size 32 --steps 10 --threads N]
    python -P bench/dit_diffusers.py --family wan --batch 2 --size 16 --frames 5 --hidden 384 --heads 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from diffusers import DiTTransformer2DModel, WanTransformer3DModel

from longboat.models.diffusion import DiT, DiTConfig, Wan, WanConfig
from longboat.models.diffusion import dit_diffusers, wan_diffusers


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Weights away from adaLN-Zero's zeros, so every path computes what a trained model's does."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model


def build_dit(args):
    cfg = DiTConfig(image_size=args.size, in_channels=args.channels, patch_size=2, hidden_size=args.hidden,
                    depth=args.depth, num_heads=args.heads, num_classes=1000, learn_sigma=True, mlp_norm_eps=1e-5)
    ours = randomised(DiT(cfg)).to(args.device)
    config = {k: v for k, v in dit_diffusers.config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = DiTTransformer2DModel(**config).to(args.device)
    theirs.load_state_dict(dit_diffusers.state_dict_to_diffusers(ours.state_dict(), cfg))
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=args.device)
    steps = torch.randint(0, 1000, (args.batch,), device=args.device)
    labels = torch.randint(0, 1000, (args.batch,), device=args.device)
    target = torch.randn(args.batch, cfg.out_channels, args.size, args.size, device=args.device)
    forward = {"longboat": lambda m, x, t, y: m(x, t, y),
               "diffusers": lambda m, x, t, y: m(x, timestep=t, class_labels=y).sample}
    return ours, theirs, (x, steps, labels, target), forward


def build_wan(args):
    cfg = WanConfig(in_channels=args.channels, hidden_size=args.hidden, num_heads=args.heads, depth=args.depth,
                    ffn_dim=4 * args.hidden, text_dim=args.text_dim)
    ours = randomised(Wan(cfg)).to(args.device)
    config = {k: v for k, v in wan_diffusers.config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = WanTransformer3DModel(**config).to(args.device)
    theirs.load_state_dict(wan_diffusers.state_dict_to_diffusers(ours.state_dict(), cfg))
    x = torch.randn(args.batch, args.channels, args.frames, args.size, args.size, device=args.device)
    steps = torch.randint(0, 1000, (args.batch,), device=args.device)
    context = torch.randn(args.batch, args.text_tokens, args.text_dim, device=args.device)
    target = torch.randn_like(x)
    forward = {"longboat": lambda m, x, t, c: m(x, t, c),
               "diffusers": lambda m, x, t, c: m(x, timestep=t, encoder_hidden_states=c).sample}
    return ours, theirs, (x, steps, context, target), forward


def make_step(model: torch.nn.Module, forward, sync):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, t, condition, target) -> float:
        sync()
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(forward(model, x, t, condition), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("dit", "wan"), default="dit")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=32, help="latent side")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--frames", type=int, default=5, help="wan: latent frames")
    parser.add_argument("--text-tokens", type=int, default=32, help="wan: text context length")
    parser.add_argument("--text-dim", type=int, default=256, help="wan: text embedding width")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.family == "dit":
        ours, theirs, batch, forward = build_dit(args)
    else:
        ours, theirs, batch, forward = build_wan(args)
    with torch.no_grad():
        ours.eval(), theirs.eval()
        gap = (forward["longboat"](ours, *batch[:-1]) - forward["diffusers"](theirs, *batch[:-1])).abs().max().item()
    ours.train(), theirs.train()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    steppers = {
        "longboat": make_step(ours, forward["longboat"], sync),
        "diffusers": make_step(theirs, forward["diffusers"], sync),
    }
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for i in range(args.warmup + args.steps):
        for name, step in steppers.items():  # alternating: both see the same load
            elapsed = step(*batch)
            if i >= args.warmup:
                times[name].append(elapsed)
    rate = {name: 1 / statistics.median(t) for name, t in times.items()}
    # Each pair of steps ran back to back: their ratio sees one machine load, steadier than the medians' ratio.
    paired = statistics.median(d / o for o, d in zip(times["longboat"], times["diffusers"]))
    frames = f"{args.frames}x" if args.family == "wan" else ""
    print(f"{args.family} hidden {args.hidden} depth {args.depth} heads {args.heads}, "
          f"{args.channels}x{frames}{args.size}x{args.size} patch 2, batch {args.batch}, fp32 {args.device}, "
          f"{torch.get_num_threads()} threads (outputs agree to {gap:.1e})")
    for name, r in rate.items():
        print(f"  {name:10s} {r:6.2f} steps/s  (median of {args.steps})")
    print(f"  ratio longboat / diffusers: {rate['longboat'] / rate['diffusers']:.2f}x  "
          f"(median of per-pair ratios {paired:.2f}x)")


if __name__ == "__main__":
    main()
