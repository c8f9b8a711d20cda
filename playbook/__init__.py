"""The speculative-decoding playbook's one-shot tools."""
