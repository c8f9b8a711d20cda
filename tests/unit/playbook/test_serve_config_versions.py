"""serve-config's version table against the vLLM reference (section 4, the method table and the
keys; section 6, the CPU backend): every method at both edges of its releases, every key range at
both edges, and the forms of the speculative config (JSON string or mapping in the YAML, -sc)."""

from __future__ import annotations

import pytest

from specguard.playbook.serve_config.versions import (
    KEYS,
    METHODS,
    VersionError,
    covered,
    cpu_warnings,
    key_verdict,
    method_problem,
    newer_than_known,
    parse_version,
)

# (method, first release that has it, first release that no longer has it or None): the reference's
# table, with draft_model counted from 0.15 (NotImplementedError on V1 before).
METHOD_ROWS = [
    ("ngram", "0.10.0", None),
    ("eagle", "0.10.0", None),
    ("eagle3", "0.10.0", None),
    ("medusa", "0.10.0", "0.33.0"),
    ("mlp_speculator", "0.10.0", "0.33.0"),
    ("draft_model", "0.15.0", None),
    ("deepseek_mtp", "0.10.0", None),
    ("ernie_mtp", "0.10.2", None),
    ("qwen3_next_mtp", "0.10.2", None),
    ("mimo_mtp", "0.11.0", None),
    ("longcat_flash_mtp", "0.11.0", None),
    ("mtp", "0.11.0", None),
    ("suffix", "0.12.0", None),
    ("glm4_moe_mtp", "0.12.0", None),
    ("pangu_ultra_moe_mtp", "0.12.0", None),
    ("extract_hidden_states", "0.17.0", None),
    ("ngram_gpu", "0.18.0", None),
    ("dflash", "0.20.0", None),
    ("custom_class", "0.22.0", "0.34.0"),
    ("dspark", "0.25.0", None),
]
# The release just before each edge, among those the reference covers.
BEFORE = {
    "0.10.2": "0.10.1", "0.11.0": "0.10.2", "0.12.0": "0.11.2", "0.15.0": "0.14.1", "0.17.0": "0.16.0",
    "0.18.0": "0.17.1", "0.20.0": "0.19.1", "0.22.0": "0.21.0", "0.25.0": "0.22.0", "0.33.0": "0.32.0",
    "0.34.0": "0.33.0", "0.16.0": "0.15.1", "0.19.0": "0.18.0", "0.21.0": "0.20.0", "0.30.0": "0.25.0",
}  # fmt: skip


def test_the_table_has_every_method_of_the_reference() -> None:
    assert {row[0] for row in METHOD_ROWS} == set(METHODS)


@pytest.mark.parametrize(("method", "since", "until"), METHOD_ROWS, ids=[row[0] for row in METHOD_ROWS])
def test_each_method_exists_exactly_in_its_releases(method: str, since: str, until: str | None) -> None:
    assert method_problem(method, parse_version(since)) is None
    if since != "0.10.0":
        too_old = method_problem(method, parse_version(BEFORE[since]))
        assert too_old is not None and f"needs vLLM {since} or later" in too_old
    if until is None:
        assert method_problem(method, parse_version("0.34.0")) is None
    else:
        assert method_problem(method, parse_version(BEFORE[until])) is None
        gone = method_problem(method, parse_version(until))
        assert gone is not None and f"removed in vLLM {until}" in gone


def test_draft_model_before_0_15_says_why() -> None:
    problem = method_problem("draft_model", parse_version("0.14.1"))
    assert problem is not None and "NotImplementedError" in problem


def test_an_unknown_method_is_named_with_the_known_ones() -> None:
    problem = method_problem("eagle4", parse_version("0.32.0"))
    assert problem is not None and "'eagle4' is not a speculative method" in problem and "eagle3" in problem


# (key, first release that knows it, first release that no longer does or None)
KEY_ROWS = [
    ("enforce_eager", "0.11.0", None),
    ("disable_padded_drafter_batch", "0.11.0", "0.34.0"),
    ("speculative_token_tree", "0.10.0", "0.21.0"),
    ("parallel_drafting", "0.16.0", None),
    ("suffix_decoding_max_tree_depth", "0.12.0", None),
    ("rejection_sample_method", "0.18.0", None),
    ("draft_sample_method", "0.21.0", None),
    ("attention_backend", "0.21.0", None),
    ("moe_backend", "0.19.0", None),
    ("kv_cache_dtype", "0.30.0", None),
    ("num_speculative_tokens_per_batch_size", "0.25.0", None),
    ("use_heterogeneous_vocab", "0.25.0", "0.34.0"),
    ("prompt_lookup_max", "0.10.0", None),
    ("quantization", "0.10.0", None),
]


def _absent(key: str, version: str) -> None:
    """What a release that does not know ``key`` does with it: ignores it up to 0.15, refuses it after."""
    verdict = key_verdict(key, parse_version(version))
    expected = "refused" if parse_version(version) >= (0, 16, 0) else "dropped"
    assert verdict.status == expected, (key, version, verdict)


@pytest.mark.parametrize(("key", "since", "until"), KEY_ROWS, ids=[row[0] for row in KEY_ROWS])
def test_each_key_is_known_exactly_in_its_releases(key: str, since: str, until: str | None) -> None:
    assert key_verdict(key, parse_version(since)).status == "ok"
    if since != "0.10.0":
        _absent(key, BEFORE[since])
    if until is not None:
        assert key_verdict(key, parse_version(BEFORE[until])).status == "ok"
        _absent(key, until)
    else:
        assert key_verdict(key, parse_version("0.34.0")).status == "ok"


def test_disable_by_batch_size_is_unused_to_0_16_and_refused_from_0_17() -> None:
    for version in ("0.10.0", "0.15.1", "0.16.0"):
        verdict = key_verdict("disable_by_batch_size", parse_version(version))
        assert verdict.status == "dropped" and "does not use it" in verdict.reason
    verdict = key_verdict("disable_by_batch_size", parse_version("0.17.0"))
    assert verdict.status == "refused" and "removed in vLLM 0.17.0" in verdict.reason


@pytest.mark.parametrize(
    "key", ["acceptance_method", "posterior_threshold", "posterior_alpha", "disable_mqa_scorer"]
)
def test_the_v0_keys_are_ignored_to_0_15_and_refused_from_0_16(key: str) -> None:
    assert key_verdict(key, parse_version("0.15.1")).status == "dropped"
    verdict = key_verdict(key, parse_version("0.16.0"))
    assert verdict.status == "refused" and "removed in vLLM 0.10.0" in verdict.reason


def test_disable_logprobs_goes_in_0_12() -> None:
    assert key_verdict("disable_logprobs", parse_version("0.11.2")).status == "ok"
    assert key_verdict("disable_logprobs", parse_version("0.12.0")).status == "dropped"
    assert key_verdict("disable_logprobs", parse_version("0.16.0")).status == "refused"


def test_every_key_in_the_table_has_a_verdict_and_unknown_keys_are_unknown() -> None:
    for key in KEYS:
        assert key_verdict(key, parse_version("0.32.0")).status in ("ok", "dropped", "refused")
    assert key_verdict("prompt_lookup_mx", parse_version("0.32.0")).status == "unknown"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.32.0", (0, 32, 0)), ("0.10", (0, 10, 0)), ("0.8.5.post1", (0, 8, 5)), ("0.32.0+cpu", (0, 32, 0))],
)
def test_versions_are_read_as_vllm_writes_them(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "latest", "32", "0.x"])
def test_a_version_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(VersionError):
        parse_version(text)


def test_releases_before_the_table_are_refused_and_newer_ones_rendered_as_the_newest_known() -> None:
    with pytest.raises(VersionError, match=r"older than 0\.10\.0"):
        covered((0, 9, 2))
    with pytest.raises(VersionError, match=r"no --speculative-config either \(0.8.2\+\)"):
        covered((0, 8, 1))
    assert covered((0, 10, 0)) == (0, 10, 0)
    assert covered((0, 40, 1)) == (0, 34, 0)
    assert newer_than_known((0, 34, 9)) is None
    warning = newer_than_known((0, 35, 0))
    assert warning is not None and "rendered as for 0.34.0" in warning


@pytest.mark.parametrize(
    ("version", "method", "says"),
    [
        ("0.10.0", "ngram", "AssertionError: spec decode is not supported."),
        ("0.19.1", "draft_model", "AssertionError: spec decode is not supported."),
        ("0.20.0", "draft_model", "SYNTHETIC_MODE"),
        ("0.21.0", "eagle", "only ngram and draft_model are known"),
        ("0.33.0", "eagle3", "only ngram and draft_model are known"),
        ("0.34.0", "ngram", "triton-cpu"),
    ],
)
def test_the_cpu_backend_facts_are_warnings(version: str, method: str, says: str) -> None:
    warnings = cpu_warnings(method, parse_version(version))
    assert len(warnings) == 1 and says in warnings[0]


@pytest.mark.parametrize("version", ["0.21.0", "0.32.0", "0.33.0"])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_ngram_and_draft_model_on_cpu_from_0_21_get_no_warning(version: str, method: str) -> None:
    assert cpu_warnings(method, parse_version(version)) == []
