"""Read-side views of the stored and published aggregates: ``ttft breakdown``, ``ttft report``, ``ttft top``.

Every percentile over more than one window comes from merged sketch bins (:mod:`streams.core.rollup`),
never from averaging stored percentiles. :mod:`streams.views.summary` holds the pure folds the three
views share; :mod:`streams.views.reads` is the only module that queries the store.
"""
