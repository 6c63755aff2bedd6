"""Backward-compatibility metrics (Echterhoff et al. §3): `metrics` (the flip formulas, pure numpy/scipy), `runs`
(reading lm-eval `--log_samples` output and extracting predictions), `compare` (`adaptguard compare`), `report`
(tables and the quadrant figure), `harness` (the in-harness `compat_*` tasks) and `callback` (`LMEvalCallback`)."""
