"""Sources answer: the value of this signal, per series, over this window, now."""

from daemon.sources.base import Series, Source, SourceResult

__all__ = ["Series", "Source", "SourceResult"]
