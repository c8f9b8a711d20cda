"""The simulated vLLM engine: its scheduler and step loop, the requests it holds, the prefix cache,
the data-parallel router and the ground truth of what it did.

- ``engine``: ``Engine``, the scheduler and step loop (admission, KV cache, preemption, counters)
- ``requests``: a request in the engine (its parameters, its state, what each step sends it)
- ``events``: what the engine reports of its steps (to sim.metrics) and its totals
- ``prefix_cache``: automatic prefix caching (block hashes, hits, eviction)
- ``router``: which data-parallel engine takes a request
- ``records``: the ground truth of each request, step by step, and its JSON-lines log
"""
