"""Events to action runs: the dispatcher, the guards a run passes, and the memory actions keep."""

from daemon.dispatch.dispatcher import Dispatcher, describe

__all__ = ["Dispatcher", "describe"]
