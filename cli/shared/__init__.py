"""What several commands share: the config and source arguments (``options``), printing problems
and columns (``printing``), the state database a command reads (``statedb``), rule names given with
``--rule`` (``rulenames``), and what ``check`` and ``eval`` say of detectors (``detectors``)."""
