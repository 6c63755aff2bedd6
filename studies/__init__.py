"""The pre-registered studies (E1–E5, docs/preregistration.md) and the selection paper run: scripts that import
adaptguard as a user does (`python -m studies.<runner>` from the repository root); the package never imports them
(tests/test_layers.py)."""

from adaptguard.utils.quiet import hide_unused_library_noise

# before any runner's own imports: `transformers.Trainer` imports PEFT, which imports bitsandbytes, which logs its
# kernel note at import time — too early for a filter installed in the runner's `main`
hide_unused_library_noise()
