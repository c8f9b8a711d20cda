"""vLLM's OpenAI-compatible HTTP API as the simulator speaks it: the bodies, not the server.

- ``errors``: vLLM's error body, value errors and FastAPI's validation errors
- ``requests``: request bodies parsed and checked, and what an accepted request asks of the engine
- ``responses``: response bodies, stream chunks, log-probabilities, ``/v1/models``
- ``tokenize``: ``POST /tokenize``
"""
