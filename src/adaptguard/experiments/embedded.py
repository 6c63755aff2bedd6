"""Moved to `adaptguard.models.embedded`; this alias goes in the next release."""

import importlib
import sys
import warnings

warnings.warn("adaptguard.experiments.embedded moved to adaptguard.models.embedded; import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("adaptguard.models.embedded")
