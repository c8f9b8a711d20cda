"""Events to action runs: the dispatcher, the guards a run passes, the fallback controller, and the
memory actions keep."""

from specguard.dispatch.describe import describe
from specguard.dispatch.dispatcher import Dispatcher

__all__ = ["Dispatcher", "describe"]
