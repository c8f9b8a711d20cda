"""A vLLM-compatible simulator: vLLM 0.32's HTTP interface and /metrics, driven by a model of
speculative decoding, for trying specguard rules without a GPU.

- ``sim.options``: SimOptions, SpeculativeConfig, reading a vLLM command line / --config file
- ``sim.vllm_args``: the command line rewritten as vLLM's parser does (dotted JSON options)
- ``sim.model``: acceptance and step-cost formulas
- ``sim.tokens``: prompt token ids, generated text and log-probabilities without a tokenizer
- ``sim.engine``: the engine (``sim.engine.engine``: scheduler and step loop; ``requests``, ``events``,
  ``prefix_cache``, ``router`` for data parallelism, ``records`` for the ground truth)
- ``sim.metrics``: /metrics as vLLM exposes it
- ``sim.openai``: OpenAI request/response bodies and errors as vLLM shapes them (``errors``,
  ``requests``, ``responses``, ``tokenize``)
- ``sim.server``: the HTTP server, ``start_simulator`` and ``Simulator``
- ``sim.scenario``: timeline files (acceptance changes, KV-usage ramps, death)
- ``sim.scenario_player``: a timeline played on the running engines
- ``sim.cli``: ``specguard simulate`` / ``python -m specguard.sim``
"""
