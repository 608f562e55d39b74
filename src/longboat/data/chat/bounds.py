"""Limits on a chat template's render: time, output size and the size of any value it builds.

A chat template is code from a model repository. Jinja's sandbox bounds what it may touch, not what it may spend,
so ``BoundedSandbox`` refuses before allocating what would exceed ``MAX_CHARS`` (repetition with ``*``, a large
``**``, format widths, padding, ``replace``, ``join``, ``indent``), and checks every value a template keeps
(assignments), passes to a call or gets from a call or filter, and the output macros and blocks buffer;
``deadline`` stops a render that runs past its time (loops, recursion) from a watchdog thread
(``longboat.utils.deadline``), which costs a render a dict entry rather than a trace of its lines;
``render_bounded`` stops the output past ``MAX_CHARS`` while it streams.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from longboat.errors import LongboatError
from longboat.utils.deadline import time_limit

MAX_CHARS = 16 << 20  # the most characters a render writes, and the most any value it builds would write
MAX_SECONDS = 2.0  # a render's time; real templates take well under a millisecond a conversation
MAX_INT_BITS = 1 << 16  # the largest integer ``*`` or ``**`` may make (python writes at most 4,300 digits anyway)
_NUMBER = re.compile(r"\d+")
_NESTED_FIELD = re.compile(r"\{[^{}]*:[^{}]*\{")  # a format spec holding a replacement field: {0:{1}}


class TemplateLimitError(LongboatError, ValueError):
    """A chat template went past a limit on its render's time, output or values."""


_SIZED = (str, bytes, list, tuple, dict)


def weight(value: Any, limit: int = MAX_CHARS) -> int:
    """About the characters ``str(value)`` writes: a string's length; a collection's items counted through all
    its nesting, each distinct collection weighed once however often it is referenced. Counting stops past
    ``limit``; a nesting too deep to weigh counts as past it."""
    if isinstance(value, (str, bytes)):
        return len(value)
    try:
        return _walk(value, {}, limit)
    except RecursionError:
        return limit + 1


def _walk(item: Any, memo: dict[int, int], limit: int) -> int:
    """``weight`` of ``item``; ``memo``: id -> weight of the collections met (alive while the value weighed is)."""
    if not isinstance(item, (list, tuple, dict)):
        return len(item) if isinstance(item, (str, bytes)) else 1
    known = memo.get(id(item))
    if known is not None:
        return known
    total = 1
    if isinstance(item, dict):
        for key, child in item.items():
            total += len(key) if type(key) is str else _walk(key, memo, limit)
            total += len(child) if type(child) is str else _walk(child, memo, limit)  # strings inline: most are
            if total > limit:
                break
    else:
        for child in item:
            total += len(child) if type(child) is str else _walk(child, memo, limit)
            if total > limit:
                break
    memo[id(item)] = total
    return total


def check_size(value: Any, what: str = "a value") -> Any:
    """``value``, or an error when it would write more than ``MAX_CHARS`` characters (``weight``)."""
    if type(value) is str:  # the common case, at the cost of a length
        if len(value) > MAX_CHARS:
            _refuse_over(len(value), what)
        return value
    if isinstance(value, _SIZED) and len(value) and weight(value) > MAX_CHARS:
        _refuse_over(weight(value), what)
    return value


def _refuse_over(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise TemplateLimitError(f"{what} would make {size:,} characters or items, more than the limit of "
                                 f"{MAX_CHARS:,}")


def _check_widths(fmt: Any, args: Any, what: str) -> None:
    """Printf and ``str.format`` widths and precisions within the limit: digits in the format, and the arguments
    when the format takes widths from them (``%*d``, ``{0:{1}}``)."""
    fmt = fmt if isinstance(fmt, str) else str(fmt)
    numbers = [int(n) for n in _NUMBER.findall(fmt)]
    if "*" in fmt or _NESTED_FIELD.search(fmt):
        values = args if isinstance(args, (tuple, list)) else (args,)
        numbers += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    _refuse_over(max(numbers, default=0), what)


def _checked_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, _SIZED) and isinstance(n, int):
                _refuse_over(weight(seq) * max(n, 0), f"repeating a value {n:,} times")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"a product of integers larger than the limit of {MAX_INT_BITS:,} bits")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if max(abs(left), 1).bit_length() * right > MAX_INT_BITS:
            raise TemplateLimitError(f"a power of integers larger than the limit of {MAX_INT_BITS:,} bits")
    elif operator == "%" and isinstance(left, str):
        _check_widths(left, right, "formatting with '%'")


def _checked_method(method: Any, args: tuple, kwargs: dict) -> None:
    """Refuse a ``str`` method call whose result would exceed the limit, before it runs."""
    method = getattr(method, "__wrapped__", method)  # the sandbox wraps str.format in a function of its own
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return
    values = [*args, *kwargs.values()]
    if name in ("ljust", "rjust", "center", "zfill") and values and isinstance(values[0], int):
        _refuse_over(values[0], f"str.{name}")
    elif name == "expandtabs":
        _refuse_over(len(owner) * (values[0] if values and isinstance(values[0], int) else 8), "str.expandtabs")
    elif name == "replace" and len(values) >= 2 and isinstance(values[0], str) and isinstance(values[1], str):
        hits = len(owner) + 1 if not values[0] else owner.count(values[0])
        _refuse_over(len(owner) + hits * len(values[1]), "str.replace")
    elif name == "join" and values:
        _refuse_over(_joined_size(owner, values[0]), "str.join")
    elif name in ("format", "format_map"):
        _check_widths(owner, values, f"str.{name}")


def _joined_size(separator: str, items: Any) -> int:
    if not isinstance(items, (list, tuple)):
        return 0  # a generator: each item it makes was bounded as it was made
    return weight(items) + len(separator) * len(items)


MAX_JSON_INDENT = 1024  # ``tojson(indent=...)``: it is written once per nested line


def _filter_bounds(name: str, value: Any, rest: list) -> None:
    """Refuse, before it runs, a filter whose result would exceed the limit (those whose arguments multiply)."""
    ints = [v for v in rest if isinstance(v, int) and not isinstance(v, bool)]
    if name == "center":
        _refuse_over(max(ints, default=0), "the 'center' filter")
    elif name == "indent":
        width = next((len(v) if isinstance(v, str) else v for v in rest[:1] if isinstance(v, (int, str))), 4)
        text = str(value)
        _refuse_over(len(text) + (text.count("\n") + 1) * max(width, 0), "the 'indent' filter")
    elif name == "wordwrap":
        wrap = max((len(v) for v in rest if isinstance(v, str)), default=1)
        _refuse_over(len(str(value)) * (wrap + 1), "the 'wordwrap' filter")
    elif name == "join":
        sep = next((v for v in rest[:1] if isinstance(v, str)), "")
        _refuse_over(_joined_size(sep, value), "the 'join' filter")
    elif name == "replace" and len(rest) >= 2:
        _checked_method(str(value).replace, (str(rest[0]), str(rest[1])), {})
    elif name == "format":
        _check_widths(value, rest, "the 'format' filter")
    elif name in ("batch", "slice"):
        _refuse_over(max(ints, default=0), f"the '{name}' filter")
    elif name == "tojson":
        indent = max([*ints, *(len(v) for v in rest if isinstance(v, str))], default=0)
        if indent > MAX_JSON_INDENT:
            raise TemplateLimitError(f"tojson's indent is larger than the limit of {MAX_JSON_INDENT}")


_AMPLIFYING = frozenset({"center", "indent", "wordwrap", "join", "replace", "format", "tojson", "batch", "slice"})


def _bounded_filter(name: str, func: Callable) -> Callable:
    """``func`` with its arguments checked first (``_filter_bounds``, for filters whose arguments multiply their
    output) and its result after."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # the context, eval context or environment
    amplifies = name in _AMPLIFYING

    def bounded(*args: Any, **kwargs: Any) -> Any:
        if amplifies and len(args) > skip:
            _filter_bounds(name, args[skip], [*args[skip + 1:], *kwargs.values()])
        result = func(*args, **kwargs)
        if isinstance(result, _SIZED) and len(result) > MAX_CHARS:
            check_size(result, f"the result of the '{name}' filter")
        return result

    bounded.__dict__.update(getattr(func, "__dict__", {}))  # keeps jinja's pass_context / pass_eval_context marker
    return bounded


_CHECKED = "longboat_checked"  # the filter that checks a value as it is kept


def _check_kept_values(template: nodes.Template) -> nodes.Template:
    """Every value a template keeps (``{% set %}``, a namespace attribute, ``{% with %}``) goes through the
    ``_CHECKED`` filter as it is assigned. Within one expression ``+`` and ``~`` grow a value only as many times
    as the source repeats them, so they run unchecked (and fast); what the value is then kept as is checked."""
    for node in template.find_all(nodes.Assign):
        node.node = nodes.Filter(node.node, _CHECKED, [], [], None, None, lineno=node.lineno)
    for node in template.find_all(nodes.With):
        node.values = [nodes.Filter(v, _CHECKED, [], [], None, None, lineno=v.lineno) for v in node.values]
    return template


def _bounded_concat(parts: Iterable[str]) -> str:
    """``environment.concat``, which joins the output a macro or a ``{% set %}`` block buffers: sized first."""
    parts = list(parts)
    _refuse_over(sum(map(len, parts)), "a macro's or block's output")
    return "".join(parts)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox whose operators, calls, filters and assignments refuse values past ``MAX_CHARS``."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, filters: dict[str, Callable] | None = None, **options: Any):
        super().__init__(**options)
        self.filters.update(filters or {})
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_CHECKED] = lambda value: check_size(value, "a value assigned")
        self.concat = _bounded_concat

    def _generate(self, source, name, filename, defer_init=False):  # jinja's hook between parsing and compiling
        if isinstance(source, nodes.Template):
            source = _check_kept_values(source)
        return super()._generate(source, name, filename, defer_init)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _checked_binop(operator, left, right)
        return check_size(super().call_binop(context, operator, left, right), f"the result of '{operator}'")

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        for value in args:
            check_size(value, "an argument")
        for value in kwargs.values():
            check_size(value, "an argument")
        _checked_method(__obj, args, kwargs)
        return check_size(super().call(__context, __obj, *args, **kwargs), "the result of a call")


@contextmanager
def deadline(seconds: float = MAX_SECONDS) -> Iterator[None]:
    """Raise ``TemplateLimitError`` in this thread when its block runs past ``seconds``: template loops and
    recursion stop wherever they are (a single call into C, bounded by the size limits, finishes first)."""
    with time_limit(seconds, lambda: TemplateLimitError(f"the render ran past its limit of {seconds:g} s")):
        yield


def render_bounded(chunks: Iterator[str]) -> str:
    """Join a template's streamed output, refusing it once it passes ``MAX_CHARS``."""
    out, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_CHARS:
            raise TemplateLimitError(f"the render's output passed the limit of {MAX_CHARS:,} characters")
        out.append(chunk)
    return "".join(out)
