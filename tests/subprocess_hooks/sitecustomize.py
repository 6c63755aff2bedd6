"""Run by Python at the start of each subprocess of the test suite (conftest puts this folder on PYTHONPATH): the
suite's one-per-session cache of lm-eval's own task index (`tests/lm_eval_index.py`). Standard library only."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("adaptguard_tests_lm_eval_index",
                                               Path(__file__).resolve().parents[1] / "lm_eval_index.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_module.install()
