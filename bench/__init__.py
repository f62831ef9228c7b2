"""``make bench``: the pipeline's speed, memory and lag next to its baselines, measured in one run.

Every figure of a run comes from the same broker, the same store and the same pre-produced events, so the
ratios compare like with like. One module per measurement; :mod:`bench.results` holds the pure parts
(figures, targets, table and report rendering) and :mod:`bench.__main__` runs them in order.
"""
