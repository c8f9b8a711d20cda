"""A vLLM-compatible simulator: vLLM 0.32's HTTP interface and /metrics, driven by a model of
speculative decoding, for trying specguard rules without a GPU.

- ``sim.options``: SimOptions, SpeculativeConfig, reading a vLLM command line / --config file
- ``sim.vllm_args``: the command line rewritten as vLLM's parser does (dotted JSON options)
- ``sim.model``: acceptance and step-cost formulas
- ``sim.engine``: scheduler and step loop (admission, KV cache, preemption, counters)
- ``sim.prefix_cache``: automatic prefix caching (block hashes, hits, eviction)
- ``sim.router``: which data-parallel engine takes a request
- ``sim.tokens``: prompt token ids, generated text and log-probabilities without a tokenizer
- ``sim.metrics``: /metrics as vLLM exposes it
- ``sim.protocol``: OpenAI request/response bodies and errors as vLLM shapes them
- ``sim.server``: the HTTP server, ``start_simulator`` and ``Simulator``
- ``sim.scenario``: timeline files (acceptance changes, KV-usage ramps, death)
- ``sim.scenario_player``: a timeline played on the running engines
- ``sim.cli``: ``specguard simulate`` / ``python -m specguard.sim``
"""
