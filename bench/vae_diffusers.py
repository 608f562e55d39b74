"""longboat's AutoencoderKL against diffusers' ``AutoencoderKL`` on the same config, weights and images (``--layout
wan``: the Wan 2.1 video VAE against ``AutoencoderKLWan`` on clips of ``--frames``): one encode (the posterior's mean,
as latents are cached for training) and one decode (as sampling ends), inference, fp32 unless ``--dtype`` says. The
two alternate call by call in one process, so both see the same machine load; the median of the timed calls after
warm-up is reported, and the ratio.

    python -P bench/vae_diffusers.py [--layout sd|flux|wan --batch 2 --size 128 --frames 5 --steps 5 --threads N
                                      --device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from diffusers import AutoencoderKL as DiffusersAutoencoderKL
from diffusers import AutoencoderKLWan

from longboat.models.diffusion import AutoencoderKL, VAEConfig, WanVAE, WanVAEConfig
from longboat.models.diffusion import vae_diffusers, wan_vae_diffusers

LAYOUTS = {  # published pipelines' VAE configs (Stable Diffusion 1.x/2.x, FLUX.1)
    "sd": VAEConfig(),
    "flux": VAEConfig(latent_channels=16, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611,
                      shift_factor=0.1159),
    "wan": WanVAEConfig(),  # Wan 2.1's video VAE
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="sd")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=128, help="image side")
    parser.add_argument("--frames", type=int, default=5, help="frames per clip (--layout wan; 1 + 4k)")
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
    video = args.layout == "wan"
    ours_cls, theirs_cls, mapping = ((WanVAE, AutoencoderKLWan, wan_vae_diffusers) if video else
                                     (AutoencoderKL, DiffusersAutoencoderKL, vae_diffusers))
    ours = ours_cls(cfg).to(args.device, dtype).eval()
    config = {k: v for k, v in mapping.config_to_diffusers(cfg).items() if not k.startswith("_")}
    theirs = theirs_cls(**config).to(args.device, dtype).eval()
    theirs.load_state_dict(mapping.state_dict_to_diffusers(ours.state_dict(), cfg))

    shape = (args.batch, cfg.in_channels) + ((args.frames,) if video else ()) + (args.size, args.size)
    x = torch.randn(*shape, device=args.device, dtype=dtype)
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
    what, unit = ("AutoencoderKLWan", "clips") if video else ("AutoencoderKL", "images")
    print(f"{what} {args.layout} layout, {'x'.join(map(str, shape))} encode + decode, {args.dtype} {args.device}, "
          f"{torch.get_num_threads()} threads ({unit} agree to {gap:.1e})")
    for name, r in rate.items():
        print(f"  {name:10s} {r:7.2f} {unit}/s  (median of {args.steps})")
    print(f"  ratio longboat / diffusers: {rate['longboat'] / rate['diffusers']:.2f}x  "
          f"(median of per-pair ratios {paired:.2f}x)")


if __name__ == "__main__":
    main()
