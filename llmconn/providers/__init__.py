"""The provider registry: an explicit dict from the ``provider:`` name to its mapping class.

OpenAI-compatible servers (Ollama, vLLM, LiteLLM, ...) are not classes of
their own: they are the ``openai`` provider with another ``address``.
Everything a caller needs to know about a provider kind is a method of its
class (:class:`~llmconn.providers.base.Provider`); the gateway's capability
matrix takes its columns from this dict, in this order, so adding a
provider means a module here and its capability row, nothing else.
"""

from __future__ import annotations

from llmconn.providers.base import Provider
from llmconn.providers.claude import ClaudeProvider
from llmconn.providers.gemini import GeminiProvider
from llmconn.providers.openai import OpenAIProvider
from llmconn.providers.openai_responses import OpenAIResponsesProvider
from llmconn.providers.template import TemplateProvider

PROVIDERS: dict[str, type[Provider]] = {
    'openai-responses': OpenAIResponsesProvider,
    'openai': OpenAIProvider,
    'claude': ClaudeProvider,
    'gemini': GeminiProvider,
    'template': TemplateProvider,
}

__all__ = ['PROVIDERS', 'Provider']
