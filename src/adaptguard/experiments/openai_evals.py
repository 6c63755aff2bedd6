"""Moved to `adaptguard.data.openai_evals`; this alias goes in the next release."""

import importlib
import sys
import warnings

warnings.warn("adaptguard.experiments.openai_evals moved to adaptguard.data.openai_evals; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("adaptguard.data.openai_evals")
