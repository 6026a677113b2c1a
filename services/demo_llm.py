"""The demo services: a support chat that remembers, a one-shot question, and a streamed chat.

    curl -s localhost:17010/demo.llm.support-chat -d '{"user_id": "ann", "text": "My name is Ann"}'
    curl -s localhost:17010/demo.llm.support-chat -d '{"user_id": "ann", "text": "What is my name?"}'

Each service is thin on purpose: look the connection up, call it, return
the reply. The host turns errors into HTTP statuses (busy chat 429, provider
failure 502, store down 503), so nothing here catches them.
"""

from llmconn.service import Service

# Both etc/llm.yaml and etc/embedded.yaml define this connection.
CONNECTION = 'Support'


class SupportChat(Service):
    """One turn of a user's support conversation; the chat id is the user's id."""

    name = 'demo.llm.support-chat'
    input = 'user_id', 'text', '-skill'

    def handle(self):
        request = self.request.input
        reply = self.llm[CONNECTION].chat(request.text, chat_id=str(request.user_id), skill=request.skill or '')
        self.response.payload = {'reply': reply['text'], 'usage': reply['usage']}


class Ask(Service):
    """A one-shot question: nothing is remembered."""

    name = 'demo.llm.ask'
    input = 'text', '-skill'

    def handle(self):
        reply = self.llm[CONNECTION].invoke(self.request.input.text, skill=self.request.input.skill or '')
        self.response.payload = {'reply': reply['text'], 'usage': reply['usage']}


class SupportChatStream(Service):
    """The support chat, streamed to the client as Server-Sent Events (curl -N to watch it arrive)."""

    name = 'demo.llm.support-chat-stream'
    input = 'user_id', 'text', '-skill'

    def handle(self):
        request = self.request.input
        events = self.llm[CONNECTION].stream(request.text, chat_id=str(request.user_id), skill=request.skill or '')
        self.response.stream(events)
