"""Throughput of one Qwen2.5-VL training step: the Trainer's own step against transformers'
``Qwen2_5_VLForConditionalGeneration`` trained by hand, on the same weights and batch (CPU).

Ours is ``Trainer.train_step()`` as ``task: sft`` runs it on rows with images: fetch the rows and their images'
patch rows from a map-style dataset (collated as the SFT image rows are), forward through the tower and the
decoder with multimodal RoPE, the SFT loss (next-token cross-entropy, no label on image tokens), backward,
gradient clipping, AdamW and the schedule. Theirs is the same checkpoint loaded into transformers: forward with
``labels`` (its own shift), ``mm_token_type_ids`` (its multimodal positions), backward, ``clip_grad_norm_`` and
``torch.optim.AdamW`` with the same hyper-parameters. Both predict the same tokens (the first losses printed agree).
Steps alternate which side goes first; the medians of ``--steps`` timed steps after warmup are reported.

    python bench/vlm_train_step.py --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch
from torch.utils.data import Dataset

from longboat.config.base import validate
from longboat.data.chat.images import ImageChatRows
from longboat.data.labels import IGNORE_INDEX
from longboat.models import get_model
from longboat.models.llm.hf import get_hf_adapter
from longboat.models.registry import hooks_for_config
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.optim import OptimizerConfig
from longboat.trainer.schedule import ScheduleConfig
from longboat.trainer.trainer import Trainer

OPTIMIZER = OptimizerConfig(lr=1e-4, implementation="foreach")
CLIP = 1.0
IMG, START, END = 31990, 31991, 31992  # image, vision start and end tokens, at the top of the vocabulary


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--image", type=int, default=224, help="image side in pixels (two images a row)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vision-d", type=int, default=256)
    p.add_argument("--vision-layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="timed steps of each side")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    return p.parse_args()


def hf_config(args: argparse.Namespace):
    from transformers import Qwen2_5_VLConfig

    heads = args.d_model // 64
    return Qwen2_5_VLConfig(
        vision_config=dict(depth=args.vision_layers, hidden_size=args.vision_d, intermediate_size=2 * args.vision_d,
                           num_heads=args.vision_d // 64, out_hidden_size=args.d_model, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[args.vision_layers - 1]),
        text_config=dict(vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=int(2.6875 * args.d_model),
                         num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                         max_position_embeddings=args.seq, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": [8, 12, 12]}),
        image_token_id=IMG, vision_start_token_id=START, vision_end_token_id=END)


class ImageRows(Dataset):
    """Rows as the SFT image rows give them: tokens, pre-shifted labels, positions, segments, and the row's images
    (patch rows, grids, slots), preprocessed once so that both sides read the same pixels."""

    collate = staticmethod(ImageChatRows.collate)

    def __init__(self, items: list[dict[str, torch.Tensor]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def make_rows(args: argparse.Namespace, cfg, n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of ``seq`` tokens, each: text, an image, text, an image, text."""
    g = torch.Generator().manual_seed(1)
    pictures = torch.randint(0, 256, (2, args.image, args.image, 3), dtype=torch.uint8, generator=g).numpy()
    pixels = cfg.image_processor()(list(pictures))
    per_image = int(pixels["image_grid"][0].prod()) // 4
    text = (args.seq - 2 * (per_image + 2)) // 3
    if text < 2:
        raise SystemExit(f"--seq {args.seq} is too short for two images of {per_image} tokens")
    rows = []
    for _ in range(n):
        words = torch.randint(0, 31000, (args.seq,), generator=g)
        layout = [*words[:text], START, *[IMG] * per_image, END, *words[text:2 * text], START, *[IMG] * per_image,
                  END]
        tokens = torch.tensor(layout + words[-(args.seq - len(layout)):].tolist())
        labels = torch.cat([tokens[1:], torch.tensor([IGNORE_INDEX])])
        labels[labels == IMG] = IGNORE_INDEX
        first = [text + 1, 2 * text + per_image + 3]
        rows.append({"tokens": tokens, "labels": labels, "position_ids": torch.arange(args.seq),
                     "segments": torch.ones(args.seq, dtype=torch.long), "images": pixels["images"],
                     "image_grid": pixels["image_grid"], "image_slots": torch.tensor([[0, f] for f in first])})
    return rows


def make_steps(args: argparse.Namespace, run_dir: str):
    from transformers import Qwen2_5_VLForConditionalGeneration

    adapter = get_hf_adapter("qwen2_5_vl")
    config = hf_config(args)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    theirs = Qwen2_5_VLForConditionalGeneration(config).train()
    cfg = validate(get_model("vlm").config, adapter.config_from_hf(config.to_dict()), "bench")
    ours = get_model("vlm").build(cfg)
    hf_state = {k.replace("model.language_model.", "model.").replace("model.visual.", "visual."): v
                for k, v in theirs.state_dict().items()}
    ours.load_state_dict(adapter.state_dict_from_hf(hf_state, cfg), strict=True)
    ours.train()
    rows = make_rows(args, cfg, (args.warmup + args.steps) * args.batch)
    train_cfg = TrainerConfig(
        steps=len(rows) // args.batch, micro_batch_size=args.batch, optimizer=OPTIMIZER,
        schedule=ScheduleConfig(kind="constant"), clip_grad_norm=CLIP, dtype=args.dtype, device="cpu",
        log_every=10**9, num_workers=0, tensorboard=False)
    loss = make_lm_loss(True, True, extra_inputs=hooks_for_config(cfg).model_inputs)
    trainer = Trainer(train_cfg, CheckpointConfig(export=False), run_dir, ours, loss, ImageRows(rows))
    opt = torch.optim.AdamW(theirs.parameters(), lr=OPTIMIZER.lr, betas=OPTIMIZER.betas, eps=OPTIMIZER.eps,
                            weight_decay=OPTIMIZER.weight_decay, foreach=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.dtype == "bf16" else nullcontext
    batches = iter([ImageChatRows.collate(rows[i:i + args.batch]) for i in range(0, len(rows), args.batch)])

    def step_ours() -> float:
        return trainer.train_step()["loss"]

    def step_theirs() -> float:
        b = next(batches)
        labels = b["tokens"].masked_fill(b["tokens"] == IMG, IGNORE_INDEX)  # transformers shifts them itself
        with autocast():
            out = theirs(input_ids=b["tokens"], labels=labels, pixel_values=b["images"],
                         image_grid_thw=b["image_grid"], mm_token_type_ids=(b["tokens"] == IMG).long())
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    return step_ours, step_theirs


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        step_ours, step_theirs = make_steps(args, run_dir)
        first = (step_ours(), step_theirs())
        for _ in range(args.warmup - 1):
            step_ours()
            step_theirs()
        t_ours, t_theirs = [], []
        for i in range(args.steps):
            for side, times in ((step_ours, t_ours), (step_theirs, t_theirs))[::1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                side()
                times.append(time.perf_counter() - start)
    ours, theirs = statistics.median(t_ours), statistics.median(t_theirs)
    print(f"config: text d_model {args.d_model} x {args.layers} layers, vocab {args.vocab}; tower d {args.vision_d} "
          f"x {args.vision_layers}; batch {args.batch} x seq {args.seq}, two {args.image}px images a row; "
          f"{args.dtype}; threads {args.threads}; warmup {args.warmup}, {args.steps} timed steps; "
          f"torch {torch.__version__}")
    print(f"ours {1 / ours:.3f} steps/s   transformers {1 / theirs:.3f} steps/s   ratio {theirs / ours:.2f}x   "
          f"first losses {first[0]:.4f} / {first[1]:.4f}")


if __name__ == "__main__":
    main()
