"""adaptguard's lm-eval task YAMLs (installed as the package `adaptguard.lm_eval_tasks`).

Point lm-eval at this directory with `lm_eval --include_path "$(adaptguard tasks-dir)"`, or run
`adaptguard lm-eval ...`, which includes it (and every plugin's task directory) automatically.
"""
