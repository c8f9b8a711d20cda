"""specguard: keeps speculative decoding on vLLM healthy."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specguard")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
