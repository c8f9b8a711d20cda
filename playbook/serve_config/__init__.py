"""`specguard serve-config`: one serving file rendered, for a vLLM version, as vLLM's command line,
its ``--config`` YAML and the environment file the ``vllm_restart`` action manages."""
