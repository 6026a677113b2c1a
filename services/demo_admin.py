"""Admin services: read and delete a user's support conversation.

History is private, so these refuse to run (403) unless the server has API
keys configured (``server: {api_keys: [${LLMCONN_API_KEY}]}``); with keys
configured, every request to the host must carry one anyway.

    curl -s localhost:17010/demo.llm.admin.get-history -H "X-API-Key: $LLMCONN_API_KEY" -d '{"user_id": "ann"}'
"""

from llmconn.service import Service

CONNECTION = 'Support'


class GetHistory(Service):
    """Every stored message of the user's chat, oldest first."""

    name = 'demo.llm.admin.get-history'
    input = 'user_id',
    requires_api_key = True

    def handle(self):
        chat_id = str(self.request.input.user_id)
        self.response.payload = {'user_id': chat_id, 'messages': self.llm[CONNECTION].history(chat_id)}


class DeleteHistory(Service):
    """Forget the user's chat; the next message starts a new conversation."""

    name = 'demo.llm.admin.delete-history'
    input = 'user_id',
    requires_api_key = True

    def handle(self):
        chat_id = str(self.request.input.user_id)
        self.llm[CONNECTION].delete_history(chat_id)
        self.logger.info('Deleted the chat history of %s (cid=%s)', chat_id, self.cid)
        self.response.payload = {'user_id': chat_id, 'deleted': True}
