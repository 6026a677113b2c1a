"""The capability matrix: per route and provider kind, what becomes of each request field.

Every field a client may send is listed here, per route, with one
:class:`Support` per provider kind: ``native`` (the backend does it),
``emulated`` (the gateway does it, with no loss unless ``loss`` says so) or
``unsupported``. An unsupported field is a 400 naming it, unless the
request's ``fallback_policy`` names the field's ``loss``: then it is dropped,
and the answer carries the loss in ``metadata["llmconn_downgrades"]``. A
field without a loss name can never be dropped (tools: dropping them would
answer a different question). A field whose value is a no-op (``n: 1``,
``tool_choice: "auto"`` without tools) is accepted on every backend.

Structural fields (input, tools, stream, ...) are the route's own business,
but a structural field a kind does not support is refused all the same: a
``template`` endpoint (SPEC §12) renders one whole text answer from the
messages, so it gets no tools, and the function calls and outputs of a
conversation cannot reach it either.

``docs/gateway.md``'s compatibility tables are generated from this data
(:mod:`llmconn.gateway.docs`); a test keeps the two equal. Fields not listed
are refused as unknown (:func:`llmconn.gateway.policy.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from llmconn.gateway import values
from llmconn.gateway.values import Mapper
from llmconn.providers import PROVIDERS


NATIVE, EMULATED, UNSUPPORTED = 'native', 'emulated', 'unsupported'
KINDS = tuple(PROVIDERS)        # the matrix's columns: every provider kind, nothing else to keep in step
TEMPLATE = 'template'       # an endpoint described by two Jinja2 templates (SPEC §12): one whole text answer
RESPONSES, CHAT = 'responses', 'chat.completions'

# Loss names a client can allow (the vocabulary of fallback_policy.allowed_losses).
LOSSES = {
    'sampling_params_ignored': 'temperature / top_p / penalties / seed are not sent',
    'max_output_tokens_ignored': 'the connection\'s max_tokens applies instead',
    'reasoning_settings_ignored': 'reasoning effort is the connection\'s configuration, not the request\'s',
    'output_format_not_enforced': 'a JSON format is not enforced by the backend',
    'stop_ignored': 'stop sequences are not sent',
    'hint_ignored': 'user / cache / safety / service-tier hints are not forwarded',
    'include_ignored': 'extra output data asked for by include is not returned',
    'no_logprobs': 'log probabilities are not returned',
    'no_auto_truncation': 'input is not truncated to fit; an overlong input fails',
    'not_stored': 'the completion is not stored (this route is stateless)',
    'system_messages_hoisted': 'system/developer messages after the first turn move into the system prompt',
    'messages_merged': 'consecutive messages of one role are joined into one',
    'no_reasoning_summary': 'no reasoning summary is returned',
    'verbosity_ignored': 'the verbosity asked for is not sent; the model answers at its own length',
}



@dataclass(frozen=True)
class Support:
    """How one provider kind handles one field."""

    level: str
    how: str = ''
    loss: str = ''                       # the loss name that lets an unsupported field be dropped
    to_params: Mapper | None = None      # request value -> provider body params


@dataclass(frozen=True)
class Field:
    """One request field of a route: how each kind treats it, and which values are no-ops."""

    name: str
    support: dict[str, Support]
    trivial: Callable[[Any], bool] = field(default=lambda value: value is None)
    structural: bool = False             # handled by the route itself (input, store, ...)
    # A part of another field (``reasoning.summary``, ``tools[].strict``): its value read from the body.
    part_of: Callable[[dict], Any] | None = None


def _same(level: str, how: str = '', loss: str = '', to_params: Mapper | None = None) -> dict[str, Support]:
    return {kind: Support(level, how, loss, to_params) for kind in KINDS}


def _but(support: dict[str, Support], **kinds: Support) -> dict[str, Support]:
    """``support`` with some kinds' entries replaced (``template=...``)."""
    return {**support, **kinds}


# A template endpoint sees only the messages (input.messages) and the connection's params: whatever else
# a request asks for, the gateway cannot know the templates honour it, so it is not claimed.
_TEMPLATE_DECIDES = 'the connection\'s templates decide what is sent'


def _sampling(name: str, gemini: str, kinds=('openai-responses', 'openai', 'claude', 'gemini')) -> dict:
    support = {}
    for kind in KINDS:
        if kind not in kinds:
            how = _TEMPLATE_DECIDES if kind == TEMPLATE else ''
            support[kind] = Support(UNSUPPORTED, how, 'sampling_params_ignored')
        elif kind == 'gemini':
            support[kind] = Support(NATIVE, f'generationConfig.{gemini}', to_params=values.generation(gemini))
        else:
            support[kind] = Support(NATIVE, to_params=values.param(name))
    return support


def _max_tokens() -> dict:
    return {'openai-responses': Support(NATIVE, 'max_output_tokens', to_params=values.param('max_output_tokens')),
            'openai': Support(NATIVE, 'max_tokens', to_params=values.param('max_tokens')),
            'claude': Support(NATIVE, 'max_tokens', to_params=values.param('max_tokens')),
            'gemini': Support(NATIVE, 'generationConfig.maxOutputTokens', to_params=values.generation('maxOutputTokens')),
            TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'max_output_tokens_ignored')}


def _hints(name: str, claude: Support | None = None) -> dict:
    unsupported = Support(UNSUPPORTED, loss='hint_ignored')
    return {'openai-responses': Support(NATIVE, to_params=values.param(name)),
            'openai': Support(NATIVE, to_params=values.param(name)),
            'claude': claude or unsupported, 'gemini': unsupported, TEMPLATE: unsupported}


_tools = _but(_same(NATIVE, 'function tools as the backend\'s own (the client runs them); hosted tools only where '
                           'the key allows them and the connection lists them in hosted_tools; custom tools '
                           '(free-form input) on openai-responses only, refused elsewhere'),
              template=Support(UNSUPPORTED, 'a template renders one whole text answer: no tool calls'))
_NO_TOOL_ITEMS = 'text messages only: function calls and their outputs are refused (no tools)'
_tool_choice = _same(UNSUPPORTED, 'only "auto" (the backend decides)')
_parallel = _same(UNSUPPORTED, 'only true: the backend may call several tools at once')
_deprecated = _same(UNSUPPORTED, 'the deprecated form; use tools')
_claude_user = Support(EMULATED, 'metadata.user_id', to_params=lambda v: {'metadata': {'user_id': v}})
_TOOL_CHOICE_OK = (None, 'auto')


_summary_support = {
    'openai-responses': Support(NATIVE, 'sent with reasoning', to_params=lambda v: {'reasoning': {'summary': v}}),
    'openai': Support(UNSUPPORTED, 'Chat Completions returns no reasoning summaries', 'no_reasoning_summary'),
    'claude': Support(EMULATED, 'the thinking text of a connection with thinking on'),
    'gemini': Support(EMULATED, 'the thought summaries of a connection that asks for them'),
    TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'no_reasoning_summary')}
_strict_support = {
    'openai-responses': Support(NATIVE, 'tools[].strict'),
    'openai': Support(NATIVE, 'tools[].function.strict'),
    'claude': Support(NATIVE, 'tools[].strict'),
    'gemini': Support(EMULATED, 'toolConfig.functionCallingConfig.mode VALIDATED: every function of the '
                                'request is held to its schema (Gemini has no per-function strict)'),
    TEMPLATE: Support(UNSUPPORTED, 'a template renders one whole text answer: no tool calls')}


def _verbosity(responses_route: bool) -> dict[str, Support]:
    unsupported = Support(UNSUPPORTED, loss='verbosity_ignored')
    if responses_route:
        native = Support(NATIVE, to_params=lambda v: {'text': {'verbosity': v}})
        emulated = Support(EMULATED, 'verbosity', to_params=values.param('verbosity'))
        return {'openai-responses': native, 'openai': emulated, 'claude': unsupported, 'gemini': unsupported,
                TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'verbosity_ignored')}
    return {'openai': Support(NATIVE, to_params=values.param('verbosity')),
            'openai-responses': Support(EMULATED, 'text.verbosity', to_params=lambda v: {'text': {'verbosity': v}}),
            'claude': unsupported, 'gemini': unsupported,
            TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'verbosity_ignored')}


def _passed(name: str, kinds: tuple, loss: str) -> dict[str, Support]:
    """A field the APIs of ``kinds`` take as it is (sent on), which the other backends do not know."""
    return {k: Support(NATIVE, to_params=values.param(name)) if k in kinds else
            Support(UNSUPPORTED, _TEMPLATE_DECIDES if k == TEMPLATE else '', loss) for k in KINDS}


_OPENAI_KINDS = ('openai-responses', 'openai')
# A json_schema format on a backend that answers a call's schema= natively (llmconn.structured): the schema
# made strict, the answer validated against it (one that does not validate is a failed call).
_SCHEMA_NATIVE = '{} (the call\'s schema=: made strict, the answer validated)'


_STRUCTURAL_RESPONSES = [
    Field('model', _same(NATIVE, 'names a connection'), structural=True),
    Field('input', _but(_same(NATIVE, 'text, message, function_call and function_call_output items, '
                                      'custom_tool_call and custom_tool_call_output items (openai-responses '
                                      'only), reasoning items (kept for their encrypted_content), and '
                                      'input_image / input_file parts of user messages (a data: URL or an http(s) '
                                      'URL; file_id is refused) as the turn\'s attachments, sent as the backend\'s '
                                      'own parts where it takes their type; a system '
                                      'message after the first turn or two of one role in a row are the losses '
                                      'system_messages_hoisted and messages_merged'),
                        template=Support(NATIVE, _NO_TOOL_ITEMS)),
          structural=True),
    Field('instructions', _but(_same(NATIVE, 'system prompt; never carried over to the next response'),
                               template=Support(NATIVE, 'the system message of input.messages; never carried over')),
          structural=True),
    Field('previous_response_id', {
        'openai-responses': Support(NATIVE, 'with state: provider; else replayed by the gateway'),
        **{k: Support(EMULATED, 'the gateway replays the stored items (standard retention only)')
           for k in ('openai', 'claude', 'gemini')},
        TEMPLATE: Support(EMULATED, 'the gateway replays the stored messages (standard retention only); the extra '
                                    'fields a response template puts on a message are not kept, so the endpoint '
                                    'gets the whole window, and a conversation holding function calls is refused')},
          structural=True),
    Field('store', _same(NATIVE, 'false: only ids, times, status and counts are kept'), structural=True),
    Field('stream', _but(_same(EMULATED, 'the lifecycle events are rebuilt from the provider\'s stream'),
                         template=Support(EMULATED, 'the endpoint answers whole; its answer is sent as the events')),
          structural=True),
    Field('stream_options', _same(NATIVE, 'accepted'), structural=True),
    Field('metadata', _same(NATIVE, 'kept by the gateway, returned with the response'), structural=True),
    Field('fallback_policy', _same(NATIVE, 'the gateway\'s own: which losses a request accepts'),
          structural=True),
]

RESPONSES_FIELDS: dict[str, Field] = {f.name: f for f in _STRUCTURAL_RESPONSES + [
    Field('temperature', _sampling('temperature', 'temperature')),
    Field('top_p', _sampling('top_p', 'topP')),
    Field('max_output_tokens', _max_tokens()),
    Field('reasoning', {
        'openai-responses': Support(NATIVE, to_params=values.param('reasoning')),
        'openai': Support(EMULATED, 'reasoning.effort as reasoning_effort',
                          to_params=lambda v: {'reasoning_effort': v['effort']} if (v or {}).get('effort') else {}),
        'claude': Support(UNSUPPORTED, 'thinking is set per connection', 'reasoning_settings_ignored'),
        'gemini': Support(UNSUPPORTED, loss='reasoning_settings_ignored'),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'reasoning_settings_ignored')},
          # Only a summary asked for (llm's reasoning_summary) sets nothing the connection decides: the
          # reasoning.summary row answers for it.
          trivial=values.only_summary),
    Field('text', {
        'openai-responses': Support(NATIVE, to_params=values.param('text')),
        'openai': Support(EMULATED, 'as response_format', to_params=values.chat_format),
        'claude': Support(UNSUPPORTED, loss='output_format_not_enforced'),
        'gemini': Support(UNSUPPORTED, loss='output_format_not_enforced'),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'output_format_not_enforced')}, trivial=values.is_text_format),
    Field('text.format.json_schema', {
        'openai-responses': Support(NATIVE, to_params=lambda fmt: {'text': {'format': fmt}}),
        'openai': Support(EMULATED, 'as response_format', to_params=lambda fmt: values.chat_format({'format': fmt})),
        'claude': Support(NATIVE, _SCHEMA_NATIVE.format('output_config.format'), to_params=values.schema_of),
        'gemini': Support(NATIVE, _SCHEMA_NATIVE.format('generationConfig.responseJsonSchema'),
                          to_params=values.schema_of),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'output_format_not_enforced')},
          part_of=values.json_schema_format),
    Field('truncation', {'openai-responses': Support(NATIVE, to_params=values.param('truncation')),
                         **{k: Support(UNSUPPORTED, loss='no_auto_truncation')
                            for k in ('openai', 'claude', 'gemini', TEMPLATE)}},
          trivial=lambda v: v in (None, 'disabled')),
    Field('user', _hints('user', _claude_user)),
    Field('safety_identifier', _hints('safety_identifier')),
    Field('prompt_cache_key', _hints('prompt_cache_key')),
    Field('service_tier', _hints('service_tier'), trivial=lambda v: v in (None, 'auto')),
    Field('include', _same(UNSUPPORTED, 'reasoning.encrypted_content is honoured (the reasoning item carries the '
                                        'backend\'s items, sealed, for a stateless continuation); other output '
                                        'items are not returned',
                           'include_ignored'), trivial=lambda v: not v),
    Field('top_logprobs', _same(UNSUPPORTED, loss='no_logprobs'), trivial=lambda v: not v),
    Field('background', _same(UNSUPPORTED, 'background responses are not offered'), trivial=lambda v: not v),
    Field('conversation', _same(UNSUPPORTED, 'use previous_response_id')),
    Field('prompt', _same(UNSUPPORTED, 'stored prompt templates are not offered')),
    Field('tools', _tools, structural=True, trivial=lambda v: not v),
    Field('tool_choice', _tool_choice, trivial=lambda v: v in _TOOL_CHOICE_OK),
    Field('parallel_tool_calls', _parallel, trivial=lambda v: v in (None, True)),
    Field('max_tool_calls', _same(UNSUPPORTED, 'the backend decides how many calls it makes'),
          trivial=lambda v: v is None),
    Field('reasoning.summary', _summary_support, part_of=values.summary),
    Field('text.verbosity', _verbosity(responses_route=True), part_of=values.inside('text', 'verbosity')),
    Field('tools[].strict', _strict_support, part_of=values.strict(), trivial=lambda v: not v),
    Field('prompt_cache_options', _passed('prompt_cache_options', _OPENAI_KINDS, 'hint_ignored'),
          trivial=lambda v: not v),
    Field('prompt_cache_retention', _passed('prompt_cache_retention', _OPENAI_KINDS, 'hint_ignored')),
    Field('access_programs', _passed('access_programs', ('openai-responses',), 'hint_ignored'),
          trivial=lambda v: not v),
    Field('image', _passed('image', ('openai-responses',), 'hint_ignored'), trivial=lambda v: not v),
    Field('background_options', _same(UNSUPPORTED, 'background responses are not offered'),
          trivial=lambda v: not v),
    Field('context_management', _same(UNSUPPORTED, 'server-side compaction is not offered'),
          trivial=lambda v: not v),
    Field('moderation', _same(UNSUPPORTED, 'the gateway runs no moderation, and never skips one silently')),
]}

CHAT_FIELDS: dict[str, Field] = {f.name: f for f in [
    Field('model', _same(NATIVE, 'names a connection'), structural=True),
    Field('messages', _but(_same(NATIVE, 'text messages, assistant tool_calls and tool messages; image_url and '
                                         'file parts of user messages (a data: URL, or an image\'s http(s) URL; '
                                         'file_id is refused) as the turn\'s attachments, sent as the backend\'s '
                                         'own parts where it takes their type; audio is refused'),
                           template=Support(NATIVE, 'text messages only: assistant tool_calls and tool messages are '
                                                    'refused (no tools)')),
          structural=True),
    Field('stream', _but(_same(EMULATED, 'chat.completion.chunk events rebuilt from the provider\'s stream'),
                         template=Support(EMULATED, 'the endpoint answers whole; its answer is sent as the chunks')),
          structural=True),
    Field('stream_options', _same(NATIVE, 'include_usage honoured'), structural=True),
    Field('fallback_policy', _same(NATIVE, 'the gateway\'s own: which losses a request accepts'),
          structural=True),
    Field('metadata', _same(NATIVE, 'returned in the llmconn_downgrades marker only'), structural=True),
    Field('store', _same(UNSUPPORTED, 'this route is stateless', 'not_stored'), trivial=lambda v: not v),
    Field('temperature', _sampling('temperature', 'temperature')),
    Field('top_p', _sampling('top_p', 'topP')),
    Field('max_tokens', _max_tokens()),
    Field('max_completion_tokens', _max_tokens()),
    Field('n', _same(UNSUPPORTED, 'one choice per request'), trivial=lambda v: v in (None, 1)),
    Field('stop', {'openai': Support(NATIVE, to_params=values.param('stop')),
                   'claude': Support(EMULATED, 'stop_sequences', to_params=lambda v: {'stop_sequences': values.stop_list(v)}),
                   'gemini': Support(NATIVE, 'generationConfig.stopSequences',
                                     to_params=lambda v: {'generationConfig': {'stopSequences': values.stop_list(v)}}),
                   'openai-responses': Support(UNSUPPORTED, loss='stop_ignored'),
                   TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'stop_ignored')}),
    Field('presence_penalty', _sampling('presence_penalty', 'presencePenalty', ('openai', 'gemini'))),
    Field('frequency_penalty', _sampling('frequency_penalty', 'frequencyPenalty', ('openai', 'gemini'))),
    Field('seed', _sampling('seed', 'seed', ('openai', 'gemini'))),
    Field('response_format', {
        'openai': Support(NATIVE, to_params=values.param('response_format')),
        'openai-responses': Support(EMULATED, 'as text.format', to_params=values.responses_format),
        'claude': Support(UNSUPPORTED, loss='output_format_not_enforced'),
        'gemini': Support(UNSUPPORTED, loss='output_format_not_enforced'),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'output_format_not_enforced')},
          trivial=values.is_plain_response_format),
    Field('response_format.json_schema', {
        'openai': Support(NATIVE, to_params=values.param('response_format')),
        'openai-responses': Support(EMULATED, 'as text.format', to_params=values.responses_format),
        'claude': Support(NATIVE, _SCHEMA_NATIVE.format('output_config.format'),
                          to_params=lambda fmt: values.schema_of(fmt.get('json_schema'))),
        'gemini': Support(NATIVE, _SCHEMA_NATIVE.format('generationConfig.responseJsonSchema'),
                          to_params=lambda fmt: values.schema_of(fmt.get('json_schema'))),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'output_format_not_enforced')},
          part_of=values.json_schema_response_format),
    Field('reasoning_effort', {
        'openai': Support(NATIVE, to_params=values.param('reasoning_effort')),
        'openai-responses': Support(EMULATED, 'reasoning.effort', to_params=lambda v: {'reasoning': {'effort': v}}),
        'claude': Support(UNSUPPORTED, 'thinking is set per connection', 'reasoning_settings_ignored'),
        'gemini': Support(UNSUPPORTED, loss='reasoning_settings_ignored'),
        TEMPLATE: Support(UNSUPPORTED, _TEMPLATE_DECIDES, 'reasoning_settings_ignored')}),
    Field('user', _hints('user', _claude_user)),
    Field('safety_identifier', _hints('safety_identifier')),
    Field('prompt_cache_key', _hints('prompt_cache_key')),
    Field('service_tier', _hints('service_tier'), trivial=lambda v: v in (None, 'auto')),
    Field('logprobs', _same(UNSUPPORTED, loss='no_logprobs'), trivial=lambda v: not v),
    Field('top_logprobs', _same(UNSUPPORTED, loss='no_logprobs'), trivial=lambda v: not v),
    Field('logit_bias', {'openai': Support(NATIVE, to_params=values.param('logit_bias')),
                         **{k: Support(UNSUPPORTED, loss='sampling_params_ignored')
                            for k in ('openai-responses', 'claude', 'gemini', TEMPLATE)}}, trivial=lambda v: not v),
    Field('modalities', _same(UNSUPPORTED, 'text only'), trivial=lambda v: not v or list(v) == ['text']),
    Field('audio', _same(UNSUPPORTED, 'text only')),
    Field('prediction', _same(UNSUPPORTED)),
    Field('web_search_options', _same(UNSUPPORTED, 'hosted tools are not available yet')),
    Field('tools', _tools, structural=True, trivial=lambda v: not v),
    Field('functions', _deprecated, trivial=lambda v: not v),
    Field('function_call', _deprecated, trivial=lambda v: v in _TOOL_CHOICE_OK),
    Field('tool_choice', _tool_choice, trivial=lambda v: v in _TOOL_CHOICE_OK),
    Field('parallel_tool_calls', _parallel, trivial=lambda v: v in (None, True)),
    Field('verbosity', _verbosity(responses_route=False)),
    Field('tools[].strict', _strict_support, part_of=values.strict('function'), trivial=lambda v: not v),
    Field('prompt_cache_options', _passed('prompt_cache_options', _OPENAI_KINDS, 'hint_ignored'),
          trivial=lambda v: not v),
    Field('prompt_cache_retention', _passed('prompt_cache_retention', _OPENAI_KINDS, 'hint_ignored')),
    Field('moderation', _same(UNSUPPORTED, 'the gateway runs no moderation, and never skips one silently')),
]}

ROUTES = {RESPONSES: RESPONSES_FIELDS, CHAT: CHAT_FIELDS}

