"""A vLLM-compatible simulator: vLLM 0.32's HTTP interface and /metrics, driven by a model of
speculative decoding, for trying specguard rules without a GPU.

- ``sim.options``: SimOptions, SpeculativeConfig, reading a vLLM command line / --config file
- ``sim.model``: acceptance and step-cost formulas
- ``sim.engine``: scheduler and step loop (admission, KV cache, preemption, counters)
- ``sim.metrics``: /metrics as vLLM exposes it
- ``sim.protocol``: OpenAI request/response bodies as vLLM shapes them
- ``sim.server``: the HTTP server, ``start_simulator`` and ``Simulator``
- ``sim.scenario``: timeline files (acceptance changes, KV-usage ramps, death)
- ``sim.cli``: ``specguard simulate`` / ``python -m sim``
"""
