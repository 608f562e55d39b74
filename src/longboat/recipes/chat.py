"""``longboat chat``: a conversation that keeps its KV cache between turns.

Each turn renders the whole conversation with the chat template and prefills only the tokens after the
longest prefix the cache already holds: normally the new user turn, more when the template rewrote earlier
text (the cache is rolled back to the first token that differs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TextIO

import torch

from longboat.errors import LongboatError
from longboat.data.chat.images import ImageRef
from longboat.models.llm.generation import sample_next
from longboat.recipes.generate import LoadedModel
from longboat.recipes.image_prompts import expand_ids, model_inputs, pixel_inputs, read_images, require_images, \
    with_placeholders

COMMANDS = ("/image PATH (attach an image to the next message), /reset (start over), /system TEXT (replace the "
            "system message), /exit")


class ContextFull(LongboatError):
    """The conversation no longer fits the model's context."""


@dataclass
class Reply:
    text: str
    prefilled: int  # prompt tokens run through the model this turn
    reused: int  # prompt tokens whose keys and values came from the cache
    generated: int
    seconds: float
    truncated: bool  # the context filled up before the model ended its turn


class ChatSession:
    """A conversation (an optional system message, then user and assistant turns) and its KV cache."""

    def __init__(self, loaded: LoadedModel, system: str | None = None, max_new_tokens: int = 512,
                 temperature: float = 0.8, top_k: int | None = None, top_p: float | None = None, seed: int = 0):
        loaded.require_chat_template()  # fail before the first turn
        self.loaded = loaded
        self.system = system
        self.turns: list[dict[str, str]] = []
        self.max_new_tokens, self.temperature, self.top_k, self.top_p = max_new_tokens, temperature, top_k, top_p
        self.generator = torch.Generator().manual_seed(seed)
        model = loaded.model
        self.max_len = model.cfg.max_seq_len
        self.device = next(model.parameters()).device
        self.cache = model.make_cache(1, self.max_len)
        self.cached: list[int] = []  # the token ids whose keys and values the cache holds, in order
        self.images: list[ImageRef] = []  # the turns' images, in the order of their placeholders
        self.pending: list[ImageRef] = []  # images attached to the next user message

    def attach(self, path: str) -> None:
        """Attach the image at ``path`` to the next user message (an error naming it when it cannot be read)."""
        self.pending += read_images(self.loaded, [path], "/image")

    def messages(self, turns: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
        """The conversation as the template renders it: the system message, then ``turns`` (default: the turns)."""
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return system + (self.turns if turns is None else turns)

    def reset(self) -> None:
        """Forget the turns (the system message stays) and empty the cache."""
        self.turns = []
        self.cache.rewind(0)
        self.cached = []
        self.images, self.pending = [], []

    @torch.inference_mode()
    def send(self, text: str, on_text: Callable[[str], None] = lambda s: None) -> Reply:
        """Add a user turn, generate the assistant's reply (passing its text to ``on_text`` as it decodes)."""
        start = time.perf_counter()
        if self.pending:
            text = with_placeholders(text, len(self.pending), require_images(self.loaded).placeholder, "message")
        turns = [*self.turns, {"role": "user", "content": text}]
        ids = self.loaded.render_chat(self.messages(turns))
        images, inputs = [*self.images, *self.pending], None
        if self.loaded.images is not None:  # each placeholder becomes its image's tokens, as in training
            expanded = expand_ids(self.loaded, ids, images, "the conversation")
            ids, placed = [int(t) for t in expanded.tokens], expanded.images
        if len(ids) >= self.max_len:
            raise ContextFull(f"the conversation needs {len(ids)} tokens and the model holds {self.max_len}; "
                              f"/reset to start over")
        # Keep the longest cached prefix, but always run at least one token: its logits start the reply.
        keep = min(_common_prefix(self.cached, ids), len(ids) - 1)
        if self.loaded.images is not None:
            # An image is fed whole: a prefix ending inside one drops back to its start.
            keep = min([keep] + [r.offset for r in placed if r.offset < keep < r.offset + r.tokens])
            fed = [r for r in placed if r.offset >= keep]
            if fed:
                inputs = model_inputs(self.loaded.model, pixel_inputs(self.loaded, fed, keep), self.device)
        self.cache.rewind(keep)
        self.cached = self.cached[:keep]
        logits = self._feed(ids[keep:], inputs)
        stops, tok = self.loaded.stop_ids, self.loaded.tokenizer
        budget = min(self.max_new_tokens, self.max_len - len(ids))
        new: list[int] = []
        shown = ""
        ended = False
        while len(new) < budget:
            token = int(sample_next(logits[None], self.temperature, self.top_k, self.top_p, self.generator))
            if token in stops:
                ended = True
                break
            new.append(token)
            text_so_far = tok.decode(new)
            if not text_so_far.endswith("\ufffd"):  # hold back a character whose bytes are still arriving
                on_text(text_so_far[len(shown):])
                shown = text_so_far
            if len(new) < budget:
                logits = self._feed([token])
        reply = tok.decode(new)
        on_text(reply[len(shown):])
        self.turns = [*turns, {"role": "assistant", "content": reply}]
        self.images, self.pending = images, []
        truncated = not ended and len(ids) + len(new) >= self.max_len
        return Reply(reply, len(ids) - keep, keep, len(new), time.perf_counter() - start, truncated)

    def _feed(self, ids: list[int], inputs: dict | None = None) -> torch.Tensor:
        """Run ``ids`` after the cached tokens (``inputs``: the images among them); the next-token logits [V] of the
        last one."""
        n = len(self.cached)
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        positions = torch.arange(n, n + len(ids), device=self.device)[None]
        logits = self.loaded.model(tokens, positions, self.cache, **(inputs or {}))[0, -1]
        self.cached.extend(ids)
        return logits


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def run_chat(session: ChatSession, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    """Read user turns from ``stdin`` until /exit or its end; replies stream to ``stdout``, notes to ``stderr``."""
    interactive = stdin.isatty()
    if hasattr(stdin, "reconfigure"):  # bytes that are not UTF-8 come through as lone surrogates, found below
        stdin.reconfigure(errors="surrogateescape")
    line_no = 0
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())

        print(f"chatting with {session.loaded.source} · {COMMANDS}", file=stderr)
    try:
        while True:
            line = _read_line(stdin, interactive)
            if line is None:
                break
            line_no += 1
            text = line.rstrip("\n")
            if not _is_utf8(text):
                print(f"[input line {line_no} is not UTF-8 text; not sent]", file=stderr)
                continue
            if not text.strip():
                continue
            command, _, arg = text.strip().partition(" ")
            if command == "/exit":
                break
            if command == "/reset":
                session.reset()
                print("[conversation reset]", file=stderr)
                continue
            if command == "/image":
                try:
                    session.attach(arg)
                except LongboatError as e:
                    print(f"[{e}]", file=stderr)
                    continue
                print(f"[image {arg} attached to the next message]", file=stderr)
                continue
            if command == "/system":
                session.system = arg or None
                print(f"[system message {'set' if arg else 'removed'}]", file=stderr)
                continue
            if command[:1] == "/" and command[1:].isalpha():
                print(f"[unknown command {command}; commands: {COMMANDS}]", file=stderr)
                continue
            try:
                reply = session.send(text, lambda s: (stdout.write(s), stdout.flush()))
            except ContextFull as e:
                print(f"[context full: {e}]", file=stderr)
                continue
            except LongboatError as e:  # e.g. placeholders typed without their images
                print(f"[{e}]", file=stderr)
                continue
            stdout.write("\n")
            stdout.flush()
            rate = reply.generated / max(reply.seconds, 1e-9)
            print(f"[prefilled {reply.prefilled} tokens, reused {reply.reused} from the cache · {reply.generated} "
                  f"tokens, {rate:.0f} tokens/s]", file=stderr)
            if reply.truncated:
                print("[context full: the reply was cut short; /reset to start over]", file=stderr)
    except KeyboardInterrupt:
        stdout.write("\n")
    return 0


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_line(stdin: TextIO, interactive: bool) -> str | None:
    """The next line, or None at the end of input."""
    if not interactive:
        return stdin.readline() or None
    try:
        return input(">>> ")
    except EOFError:
        print()
        return None
