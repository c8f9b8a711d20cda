"""Sources answer: the value of this signal, per series, over this window, now."""

from specguard.sources.base import Series, Source, SourceResult

__all__ = ["Series", "Source", "SourceResult"]
