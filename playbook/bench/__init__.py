"""`specguard bench`: latency and speculative-decoding acceptance per traffic class, measured on vLLM."""
