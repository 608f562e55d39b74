"""Train-step throughput of longboat's Decoder against transformers' LlamaForCausalLM.

Both models get the same config, weights, batch, thread count and optimizer; a step is
forward + loss + backward + AdamW. Steps of the two models are interleaved so machine noise
hits both, and the median over repeats after warmup is reported.

    python bench/train_step.py                 # eager, fp32 and bf16 autocast
    python bench/train_step.py --compile       # adds torch.compile figures
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.loss import chunked_cross_entropy
from tests.models.hf_reference import from_hf_state_dict, hf_config_dict


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1376)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16 (bf16 = autocast)")
    p.add_argument("--loss", choices=["fused", "logits", "both"], default="fused",
                   help="ours: chunked head+CE (fused), plain logits + F.cross_entropy (logits), or both")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per chunk of the fused loss")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd models")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time, steadier than wall time on a shared machine")
    return p.parse_args()


def build_pair(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = DecoderConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
        n_kv_heads=args.kv_heads, ffn_dim=args.ffn, max_seq_len=args.seq,
    )
    hf_cfg = LlamaConfig(**hf_config_dict(cfg), attn_implementation="sdpa")
    torch.manual_seed(0)
    ours, theirs = Decoder(cfg), LlamaForCausalLM(hf_cfg)
    ours.load_state_dict(from_hf_state_dict(theirs.state_dict(), cfg))  # same weights, same function
    return ours.train(), theirs.train()


def make_steps(ours, theirs, batch, args, loss_kind: str, autocast, compile: bool):
    tokens, labels = batch
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4, foreach=True)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=1e-4, foreach=True)

    def logits_loss(tokens, labels):
        logits = ours(tokens)
        loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return loss_sum / (labels != -100).sum()

    hidden_states = ours.hidden_states
    if compile:
        # The fused loss is a hand-written autograd Function with a Python loop: compile the body only.
        hidden_states, logits_loss = torch.compile(hidden_states), torch.compile(logits_loss)
        theirs = torch.compile(theirs)

    def ours_loss():
        if loss_kind == "fused":
            loss_sum, n = chunked_cross_entropy(hidden_states(tokens), ours.output_weight, labels, args.chunk)
            return loss_sum / n
        return logits_loss(tokens, labels)

    def step_ours():
        with autocast():
            loss = ours_loss()
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)
        return loss.item()

    def step_theirs():
        with autocast():
            loss = theirs(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)
        return loss.item()

    return step_ours, step_theirs


def measure(step_ours, step_theirs, args) -> tuple[float, float, tuple[float, float]]:
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def timed(fn) -> float:
        start = clock()
        fn()
        return clock() - start

    first = (step_ours(), step_theirs())
    for _ in range(args.warmup - 1):
        step_ours()
        step_theirs()
    t_ours, t_theirs = [], []
    for i in range(args.repeats):
        # Alternate which goes first so slow drift in machine load does not favour one side.
        if i % 2:
            t_theirs.append(timed(step_theirs))
            t_ours.append(timed(step_ours))
        else:
            t_ours.append(timed(step_ours))
            t_theirs.append(timed(step_theirs))
    return statistics.median(t_ours), statistics.median(t_theirs), first


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    chunk = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    # Ours takes labels shifted by the data layer; HF shifts internally, so it gets the same tokens
    # as input and labels and scores T-1 positions per row against our T.
    batch = (chunk[:, :-1], chunk[:, 1:])
    tokens_per_step = args.batch * args.seq
    losses = ["fused", "logits"] if args.loss == "both" else [args.loss]
    modes = ["eager", "compile"] if args.compile else ["eager"]
    print(f"config: d_model {args.d_model}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, "
          f"ffn {args.ffn}, vocab {args.vocab}; batch {args.batch} x seq {args.seq}; threads {args.threads}; "
          f"warmup {args.warmup}, repeats {args.repeats}; {args.clock} clock; torch {torch.__version__}")
    unit = "tok/s" if args.clock == "wall" else "tok/cpu-s"
    print(f"{'mode':8} {'dtype':5} {'our loss':8} {'ours ' + unit:>15} {'hf ' + unit:>13} {'ratio':>6}  first losses")
    for mode in modes:
        for dtype in args.dtypes.split(","):
            autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else nullcontext
            for loss_kind in losses:
                # Fresh models per row so optimizer state and compile caches do not leak between rows.
                ours, theirs = build_pair(args)
                steps = make_steps(ours, theirs, batch, args, loss_kind, autocast, mode == "compile")
                t_ours, t_theirs, (l_ours, l_theirs) = measure(*steps, args)
                print(f"{mode:8} {dtype:5} {loss_kind:8} {tokens_per_step / t_ours:15.0f} "
                      f"{tokens_per_step / t_theirs:13.0f} {t_theirs / t_ours:6.2f}x  "
                      f"{l_ours:.4f} / {l_theirs:.4f}", flush=True)


if __name__ == "__main__":
    main()
