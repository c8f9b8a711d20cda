"""Events to action runs: the dispatcher, the guards a run passes, the fallback controller, and the
memory actions keep."""

from daemon.dispatch.describe import describe
from daemon.dispatch.dispatcher import Dispatcher

__all__ = ["Dispatcher", "describe"]
