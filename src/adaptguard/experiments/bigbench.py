"""Moved to `adaptguard.data.bigbench`; this alias goes in the next release."""

import importlib
import sys
import warnings

warnings.warn("adaptguard.experiments.bigbench moved to adaptguard.data.bigbench; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("adaptguard.data.bigbench")
