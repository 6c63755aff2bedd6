"""Experiments and the demo: the embedded toy models, `adaptguard demo`, the MUSCLE update experiment, the
composition, selection and drift experiments. Reached from the CLI and examples only; the library never
imports this package (enforced by tests/test_layers.py)."""
