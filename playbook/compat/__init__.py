"""``specguard compat``: whether a draft model (or an EAGLE / MTP head) fits a target for speculative
decoding in vLLM. ``loading`` resolves and loads each model's tokenizer and config (transformers,
the ``playbook`` extra, imported only here and only when the command runs); ``method`` tells which
kind of draft it is; ``tokenizer_checks``, ``chat`` and ``config_checks`` (with ``heads`` for EAGLE
heads' reduced vocabularies) judge the pair; ``samples`` holds the texts encoded; ``verdicts`` the
outcome and ``render`` its table and JSON; ``run`` puts them together."""
