"""Give Zato services the same ``self.llm`` as llmconn's own services.

    import llmconn, llmconn.zato
    registry = llmconn.Registry.from_file('etc/llm.yaml')
    llmconn.zato.install(registry)

    # then, in any Zato service:
    class MyService(Service):
        def handle(self):
            reply = self.llm['My Claude'].chat(self.request.input.text, chat_id=self.request.input.user_id)

Works with a real Zato server and with the ``zato-testing`` package (whose
import hook provides ``zato.server.service`` for ``ServiceTestCase``).
The facade is a class attribute of Zato's ``Service``, so every service
instance sees it, including those Zato creates for ``self.invoke``.
"""

from __future__ import annotations

from typing import Any

from llmconn.service import LLM

_ABSENT = object()
_saved: dict[type, Any] = {}    # a class's own ``llm`` before install(), restored by uninstall()


def zato_service_class() -> type:
    """Zato's ``Service``: from a Zato server, else from zato-testing (which must be imported first)."""
    try:
        from zato.server.service import Service
        return Service
    except ImportError:
        pass
    try:
        import zato_testing  # noqa: F401  (installs the import hook that provides zato.server.service)
        from zato.server.service import Service
        return Service
    except ImportError:
        raise ImportError('neither Zato nor zato-testing is installed; run inside a Zato server or '
                          'pip install zato-testing') from None


def install(registry: Any, service_class: type | None = None) -> LLM:
    """Attach ``llm`` (bound to ``registry``, a Registry or a callable returning one) to Zato's Service."""
    cls = service_class or zato_service_class()
    _saved.setdefault(cls, cls.__dict__.get('llm', _ABSENT))
    facade = LLM(registry)
    cls.llm = facade
    return facade


def uninstall(service_class: type | None = None) -> None:
    """Put back what ``Service.llm`` was before :func:`install`."""
    cls = service_class or zato_service_class()
    previous = _saved.pop(cls, _ABSENT)
    if previous is not _ABSENT:
        cls.llm = previous
    elif 'llm' in cls.__dict__:
        delattr(cls, 'llm')
