"""Item 7 of the checklist: the fallback drill (``specguard preflight --drill``). ``claim``: who
holds the flag, and the drill's own record of it; ``traffic``: what shows traffic moving;
``run``: the drill, step by step, restored on every way out and recorded."""
