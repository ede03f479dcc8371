"""The chat service: the trained agent behind an OpenAI-compatible HTTP API, and its terminal client.

``config`` (settings from flags and the environment), ``schema`` (request checks, errors), ``conversation``
(messages -> prompt ids), ``scheduler`` (bounded queue, one engine thread, batches), ``stream`` and
``replies`` (tokens -> answer and reasoning, OpenAI response and chunk shapes), ``app`` (FastAPI routes),
``agent`` (loading model, adapter and searcher), ``server`` and ``client`` (the entry points of
``service/chat_server.py`` and ``service/chat_client.py``), ``forcing`` (scripted turns for tests).
Nothing is imported here, so the client starts without torch.
"""
