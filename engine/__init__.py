"""The engine, pure: the state machine of every rule and series (``states``), and the sequential
detector a ``detect:`` rule judges with (``detection``; its stored state and calibration in
``detector_state``, its warm-up in ``warmup``)."""
