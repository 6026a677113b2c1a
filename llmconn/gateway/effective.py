"""The settings a Response reports: the values that were in effect, not the ones a client hoped for.

The Open Responses specification (release 2026-04-24) makes a Response echo
every sampling and output setting it was made with, ``null`` only where a
setting has no value. :func:`settings` works them out once, when a request
is prepared, from three sources in this order:

1. the request's own value, if the backend was sent it (a field the request
   accepted as a loss was not sent, so it does not count);
2. the connection's configuration (``params``, ``max_tokens``), which the
   provider mapping sends on every call;
3. the API's documented default (temperature 1, top_p 1, penalties 0).

So ``max_output_tokens`` says 1024 for a request that set none on a
connection with the default ``max_tokens``: that is what went upstream.
"""

from __future__ import annotations

from typing import Any

# The documented defaults of the Responses API, for a setting neither the request nor the connection gives.
DEFAULTS = {'temperature': 1.0, 'top_p': 1.0, 'presence_penalty': 0.0, 'frequency_penalty': 0.0}
DEFAULT_SERVICE_TIER = 'default'        # what OpenAI reports for a request that asked for "auto" or nothing
# Gemini's names for the settings a connection may set under params.generationConfig.
_GEMINI_NAMES = {'temperature': 'temperature', 'top_p': 'topP', 'presence_penalty': 'presencePenalty',
                 'frequency_penalty': 'frequencyPenalty', 'max_output_tokens': 'maxOutputTokens'}
_LIMIT_PARAMS = ('max_output_tokens', 'max_completion_tokens', 'max_tokens')
_TEMPLATE = 'template'


def settings(conn: Any, body: dict, downgrades: list) -> dict:
    """The settings fields of the Response to ``body`` on ``conn`` (whose kind decides what is sent)."""
    dropped = {entry.partition(':')[0] for entry in downgrades}
    sent = {name: value for name, value in body.items() if value is not None and name not in dropped}
    conf = conn.conf
    configured = _configured(conf.params or {})
    out = {name: _number(sent.get(name, configured.get(name, default)), default)
           for name, default in DEFAULTS.items()}
    out.update(
        max_output_tokens=_limit(conf, sent, configured),
        top_logprobs=0,         # log probabilities are never returned (the no_logprobs loss)
        reasoning=_reasoning(sent.get('reasoning'), 'reasoning.summary' not in dropped),
        text=text_setting(sent.get('text'), 'text.verbosity' not in dropped),
        truncation=sent.get('truncation', 'disabled'),
        service_tier=_tier(sent.get('service_tier')),
        safety_identifier=sent.get('safety_identifier'),
        prompt_cache_key=sent.get('prompt_cache_key'),
        max_tool_calls=None,
    )
    return out


def stored_defaults() -> dict:
    """The settings of a record stored before records kept theirs: the API's defaults."""
    return dict(DEFAULTS, max_output_tokens=None, top_logprobs=0, reasoning=_reasoning(None),
                text=text_setting(None), truncation='disabled', service_tier=DEFAULT_SERVICE_TIER,
                safety_identifier=None, prompt_cache_key=None, max_tool_calls=None)


def _configured(params: dict) -> dict:
    """The settings a connection's ``params`` fix for every call (Gemini's under generationConfig)."""
    generation = params.get('generationConfig') if isinstance(params.get('generationConfig'), dict) else {}
    found = {name: generation[gemini] for name, gemini in _GEMINI_NAMES.items() if gemini in generation}
    found.update({name: params[name] for name in (*DEFAULTS, *_LIMIT_PARAMS) if name in params})
    return found


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _limit(conf: Any, sent: dict, configured: dict) -> int | None:
    """The output token limit that went upstream (a template endpoint's own is unknown: None)."""
    if conf.provider == _TEMPLATE:
        return None
    for name in ('max_output_tokens', 'max_tokens', 'max_completion_tokens'):
        if isinstance(sent.get(name), int):
            return sent[name]
    for name in _LIMIT_PARAMS:
        if isinstance(configured.get(name), int):
            return configured[name]
    return conf.max_tokens


def _reasoning(value: Any, with_summary: bool = True) -> dict:
    value = value if isinstance(value, dict) else {}
    summary = value.get('summary') or value.get('generate_summary') if with_summary else None
    return {'effort': value.get('effort'), 'summary': summary}


def text_setting(value: Any, with_verbosity: bool = True) -> dict:
    """``text`` as a Response echoes it: the format whole (every key the schema requires), the verbosity."""
    value = value if isinstance(value, dict) else {}
    fmt = value.get('format') if isinstance(value.get('format'), dict) else {'type': 'text'}
    if fmt.get('type') == 'json_schema':
        fmt = {'type': 'json_schema', 'name': fmt.get('name'), 'description': fmt.get('description'),
               'schema': fmt.get('schema'), 'strict': bool(fmt.get('strict'))}
    else:
        fmt = {'type': fmt.get('type', 'text')}
    out = {'format': fmt}
    if with_verbosity and value.get('verbosity') is not None:
        out['verbosity'] = value['verbosity']
    return out


def _tier(value: Any) -> str:
    return DEFAULT_SERVICE_TIER if value in (None, 'auto') else value
