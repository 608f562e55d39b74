"""Cost of attending within packed documents: the decoder's forward + backward with segment ids against plain causal.

Several documents in a row need a [B, 1, T, T] mask, which sends SDPA down its masked path (every score computed);
one document per row (then padding) takes the causal path. Median over repeats of this process's CPU time.

    python bench/segment_mask.py --seq 2048                           # tiny preset shape
    python bench/segment_mask.py --seq 512 --d-model 768 --layers 12 --heads 12 --kv-heads 4 --ffn 2048 --vocab 32000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from longboat.models.llm import Decoder, DecoderConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=688)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    T = args.seq
    model = Decoder(DecoderConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                                  n_heads=args.heads, n_kv_heads=args.kv_heads, ffn_dim=args.ffn, max_seq_len=T))
    tokens = torch.randint(0, args.vocab, (args.batch, T))
    lengths = [T // 8, T // 4, T // 8, T - T // 2]  # four documents of a packed row
    segments = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(lengths)]).expand(args.batch, T)
    positions = torch.cat([torch.arange(n) for n in lengths]).expand(args.batch, T)
    one_doc = torch.where(torch.arange(T) < T * 3 // 4, 1, 0).expand(args.batch, T)
    cases = {
        "causal": lambda: model(tokens),
        "4 documents": lambda: model(tokens, positions, None, segments),
        "1 document + padding": lambda: model(tokens, None, None, one_doc),
    }
    seconds = {}
    for name, forward in cases.items():
        times = []
        for i in range(args.repeats + 1):  # the first is warmup
            start = time.process_time()
            forward().float().square().mean().backward()
            if i:
                times.append(time.process_time() - start)
        seconds[name] = statistics.median(times)
    print(f"{model.cfg.num_params() / 1e6:.0f}M parameters, batch {args.batch} x seq {T}, threads {args.threads}, "
          f"median of {args.repeats} (CPU seconds, forward + backward)")
    for name, s in seconds.items():
        print(f"  {name:22} {s:7.3f}s  {s / seconds['causal']:.2f}x causal")


if __name__ == "__main__":
    main()
