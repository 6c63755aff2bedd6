"""Every study: its runner, its texts, its registration and its results — the product's evidence, apart from the
product (src/adaptguard) and its usage examples (examples/). The pre-registered studies E1–E5 (`python -m
studies.<runner>` from the repository root: real_update, talr_vs_sft, recipes_vs_control, talr_worked_answers,
seeds_not_items) and the selection paper run (selection, select_tasks); E6 (quantization_flips --e6, its texts
e6_text); the paper runs (paper000_drift … paper003_tradeoff, quantization_flips); the gate's and evaluate's
simulations and replays (gate_simulation, gate_sizes, noise_floor_simulation, sequential_replay,
evaluate_until_decided: `python studies/<name>.py`). Registered in studies/preregistration.md; the lab notebook is
studies/results.md, its records and reports under studies/results/. The package never imports them
(tests/test_layers.py)."""

from adaptguard.utils.quiet import hide_unused_library_noise

# before any runner's own imports: `transformers.Trainer` imports PEFT, which imports bitsandbytes, which logs its
# kernel note at import time — too early for a filter installed in the runner's `main`
hide_unused_library_noise()
