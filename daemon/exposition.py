"""Prometheus text exposition -> a compact snapshot of the samples the signal catalog reads.

A vLLM ``/metrics`` page has ~650 lines, most of them (``python_*``, ``process_*``, ``http_*``,
unrelated ``vllm:*`` families, every ``_created`` series) useless to specguard. The scrape source
keeps a ring of snapshots per target, so only the catalog's samples are kept.

Snapshots are keyed by the *sample* name as exposed (``vllm:spec_decode_num_drafts_total``,
``vllm:e2e_request_latency_seconds_bucket``), which is what the catalog spells: prometheus_client's
parser strips ``_total`` from counter *family* names, but its samples keep the exposed names.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families

from rules.signals import metric_names

# A label set, sorted by label name: hashable, so it can key a series.
Labels = tuple[tuple[str, str], ...]
# sample name -> label set -> value
Snapshot = Mapping[str, Mapping[Labels, float]]

_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def catalog_sample_names() -> frozenset[str]:
    """Every sample name the catalog can read.

    The catalog spells counters with ``_total`` and histograms by their base name, so a histogram
    contributes its ``_bucket``/``_count``/``_sum`` samples. Matching on sample names (not family
    types) also works for expositions without ``# TYPE`` lines.
    """
    names = metric_names()
    return frozenset(names | {name + suffix for name in names for suffix in _HISTOGRAM_SUFFIXES})


_CATALOG_SAMPLES = catalog_sample_names()


def parse_exposition(text: str, keep: Collection[str] | None = None) -> dict[str, dict[Labels, float]]:
    """Parse ``text`` and keep the samples named in ``keep`` (default: the catalog's).

    ``_created`` series (creation timestamps prometheus_client adds to counters and histograms) are
    never kept: their values are Unix times, not observations.

    Raises ValueError naming the problem when ``text`` is not Prometheus text exposition.
    """
    wanted = _CATALOG_SAMPLES if keep is None else keep
    snapshot: dict[str, dict[Labels, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created") or sample.name not in wanted:
                    continue
                labels = tuple(sorted(sample.labels.items()))
                snapshot.setdefault(sample.name, {})[labels] = float(sample.value)
    except Exception as exc:
        # The parser is lax and fails with assorted exception types (often a bare ValueError with no
        # message); callers only need to know the text is unusable, and why if we can tell.
        detail = str(exc) or type(exc).__name__
        raise ValueError(f"not valid Prometheus text exposition: {detail}") from exc
    return snapshot
