"""A chat template's render is bounded: a template that loops for ever, writes without end or builds a huge value
fails with a ``ChatTemplateError`` in bounded time, and ordinary templates render as they did."""

from __future__ import annotations

import threading
import time

import pytest

from longboat.data.chat import ChatTemplate, ChatTemplateError
from longboat.data.chat.bounds import MAX_CHARS

HELLO = [{"role": "user", "content": "Hello"}]
LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.timeout(60)
def test_a_template_that_loops_is_stopped_at_its_deadline():
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="ran past its limit of 2 s"):
        ChatTemplate(LOOP).render(HELLO)
    assert time.monotonic() - start < 10


@pytest.mark.timeout(60)
def test_exponential_recursion_is_stopped_in_any_thread():
    template = ChatTemplate("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                            "{{ f(60) }}")
    errors = []

    def render():
        try:
            template.render(HELLO)
        except ChatTemplateError as e:
            errors.append(str(e))

    thread = threading.Thread(target=render)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(errors) == 1 and "ran past its limit" in errors[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", [
    "{{ 'x' * 10**10 }}",                                   # repetition
    "{{ ['x'] * 9999999999 }}",
    "{{ 2 ** 10000000 }}",                                  # a huge integer
    "{% set ns = namespace(a=2 ** 4000) %}{% for i in range(64) %}{% set ns.a = ns.a * ns.a %}{% endfor %}",
    "{{ [1] | batch(9999999999, 'x') | list }}",           # padding a batch
    "{{ messages | tojson(indent=9999999999) }}",
    "{{ '{0:{1}}'.format(1, 9999999999) }}",                # a width taken from an argument
    "{{ 'x'.ljust(9999999999) }}",                          # padding
    "{{ 'x'|center(9999999999) }}",
    "{{ '%9999999999d' % 1 }}",                             # a format's width
    "{{ '{:>9999999999}'.format(1) }}",
    "{% set a = 'x' * 1000000 %}{{ ([a] * 1000)|join }}",  # joining many copies
    "{% set a = 'x' * 1000000 %}{{ a.replace('x', a) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  # doubling
    "{% macro d(s) %}{{ d(s ~ s) }}{% endmacro %}{{ d('x') }}",
    "{% set a = 'x' * 10000000 %}{% set b = a ~ a %}{% set c = b + b %}",
    "{% set a = ['x' * 1000] * 4000 %}{% set b = [a] * 4000 %}{{ b }}",  # nested lists, written by str()
    "{% set a %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}",  # buffered output
    "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}{{ m() }}",
])
def test_a_huge_value_is_refused(source):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="limit"):
        ChatTemplate(source).render(HELLO)
    assert time.monotonic() - start < 10


@pytest.mark.timeout(60)
def test_output_past_the_limit_is_refused():
    bomb = ChatTemplate("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match=f"output passed the limit of {MAX_CHARS:,} characters"):
        bomb.render(HELLO)


def test_a_template_that_raises_fails_in_one_line():
    with pytest.raises(ChatTemplateError, match="the render failed: ZeroDivisionError: division by zero"):
        ChatTemplate("{{ 1 / 0 }}").render(HELLO)


def test_ordinary_templates_render_unchanged():
    template = ChatTemplate(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ '<|' ~ m['role'] ~ '|>' }}{{ (m['content'] * 2) | center(12) }}{{ '%03d' % ns.n }}{% endfor %}"
        "{{ messages | map(attribute='role') | join(', ') }}{{ 2 ** 10 }}{{ ' {:>4}'.format(7) }}",
        {"bos_token": "<s>"})
    assert template.render(HELLO) == "<|user|>" + "HelloHello".center(12) + "001user1024    7"


@pytest.mark.timeout(60)
def test_nesting_that_doubles_through_shared_references_is_refused():
    source = ("{% set ns = namespace(v='x' * 1000) %}{% for i in range(40) %}{% set ns.v = [ns.v, ns.v] %}"
              "{% endfor %}{{ ns.v }}")
    with pytest.raises(ChatTemplateError, match="limit"):
        ChatTemplate(source).render(HELLO)
