"""A service written exactly as for Zato, run by zato-testing's ServiceTestCase.

``llmconn.zato.install`` gives Zato's ``Service`` the same ``self.llm``;
the service talks to the fake provider and keeps its chat in a real Redis.
"""

import uuid

import pytest

import llmconn
import llmconn.zato
from llmconn.testing.fake_server import FakeProviderServer

zato_testing = pytest.importorskip('zato_testing')

from zato.server.service import Service  # noqa: E402  (provided by zato_testing's import hook)



class SupportChat(Service):
    """As a Zato author writes it."""

    name = 'zato.demo.support-chat'
    input = 'user_id', 'text'

    def handle(self):
        reply = self.llm['My Claude'].chat(self.request.input.text, chat_id=self.request.input.user_id)
        self.response.payload = {'reply': reply['text']}


class Wrapper(Service):
    """Zato's own invoke reaches a service that uses self.llm."""

    name = 'zato.demo.wrapper'

    def handle(self):
        self.response.payload = self.invoke(SupportChat, {'user_id': self.request.input.user_id,
                                                          'text': self.request.input.text})


@pytest.fixture(scope='class')
def class_redis_url(request, redis_url):
    request.cls.redis_url = redis_url


@pytest.mark.usefixtures('class_redis_url')
class TestZatoService(zato_testing.ServiceTestCase):

    def setUp(self):
        super().setUp()
        if not getattr(type(self), 'registry', None):
            type(self).open(self.redis_url)

    @classmethod
    def open(cls, redis_url):
        cls.fake = FakeProviderServer().start()
        cls.registry = llmconn.Registry.from_dict({
            'redis': {'url': redis_url},
            'llm': [{'name': 'My Claude', 'model': 'claude-sonnet-5-5', 'address': cls.fake.url,
                     'chat_expiry': 60}],
        })
        llmconn.zato.install(cls.registry)

    @classmethod
    def tearDownClass(cls):
        if not getattr(cls, 'registry', None):
            return
        llmconn.zato.uninstall()
        cls.registry.close()
        cls.fake.stop()

    def test_the_service_remembers_the_previous_turn(self):
        user_id = f'zato-{uuid.uuid4().hex}'
        first = self.invoke(SupportChat, {'user_id': user_id, 'text': 'My name is Ann'})
        self.assertIn('users: 1', first.response.payload['reply'])
        second = self.invoke(SupportChat, {'user_id': user_id, 'text': 'What is my name?'})
        self.assertIn('echo: What is my name? | users: 2 | previous: My name is Ann',
                      second.response.payload['reply'])
        self.registry['My Claude'].delete_history(user_id)

    def test_llm_reaches_services_invoked_by_other_services(self):
        user_id = f'zato-{uuid.uuid4().hex}'
        service = self.invoke(Wrapper, {'user_id': user_id, 'text': 'hello'})
        self.assertIn('echo: hello', service.response.payload['reply'])
        self.registry['My Claude'].delete_history(user_id)

    def test_the_facade_is_zatos_service_attribute(self):
        self.assertIs(Service.llm.registry, self.registry)
        self.assertEqual(list(Service.llm), ['My Claude'])


def test_uninstall_restores_zatos_service():
    registry = {'x': 'conn'}
    llmconn.zato.install(registry)
    assert Service.llm['x'] == 'conn'
    llmconn.zato.uninstall()
    assert not hasattr(Service, 'llm')
