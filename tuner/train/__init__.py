"""The training-loop side: the accumulating loop (``accumulate``), ``plan_training``
(``planning``: look up, else profile, then plan) and the framework integrations.

    global batch = micro batch × accumulation steps × data-parallel size
    (world size, or world size / tp on a 2-D mesh)
"""
