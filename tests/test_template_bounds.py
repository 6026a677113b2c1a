"""A template cannot build a huge value in one expression: each is refused before it is built.

Before these bounds, ``'%400000000s' % 'x'`` and its kin each built about
440 MB (and took seconds) before the render cap looked at the result. Each
payload here must fail with a sandbox refusal, quickly, having allocated
almost nothing: tracemalloc's peak tells whether the value was built.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from llmconn.providers.template_sandbox import RenderError, compile_template, environment, render

AMPLIFIERS = {
    'percent width': "{{ '%400000000s' % 'x' }}",
    'percent precision': "{{ '%.400000000f' % 1.5 }}",
    'percent star': "{{ '%*s' % (400000000, 'x') }}",
    'percent negative star': "{{ '%-*s' % (-400000000, 'x') }}",
    'percent star precision': "{{ '%.*f' % (400000000, 1.5) }}",
    'percent key': "{{ '%(a)400000000s' % {'a': 'x'} }}",
    'format filter': "{{ '%400000000s'|format('x') }}",
    'format filter star': "{{ '%*s'|format(400000000, 'x') }}",
    'str.format width': "{{ '{:400000000}'.format('x') }}",
    'str.format fill': "{{ '{:x>400000000}'.format('x') }}",
    'str.format precision': "{{ '{:.400000000f}'.format(1.5) }}",
    'str.format nested': "{{ '{:{w}}'.format('x', w=400000000) }}",
    'format_map width': "{{ '{a:400000000}'.format_map({'a': 'x'}) }}",
    'replace method': "{{ ('x' * 1000000).replace('x', 'y' * 440) }}",
    'replace empty': "{{ ('x' * 1000000).replace('', 'y' * 440) }}",
    'replace filter': "{{ ('x' * 1000000)|replace('x', 'y' * 440) }}",
    'join method': "{{ ('y' * 440).join('x' * 1000000) }}",
    'join filter': "{{ ('x' * 1000000)|join('y' * 440) }}",
    'join of a big item': "{% set b = 'y' * 1000000 %}{{ [b, b, b, b, b, b, b, b, b, b, b]|join }}",
    'join with attribute': "{% set b = 'y' * 1000000 %}{% set d = {'a': b} %}{{ [d, d, d, d, d, d, d, d, d, d, d]|join(attribute='a') }}",
    'list repeat of a big item': "{{ (['y' * 1000000] * 1000)|length }}",
    'format many fields': "{{ ('{0}' * 300000).format('y' * 1000) }}",
    'percent many fields': "{{ ('%(a)s' * 200000) % {'a': 'y' * 1000} }}",
    'percent many positional': "{% set b = 'y' * 1000000 %}{{ ('%s' * 11) % (b, b, b, b, b, b, b, b, b, b, b) }}",
    'tilde': "{% set b = 'y' * 1000000 %}{{ b ~ b ~ b ~ b ~ b ~ b ~ b ~ b ~ b ~ b ~ b }}",
    'plus doubling': "{% set n = namespace(s='y' * 1000000) %}{% for i in 'x' * 40 %}{% set n.s = n.s + n.s %}{% endfor %}",
    'tilde doubling': "{% set n = namespace(s='y' * 1000000) %}{% for i in 'x' * 40 %}{% set n.s = n.s ~ n.s %}{% endfor %}",
    'set block': "{% set b = 'y' * 1000000 %}{% set s %}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{{ b }}{% endset %}",
    'render output': "{% set b = 'y' * 1000000 %}" + "{{ b }}" * 11,
    'indent string': "{{ ('a\\n' * 1000000)|indent('y' * 440) }}",
    'tojson indent': "{{ [[1, 2], [3, 4]]|tojson(indent=400000000) }}",
    'batch fill': "{{ 'abc'|batch(400000000, 'x')|list }}",
    'slice': "{{ 'abc'|slice(400000000)|list }}",
}


def rendered(source: str) -> str:
    return render(compile_template(environment(), source, 'request_template'), 'request_template', {})


@pytest.mark.parametrize('source', AMPLIFIERS.values(), ids=list(AMPLIFIERS))
def test_an_amplifying_expression_is_refused_fast_without_building_it(source):
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(RenderError, match='request_template.*the sandbox refused'):
            rendered(source)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The inputs themselves are up to ~1 MB ('x' * 1000000, a list of 440 references); the refused value
    # would have been 440 MB. Generous bounds: a loaded machine, tracemalloc's own overhead.
    assert peak < 40 * 1024 * 1024, f'{peak / 1e6:.0f} MB allocated'
    assert elapsed < 5, elapsed


ORDINARY = {
    "{{ '%5s|%-3d|%.2f|%%' % ('a', 7, 1.234) }}": '    a|7  |1.23|%',
    "{{ '%*s' % (4, 'b') }}": '   b',
    "{{ '%(k)s' % {'k': 'v'} }}": 'v',
    "{{ '%s-%s'|format('a', 'b') }}": 'a-b',
    "{{ '{:>6}|{:.1f}|{:0>3}'.format('r', 2.25, 7) }}": '     r|2.2|007',
    "{{ '{:{w}}|'.format('x', w=3) }}": 'x  |',
    "{{ 'a-b-c'.replace('-', ', ') }}": 'a, b, c',
    "{{ 'a-b'|replace('-', '+', 1) }}": 'a+b',
    "{{ ', '.join(['a', 'b']) }}": 'a, b',
    "{{ [1, 2, 3]|join('+') }}": '1+2+3',
    "{{ [{'n': 'x'}, {'n': 'y'}]|join('/', attribute='n') }}": 'x/y',
    "{{ 'a\\nb'|indent(2, first=true) }}": '  a\n  b',
    "{{ {'a': 1}|tojson(indent=2) }}": '{\n  "a": 1\n}',
    "{{ 'abcde'|batch(2, '-')|list }}": "[['a', 'b'], ['c', 'd'], ['e', '-']]",
    "{{ 'abcd'|slice(2)|list }}": "[['a', 'b'], ['c', 'd']]",
    "{{ 7 % 3 }}": '1',
    "{{ 'a' ~ 1 ~ 'b' }}": 'a1b',
    "{{ 'ab' + 'cd' }}|{{ [1] + [2] }}|{{ 1 + 2 }}": 'abcd|[1, 2]|3',
    "{% set x %}hi {{ 1 }}{% endset %}{{ x }}": 'hi 1',
    "{% macro m(a) %}<{{ a }}>{% endmacro %}{{ m(1) }}{{ m('b') }}": '<1><b>',
    "{% filter upper %}up{% endfilter %}": 'UP',
}


@pytest.mark.parametrize('source, expected', ORDINARY.items(), ids=list(ORDINARY))
def test_ordinary_formatting_still_renders(source, expected):
    assert rendered(source) == expected
