"""specguard: keeps speculative decoding on vLLM healthy.

Installed, this one package holds all of specguard: ``specguard.cli``, ``specguard.daemon``,
``specguard.rules``... In the source tree those are folders at the top of the repository, and the
links beside this file name them under ``specguard`` (setup.py maps them the same way for the wheel).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specguard")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
