"""Sampling images/s: ``longboat sample``'s loop (``recipes/sample.py``'s ``sample_images``) against diffusers'
``DiTPipeline``, the same DiT weights (a diffusers ``DiTTransformer2DModel`` converted by ``longboat convert
diffusers-to-longboat``'s own code), the same DDIM schedule (the recipe's: squared-cosine betas, trailing
timesteps, clipped x0), steps, guidance and starting noise, fp32.

The pipeline's VAE decode is timed inside the call and taken out, so both figures are the denoising loop alone.
The two run alternately, so both see the same machine load; the medians of the timed runs are reported and the
median of the per-pair ratios. Their final latents are compared, to show both did the same work.

    python -P bench/sample_diffusers.py [--hidden 256 --depth 4 --heads 4 --size 16 --num 8 --steps 25 --cfg 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel
from diffusers.pipelines.dit import pipeline_dit

from longboat.models.diffusion import DiTConfig
from longboat.models.diffusion.dit_diffusers import config_to_diffusers
from longboat.models.generative.keyed_random import keyed_normal, noise_key
from longboat.recipes.artifact import open_artifact
from longboat.recipes.convert import hf_to_longboat
from longboat.recipes.sample import Generator, sample_images

NUM_CLASSES = 1000  # diffusers' DiTPipeline takes class 1000 as the null class


def diffusers_transformer(args: argparse.Namespace, folder: Path) -> DiTTransformer2DModel:
    """A random DiT saved as a diffusers pipeline's ``transformer/`` folder."""
    cfg = DiTConfig(image_size=args.size, in_channels=args.channels, patch_size=2, hidden_size=args.hidden,
                    depth=args.depth, num_heads=args.heads, num_classes=NUM_CLASSES, learn_sigma=True,
                    mlp_norm_eps=1e-5)
    config = {k: v for k, v in config_to_diffusers(cfg).items() if not k.startswith("_")}
    torch.manual_seed(0)
    model = DiTTransformer2DModel(**config)
    with torch.no_grad():  # away from adaLN-Zero's zeros, so every path computes what a trained model's does
        for p in model.parameters():
            p.normal_(0, 0.02)
        for block in model.transformer_blocks[1:]:  # one timestep and class embedding shared, as DiT's checkpoints
            block.norm1.emb.load_state_dict(model.transformer_blocks[0].norm1.emb.state_dict())
    model.save_pretrained(folder)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16, help="latent side")
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--num", type=int, default=8, help="images per run (one batch)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per side")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    tmp = Path(tempfile.mkdtemp(prefix="sample-bench-"))

    theirs = diffusers_transformer(args, tmp / "transformer")
    artifact = open_artifact(hf_to_longboat(tmp / "transformer", tmp / "export"))
    # What the diffusion task writes to diffusion.json for a DDPM (epsilon) model of these latents.
    spec = {"image_size": args.size, "channels": args.channels, "num_classes": NUM_CLASSES,
            "objective": {"kind": "ddpm", "train_timesteps": 1000, "prediction": "epsilon"}}
    generator = Generator(artifact, spec)
    # The recipe's DDIM: squared-cosine betas, trailing timesteps, x0 clipped to [-1, 1], eta 0.
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", prediction_type="epsilon",
                              clip_sample=True, clip_sample_range=1.0, set_alpha_to_one=True, steps_offset=0,
                              timestep_spacing="trailing")
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=args.channels, block_out_channels=(8,),
                        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                        layers_per_block=1, norm_num_groups=8, scaling_factor=1.0)
    pipe = DiTPipeline(transformer=theirs, vae=vae.eval(), scheduler=scheduler).to(device)
    pipe.set_progress_bar_config(disable=True)

    labels = torch.arange(args.num) * 37 % NUM_CLASSES
    seeds = list(range(args.num))
    noise = keyed_normal(torch.tensor([noise_key(s, 0) for s in seeds], dtype=torch.int64),
                         (args.channels, args.size, args.size))
    # The pipeline draws its own noise; it starts from ours instead, so the two end at the same latents.
    pipeline_dit.randn_tensor = lambda shape, generator=None, device=None, dtype=None: noise.to(device, dtype)
    decode = pipe.vae.decode
    decoded: dict = {}

    def timed_decode(latents, *a, **k):  # the VAE decode, timed so that it is taken out of the pipeline's time
        sync()
        start = time.perf_counter()
        out = decode(latents, *a, **k)
        sync()
        decoded["s"], decoded["latents"] = time.perf_counter() - start, latents
        return out

    pipe.vae.decode = timed_decode

    def run_ours() -> float:
        sync()
        start = time.perf_counter()
        decoded["ours"] = sample_images(generator, labels, seeds, args.steps, args.cfg, "ddim", args.num, device)
        sync()
        return time.perf_counter() - start

    def run_theirs() -> float:
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            pipe(class_labels=labels.tolist(), guidance_scale=args.cfg, num_inference_steps=args.steps,
                 output_type="pt")
        sync()
        return time.perf_counter() - start - decoded["s"]

    times: dict[str, list[float]] = {"longboat": [], "diffusers": []}
    for i in range(args.warmup + args.runs):
        for name, run in (("longboat", run_ours), ("diffusers", run_theirs)):  # alternating: the same load
            elapsed = run()
            if i >= args.warmup:
                times[name].append(elapsed)
    gap = (decoded["ours"] - decoded["latents"].float().cpu().clamp(-1, 1)).abs().max().item()
    rate = {name: args.num / statistics.median(t) for name, t in times.items()}
    paired = statistics.median(d / o for o, d in zip(times["longboat"], times["diffusers"]))
    print(f"DiT hidden {args.hidden} depth {args.depth} heads {args.heads}, {args.channels}x{args.size}x{args.size} "
          f"latents patch 2, {args.num} images, DDIM {args.steps} steps, guidance {args.cfg}, fp32 {args.device}, "
          f"{torch.get_num_threads()} threads (final latents agree to {gap:.1e}; VAE decode excluded)")
    for name, r in rate.items():
        print(f"  {name:10s} {r:7.2f} images/s  (median of {args.runs})")
    print(f"  ratio longboat / diffusers: {rate['longboat'] / rate['diffusers']:.2f}x  "
          f"(median of per-pair ratios {paired:.2f}x)")


if __name__ == "__main__":
    main()
