"""Statistics of evaluation results: the Wilson score interval against its formula's values."""

import pytest

from longboat.utils.stats import wilson_interval as wilson


def test_wilson_interval_matches_the_formula_values():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson(10, 10)
    assert low == pytest.approx(0.7225, abs=1e-4) and high == 1.0
    low, high = wilson(0, 50)
    assert low == 0.0 and high == pytest.approx(0.0713, abs=1e-4)

