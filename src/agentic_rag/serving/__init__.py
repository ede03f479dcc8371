"""The chat service: the trained agent behind an OpenAI-compatible HTTP API, and its terminal client.

``config`` (settings from flags and the environment), ``schema`` (request checks), ``errors`` (the errors answered),
``messages`` (the conversation's order and tool turns), ``client_tools`` (a request's ``tools`` and ``tool_choice``),
``conversation`` (messages -> prompt ids), ``scheduler`` (bounded queue, one engine thread, batches), ``stream`` (the
engine's output -> a reply's answer and reasoning, in one place) and ``replies`` (that text in OpenAI's response and
chunk shapes, streamed or whole), ``reply_calls`` (the client's tool calls a reply hands over, and the server's own
it reports), ``app`` (FastAPI routes), ``agent`` (loading model, adapter and searcher), ``server`` and ``client`` (the
entry points of ``service/chat_server.py`` and ``service/chat_client.py``), ``forcing`` (scripted turns for tests).
Nothing is imported here, so the client starts without torch.
"""
