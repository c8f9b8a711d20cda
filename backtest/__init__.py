"""``specguard backtest``: what rules would have done on recorded traffic, before they go live.

Recorded history (the store's per-minute rollups, or Prometheus's range of samples) is replayed on a
simulated clock through the daemon's own parts: ``judge.py`` evaluates each rule with the daemon's
``evaluate_rule`` (the pure engine and the sequential detector) at every moment of the period;
``act.py`` then stores what it decided and hands it to the real dispatcher, guards and fallback
controller, in a scratch store, with the actions rehearsed (``rehearsal.py``: nothing in the world
changes). ``plan.py`` says how each rule is replayed and what history cannot replay; ``incidents.py``
scores the firings against known incidents; ``calibrate.py`` proposes a detector's φ;
``result.py`` turns it into episodes and scores, ``render.py`` (with ``--compare``) and ``page.py``
show it; ``run.py`` is all of it in order.
"""
