"""longboat's AutoencoderKL against diffusers' ``AutoencoderKL`` on the same config, weights and images: one encode
(the posterior's mean, as latents are cached for training) and one decode (as sampling ends), inference, fp32 unless
``--dtype`` says. The two alternate call by call in one process, so both see the same machine load; the median of the
timed calls after warm-up is reported, and the ratio.

    python -P bench/vae_diffusers.py [--layout sd|flux --batch 2 --size 128 --steps 5 --threads N --device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from diffusers import AutoencoderKL as DiffusersAutoencoderKL

from longboat.models.diffusion import AutoencoderKL, VAEConfig
from longboat.models.diffusion.vae_diffusers import config_to_diffusers, state_dict_to_diffusers

LAYOUTS = {  # published pipelines' VAE configs (Stable Diffusion 1.x/2.x, FLUX.1)
    "sd": VAEConfig(),
    "flux": VAEConfig(latent_channels=16, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611,
                      shift_factor=0.1159),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="sd")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=128, help="image side")
    parser.add_argument("--steps", type=int, default=5, help="timed encode + decode calls per model")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    cfg = LAYOUTS[args.layout]
    ours = AutoencoderKL(cfg).to(args.device, dtype).eval()
    config = {k: v for k, v in config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = DiffusersAutoencoderKL(**config).to(args.device, dtype).eval()
    theirs.load_state_dict(state_dict_to_diffusers(ours.state_dict(), cfg))

    x = torch.randn(args.batch, cfg.in_channels, args.size, args.size, device=args.device, dtype=dtype)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def ours_call(x):
        return ours.decode(ours.encode(x).mean)

    def theirs_call(x):
        return theirs.decode(theirs.encode(x).latent_dist.mean).sample

    with torch.no_grad():
        gap = (ours_call(x) - theirs_call(x)).abs().max().item()
    times: dict[str, list[float]] = {"longboat": [], "diffusers": []}
    calls = {"longboat": ours_call, "diffusers": theirs_call}
    with torch.no_grad():
        for i in range(args.warmup + args.steps):
            for name, call in calls.items():  # alternating: both see the same load
                sync()
                start = time.perf_counter()
                call(x)
                sync()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
    rate = {name: args.batch / statistics.median(t) for name, t in times.items()}
    # Each pair of calls ran back to back: their ratio sees one machine load, steadier than the medians' ratio.
    paired = statistics.median(d / o for o, d in zip(times["longboat"], times["diffusers"]))
    print(f"AutoencoderKL {args.layout} layout, {args.batch}x{cfg.in_channels}x{args.size}x{args.size} encode + "
          f"decode, {args.dtype} {args.device}, {torch.get_num_threads()} threads (images agree to {gap:.1e})")
    for name, r in rate.items():
        print(f"  {name:10s} {r:7.2f} images/s  (median of {args.steps})")
    print(f"  ratio longboat / diffusers: {rate['longboat'] / rate['diffusers']:.2f}x  "
          f"(median of per-pair ratios {paired:.2f}x)")


if __name__ == "__main__":
    main()
