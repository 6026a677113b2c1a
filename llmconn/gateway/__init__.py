"""The OpenAI-compatible gateway of ``llmconn serve`` (SPEC §13): Responses and Chat Completions.

Strict by default: a request the backend behind ``model`` cannot honour is
refused with a capability error naming the field, unless the request opts
into that named loss (``fallback_policy``). Modules, one concern each:

    keys.py              gateway keys and tenants (config models, bearer-token lookup)
    shapes.py            the types, ranges and budgets of a request's fields, checked first
    capabilities.py      per provider kind: which request fields are native, emulated, unsupported
    values.py            how a field's value becomes provider params, and which values are no-ops
    policy.py            a request's fields resolved against it: params, accepted losses, or a 400
    effective.py         the settings a Response echoes: the values that were sent upstream
    offload.py           CPU-heavy checks (tool schemas) off the gevent hub
    docs.py              docs/gateway.md's compatibility tables, generated from the matrix
    dispatch.py          sending a Responses call, and its Response or event stream made of what it made
    recording.py         a Responses call's record, kept by Connection.run where it would keep a chat
    items.py             canonical conversation items and how they become a provider request
    backend.py           a request as a CallSpec through Connection.run, the library's one entry
    responses.py         POST /v1/responses: a request checked and resolved into a Call
    response_objects.py  Response objects: of a call as it ends, or of its stored record (GET)
    response_record.py   what a response's record holds, text only under standard retention
    stream.py            the Responses and Chat Completions event streams (the normalizer)
    chat_completions.py  POST /v1/chat/completions, stateless
    routes.py            HTTP routing, authentication, OpenAI-shaped errors
    responses_ws.py      WebSocket mode of /v1/responses (client.responses.connect()), over llmconn.websocket

Every provider call goes through the library's one entry,
:meth:`Connection.run <llmconn.connection.Connection.run>`: the routes build
a :class:`~llmconn.types.CallSpec` (with a Responses call's record, see
:mod:`llmconn.call_record`) and read the result. Response records live in
:mod:`llmconn.store.records`; usage counts in the one ledger
(:mod:`llmconn.usage`) under each call's gateway key.

:func:`llmconn.gateway.routes.handle` is what :mod:`llmconn.wsgi` calls for
paths under ``/v1/``, :func:`llmconn.gateway.responses_ws.handle` for a WebSocket upgrade there.
"""
