"""Moved to `adaptguard.models.smollm2`; this alias goes in the next release."""

import importlib
import sys
import warnings

warnings.warn("adaptguard.experiments.smollm2 moved to adaptguard.models.smollm2; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("adaptguard.models.smollm2")
