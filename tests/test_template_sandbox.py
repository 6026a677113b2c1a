"""Server-side template injection: known payloads are refused and reported, never executed.

Each payload is tried as a request template and as a response template. It
must fail - at load (ConfigError) or when rendered (LLMError naming the
template) - and a payload that would run a shell command must leave no trace.
"""

from __future__ import annotations

import pytest

from llmconn.config import load_dict
from llmconn.errors import ConfigError, LLMError
from llmconn.providers.template import TemplateProvider
from llmconn.types import HTTPAnswer, Request, Turn

RUN = "popen('touch {marker}').read()"

# Collected from public SSTI cheat sheets (PayloadsAllTheThings, HackTricks, jinja2 CVE reports),
# adapted to this context's variable names.
PAYLOADS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ [].__class__.__mro__[-1].__subclasses__() }}",
    "{{ kwargs.__class__.__init__.__globals__ }}",
    "{{ input.messages[0].__class__ }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os." + RUN + " }}",
    "{{ cycler.__init__.__globals__.os." + RUN + " }}",
    "{{ joiner.__init__.__globals__.os." + RUN + " }}",
    "{{ namespace.__init__.__globals__.os." + RUN + " }}",
    "{{ namespace.__mro__ }}",
    "{% set n = namespace() %}{{ n.__init__.__globals__ }}",
    "{% set n = namespace() %}{{ n._Namespace__attrs }}",
    "{{ lipsum.__globals__['os']." + RUN + " }}",
    "{{ range.__self__ }}",
    "{{ dict.__base__ }}",
    "{{ config.__class__.__init__.__globals__['os']." + RUN + " }}",
    "{{ request.application.__globals__.__builtins__.__import__('os')." + RUN + " }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ ''['__class__'] }}",
    "{{ input['__class__'] }}",
    "{{ '{0.__class__.__mro__}'.format(kwargs) }}",
    "{{ '{x.__class__}'.format_map({'x': kwargs}) }}",
    "{{ '%s'|format(kwargs.__class__) }}",
    "{{ '%s'.format.__self__ }}",
    "{{ kwargs.items.__self__ }}",
    "{{ input.messages|map(attribute='__class__')|list }}",
    "{{ input.messages|selectattr('__class__')|list }}",
    "{{ input.messages|sort(attribute='__class__') }}",
    "{{ input.messages|groupby('__class__') }}",
    "{{ input.messages|sum(attribute='__class__') }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{% macro m() %}{% endmacro %}{{ m.__globals__ }}",
    "{% macro m() %}{% endmacro %}{{ m._func.__globals__ }}",
    "{% for x in [1] %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}",
    "{{ (1).__class__.__subclasses__() }}",
    "{{ 'a' * 100000000 }}",
    "{{ [1] * 100000000 }}",
    "{{ 9 ** 99999999 }}",
    "{{ (10 ** 4000) ** 4000 }}",
    "{% set n = namespace(v=10) %}{% for i in [1] * 40 %}{% set n.v = n.v * n.v %}{% endfor %}{{ n.v }}",
    "{{ range(100000000)|list }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}",
    "{% extends '/etc/passwd' %}",
    "{% from 'os' import system %}",
]


def provider(request_template: str, response_template: str = '{}'):
    conf = load_dict({'llm': [{'name': 'SSTI', 'provider': 'template', 'model': 'm',
                               'address': 'http://127.0.0.1:9/run', 'secret': 'sk-never-shown',
                               'request_template': request_template, 'response_template': response_template}]}).llm[0]
    return TemplateProvider(conf)


def refused(payload: str, where: str, marker) -> str:
    """The error a payload raised as the ``where`` template; fails the test if it rendered."""
    payload = payload.replace('{marker}', str(marker))
    try:
        if where == 'request':
            provider(payload).build_request(Request('hi', history=(Turn('a', 'b', meta={'k': 'v'}),)))
        else:
            provider('{}', payload).parse_response(HTTPAnswer(200, {}, '{"id": "x"}'))
    except ConfigError as e:
        return str(e)
    except LLMError as e:
        return str(e)
    pytest.fail(f'rendered without an error: {payload}')


@pytest.mark.parametrize('where', ['request', 'response'])
@pytest.mark.parametrize('payload', PAYLOADS)
def test_known_injection_payloads_are_refused_and_never_executed(payload, where, tmp_path):
    marker = tmp_path / 'executed'
    message = refused(payload, where, marker)
    assert f'{where}_template' in message
    assert 'sk-never-shown' not in message
    assert not marker.exists()


@pytest.mark.parametrize('payload', [p for p in PAYLOADS if '__' in p and 'include' not in p])
def test_reaching_an_internal_attribute_is_reported_as_a_sandbox_refusal(payload, tmp_path):
    message = refused(payload, 'request', tmp_path / 'executed')
    # Refused outright, or the global or attribute it starts from does not exist here.
    assert any(words in message for words in ('the sandbox refused', 'is undefined', 'has no attribute')), message


def test_the_only_global_is_namespace():
    from llmconn.providers.template_sandbox import environment
    assert set(environment().globals) == {'namespace'}


def test_ordinary_arithmetic_still_works():
    assert provider('{"a": {{ 2 ** 10 }}, "b": {{ -3 * 4 }}, "c": {{ 2.5 ** 2 }}, "d": {{ ("ab" * 3) | tojson }}, '
                    '"e": {{ [0] * 2 }}, "f": {{ 2 ** -1 }}}').build_request(Request('hi')) == \
        {'a': 1024, 'b': -12, 'c': 6.25, 'd': 'ababab', 'e': [0, 0], 'f': 0.5}


def test_building_lists_as_the_seed_adapters_do_still_works():
    # SandboxedEnvironment, not the immutable one: .extend and .append on a local list are allowed.
    body = provider('{% set xs = [] %}{% set _ = xs.extend([1, 2]) %}{% do xs.append(3) %}'
                    '{% set n = namespace(k=0) %}{% for x in xs %}{% set n.k = n.k + x %}{% endfor %}'
                    '{"xs": {{ xs | tojson }}, "sum": {{ n.k }}}').build_request(Request('hi'))
    assert body == {'xs': [1, 2, 3], 'sum': 6}
