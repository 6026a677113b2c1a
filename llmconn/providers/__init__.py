"""The provider registry: an explicit dict from the ``provider:`` name to its mapping class.

OpenAI-compatible servers (Ollama, vLLM, LiteLLM, ...) are not classes of
their own: they are the ``openai`` provider with another ``address``.
"""

from __future__ import annotations

from llmconn.providers.base import Provider
from llmconn.providers.claude import ClaudeProvider
from llmconn.providers.gemini import GeminiProvider
from llmconn.providers.openai import OpenAIProvider
from llmconn.providers.openai_responses import OpenAIResponsesProvider
from llmconn.providers.template import TemplateProvider

PROVIDERS: dict[str, type[Provider]] = {
    'claude': ClaudeProvider,
    'openai': OpenAIProvider,
    'openai-responses': OpenAIResponsesProvider,
    'gemini': GeminiProvider,
    'template': TemplateProvider,
}

__all__ = ['PROVIDERS', 'Provider']
