-- ttftSketchQuantile(bins, zero_count, q, relative_accuracy): the SQL twin of
-- streams.core.sketch.quantile_from_bins, generated from streams.store.sketch_sql.udf_statement()
-- (tests/unit/test_no_quantile_sql.py and tests/integration/test_sketch_sql.py pin it).
-- SQL UDFs are global, not per database: OR REPLACE makes re-applying it harmless.
-- Usage: ttftSketchQuantile(sumMap(bins), sum(zero_count), 0.95, any(relative_accuracy))

CREATE OR REPLACE FUNCTION ttftSketchQuantile AS (bins, zero_count, q, relative_accuracy) -> arrayMap((m_, z_, q_, a_) -> arrayMap((ks_, n_, g_) -> if(n_ = 0, NULL, arrayMap(r_ -> if(r_ < z_, toFloat64(0), arrayMap(k_ -> 2 * if(k_ >= 0, arrayFold((st_, bit_) -> (if(bitTest(abs(k_), bit_), st_.1 * st_.2, st_.1), st_.2 * st_.2), range(32), (toFloat64(1), g_)).1, 1 / arrayFold((st_, bit_) -> (if(bitTest(abs(k_), bit_), st_.1 * st_.2, st_.1), st_.2 * st_.2), range(32), (toFloat64(1), g_)).1) / (g_ + 1), [toInt64(ks_[arrayFirstIndex(c_ -> z_ + c_ > r_, arrayCumSum(arrayMap(x_ -> m_[x_], ks_)))])])[1]), [toInt64(floor(q_ * (toFloat64(n_) - 1)))])[1]), [arraySort(mapKeys(m_))], [z_ + arraySum(mapValues(m_))], [(1 + a_) / (1 - a_)])[1], [bins], [toUInt64(zero_count)], [toFloat64((q))], [toFloat64((relative_accuracy))])[1];
