"""llmconn: LLM connections for Zato-style services.

    registry = llmconn.Registry.from_file('etc/llm.yaml')
    reply = registry['My Claude'].chat('Hello', chat_id='user-1')

History lives in a shared Redis, calls to one chat are serialized by a
distributed lock, and every provider speaks its real wire format.
"""

from llmconn.errors import (ChatBusy, ConfigError, InactiveConnection, InvalidInput, LLMAuthError, LLMConnError,
                            LLMError, LLMRateLimited, LLMTimeout, LockLost, ServiceError, StoreError,
                            ToolLoopLimit, UnknownConnection, UnknownService)
from llmconn.registry import Registry
from llmconn.tools import Tool
from llmconn.types import Event

__version__ = '0.1.0'

__all__ = ['Registry', 'Event', 'Tool', 'ToolLoopLimit', 'LLMConnError', 'ConfigError', 'InvalidInput', 'UnknownConnection',
           'InactiveConnection', 'LLMError', 'LLMTimeout', 'LLMRateLimited', 'LLMAuthError', 'ChatBusy',
           'StoreError', 'LockLost', 'ServiceError', 'UnknownService']
