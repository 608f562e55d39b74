"""What the render bounds cost (``longboat.data.chat.bounds``): microseconds a conversation for real chat
templates, bounded as longboat renders them against the plain Jinja sandbox without bounds, in interleaved
batches of the same process so that both see the same machine load. The SFT task renders every row this way.

    python -P bench/chat_template_bounds.py [TEMPLATE.jinja ...]   # default: longboat's and the tests' templates
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from longboat.data.chat import ChatTemplate
from longboat.data.chat import template as chat_template

ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONS = [
    [{"role": "user", "content": "What is a longboat?"},
     {"role": "assistant", "content": "A long, narrow ship with oars and a sail."}],
    [{"role": "system", "content": "You answer like a sailor."},
     {"role": "user", "content": "How do I tie a bowline?"},
     {"role": "assistant", "content": "Make a loop, up through the hole, round the tree, back down the hole."},
     {"role": "user", "content": "And a reef knot?"},
     {"role": "assistant", "content": "Right over left, then left over right.\n\nPull both ends tight."}],
]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def unbounded(source: str):
    """The template in the sandbox alone, set up as ``ChatTemplate`` sets up its own."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[chat_template._GenerationBlock, loopcontrols])
    env.filters["tojson"] = chat_template._tojson
    env.globals.update(raise_exception=chat_template._raise_exception, strftime_now=chat_template._strftime_now)
    return env.from_string(source)


def per_render_us(render, batch: int) -> float:
    start = time.perf_counter()
    for _ in range(batch):
        for conversation in CONVERSATIONS:
            render(conversation)
    return 1e6 * (time.perf_counter() - start) / (batch * len(CONVERSATIONS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("templates", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=30)
    args = parser.parse_args()
    files = args.templates or [*sorted((ROOT / "src/longboat/data/chat/templates").glob("*.jinja")),
                               *sorted((ROOT / "tests/fixtures/chat").glob("*.jinja"))]
    for path in files:
        source = path.read_text()
        bounded, plain = ChatTemplate(source, SPECIAL, name=path.name), unbounded(source)
        best = {"plain": float("inf"), "bounded": float("inf")}
        for _ in range(args.rounds):  # interleaved: each kind one round at a time
            best["plain"] = min(best["plain"], per_render_us(
                lambda c: plain.render(messages=c, tools=None, documents=None, add_generation_prompt=False,
                                       **SPECIAL), args.batch))
            best["bounded"] = min(best["bounded"], per_render_us(bounded.render, args.batch))
        a, b = best["plain"], best["bounded"]
        print(f"{path.name:28s} plain {a:7.1f} us  bounded {b:7.1f} us  (+{b - a:.1f} us, x{b / a:.2f})")


if __name__ == "__main__":
    main()
