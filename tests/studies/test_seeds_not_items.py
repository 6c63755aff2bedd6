"""E1's false-coverage-rate levels (`studies/seeds_not_items.py`): Benjamini & Yekutieli (2005), 1 − max(R, 1) · q / m,
so an interval excludes 0 exactly when BH at q selects its comparison."""

import pytest
from statsmodels.stats.multitest import multipletests

from studies.seeds_not_items import fcr_level


def test_fcr_levels_follow_the_selection():
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216]
    reject = multipletests(p, 0.05, method="fdr_bh")[0]
    assert fcr_level(0.05, int(sum(reject)), len(p)) == pytest.approx(1 - 2 * 0.05 / 10)
    assert fcr_level(0.05, 0, 4) == pytest.approx(1 - 0.05 / 4)  # none selected: the level of one
