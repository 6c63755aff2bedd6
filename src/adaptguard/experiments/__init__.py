"""Experiments and the demo: the embedded toy models, `adaptguard demo`, the MUSCLE update experiment, the
composition, selection and drift experiments. Reached from the CLI and examples only; the library never
imports this package (enforced by tests/test_layers.py)."""

from ..utils.quiet import hide_unused_library_noise

# before any runner's own imports: `transformers.Trainer` imports PEFT, which imports bitsandbytes, which logs its
# kernel note at import time — too early for a filter installed in the runner's `main`
hide_unused_library_noise()
