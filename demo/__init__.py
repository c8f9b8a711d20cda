"""``specguard demo``: a simulated vLLM, the daemon and the weekly report, end to end.

It puts the other parts together (the simulator, the daemon, the report), so it sits above them.
"""
