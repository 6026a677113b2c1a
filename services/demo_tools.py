"""A demo service whose model may call a Python function: an order-status assistant.

    curl -s localhost:17010/demo.llm.order-status -d '{"user_id": "ann", "text": "call get_order {\"order_id\": \"123\"}"}'

The model decides when to call ``get_order``; the library runs the loop
(call, run the function, send its output back, until the model answers),
saves the whole exchange as one turn of the user's chat, and holds the
chat's lock throughout. The same code runs on a Claude, OpenAI, Responses
or Gemini connection: only the YAML changes. Against the bundled fake
provider, a message ``call get_order {"order_id": "123"}`` makes the model
call the tool.
"""

from llmconn.service import Service

CONNECTION = 'Support'

ORDERS = {'123': 'shipped on Monday', '456': 'waiting for stock'}


def get_order(order_id: str) -> str:
    """Look up the status of an order by its id."""
    if order_id not in ORDERS:
        raise KeyError(f'there is no order {order_id}')     # goes back to the model as an error output
    return ORDERS[order_id]


class OrderStatus(Service):
    """One turn of the user's order-status conversation; the model may call get_order."""

    name = 'demo.llm.order-status'
    input = 'user_id', 'text'

    def handle(self):
        request = self.request.input
        reply = self.llm[CONNECTION].chat(request.text, chat_id=str(request.user_id), tools=[get_order])
        calls = [{'name': c['name'], 'arguments': c['arguments'], 'output': c.get('output'),
                  'is_error': c.get('is_error')} for c in reply.get('tool_calls', ())]
        self.response.payload = {'reply': reply['text'], 'tool_calls': calls, 'rounds': reply['rounds']}
