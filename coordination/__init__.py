"""Fleet coordination: a counting semaphore with leases on a store the fleet already runs (etcd or
Redis), so that at most N hosts restart vLLM, or hold the fallback, at once. ``base`` is the small
interface the actions use; ``redis_store`` and ``etcd_store`` implement it through the stores' own
clients (imported only when configured); ``config`` is the ``coordination:`` section."""
