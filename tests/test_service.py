"""Service as a Zato author knows it: names, input/output, hooks, invoke, the llm facade."""

import logging

import pytest

from llmconn.errors import InvalidInput
from llmconn.service import LLM, Service, UnknownService, convert_impl_name, parse_io, run


class Recorder(Service):
    name = 'test.recorder'
    input = 'text', '-chat_id'

    def before_handle(self):
        self.calls = ['before']

    def handle(self):
        self.calls.append('handle')
        self.response.payload = {'text': self.request.input.text, 'chat_id': self.request.input.chat_id}

    def after_handle(self):
        self.calls.append('after')


class Declared(Service):
    name = 'test.declared'
    output = 'reply', '-usage'

    def handle(self):
        self.response.payload = {'reply': 'hi', 'raw': {'secret-ish': 'provider detail'}}


class Broken(Service):
    name = 'test.broken-output'
    output = 'reply',

    def handle(self):
        self.response.payload = {'text': 'no reply key'}


class Caller(Service):
    name = 'test.caller'

    def handle(self):
        by_name = self.invoke('test.recorder', {'text': 'by name'})
        by_class = self.invoke(Recorder, text='by class')
        self.response.payload = [by_name, by_class]


class MyLLMService(Service):
    pass


def test_derived_name_follows_zato_convention():
    assert convert_impl_name('my_module.MyService') == 'my-module.my-service'
    assert convert_impl_name('a.b_c.GetHTTPData') == 'a.b-c.get-http-data'
    assert convert_impl_name('x.My_Service') == 'x.my_service'
    assert MyLLMService.get_name() == f'{convert_impl_name(__name__ + ".MyLLMService")}'
    assert MyLLMService.get_name().endswith('.my-llm-service')


def test_explicit_name_is_not_inherited_by_subclasses():
    class Child(Recorder):
        pass
    assert Recorder.get_name() == 'test.recorder'
    assert Child.get_name().endswith('.child')


def test_parse_io_marks_optional_fields_with_a_leading_dash():
    assert parse_io(('text', '-chat_id')) == (('text',), ('chat_id',))
    assert parse_io('text') == (('text',), ())
    assert parse_io(None) == ((), ())
    with pytest.raises(TypeError):
        parse_io(('text', '-'))


def test_hooks_run_in_order_and_input_reads_as_attributes():
    service = Recorder()
    response = run(service, {'text': 'hello', 'ignored': 1})
    assert service.calls == ['before', 'handle', 'after']
    assert response.payload == {'text': 'hello', 'chat_id': None}
    assert service.request.payload == {'text': 'hello', 'ignored': 1}


def test_missing_required_input_names_the_field():
    with pytest.raises(InvalidInput, match='text'):
        run(Recorder(), {'chat_id': 'c1'})
    with pytest.raises(InvalidInput, match='JSON object'):
        run(Recorder(), ['not', 'an', 'object'])


def test_declared_output_keeps_only_its_fields():
    assert run(Declared(), None).payload == {'reply': 'hi'}


def test_missing_required_output_is_a_server_error_not_the_callers():
    with pytest.raises(RuntimeError, match='reply'):
        run(Broken(), None)


def test_invoke_by_name_and_by_class_shares_the_cid():
    services = {'test.recorder': Recorder}

    def lookup(name):
        if name not in services:
            raise UnknownService(name)
        return services[name]

    caller = Caller(registry={}, cid='cid-1', invoker=lookup)
    payload = run(caller, None).payload
    assert payload == [{'text': 'by name', 'chat_id': None}, {'text': 'by class', 'chat_id': None}]
    assert caller.cid == 'cid-1'


def test_invoke_of_an_unknown_name_raises_unknown_service():
    def lookup(name):
        raise UnknownService(f'no service named {name!r}')

    caller = Caller(invoker=lookup)
    with pytest.raises(UnknownService):
        run(caller, None)


def test_llm_facade_looks_up_the_current_registry():
    current = {'registry': {'A': 'conn-a'}}
    llm = LLM(lambda: current['registry'])
    assert llm['A'] == 'conn-a' and 'A' in llm and list(llm) == ['A'] and len(llm) == 1
    current['registry'] = {'B': 'conn-b'}
    assert llm['B'] == 'conn-b' and 'A' not in llm


def test_service_llm_is_bound_to_the_given_registry():
    service = Recorder(registry={'My Claude': 'the connection'})
    assert service.llm['My Claude'] == 'the connection'


def test_logger_is_named_after_the_service_and_cid_is_unique():
    first, second = Recorder(), Recorder()
    assert isinstance(first.logger, logging.Logger) and first.logger.name == 'test.recorder'
    assert first.cid and first.cid != second.cid


def test_response_stream_keeps_the_events_for_the_host():
    service = Recorder()
    events = iter(['a', 'b'])
    service.response.stream(events)
    assert service.response.events is events
