"""Backward compatibility of a model update (Echterhoff et al. §3) and `adaptguard compare`/`evaluate`, by concern:
`stats/` (the maths: flip metrics, replicate runs, anytime and group-sequential tests), `reading/` (runs in: lm-eval,
Inspect, lighteval, JSONL, `evaluate`'s record), `evidence` (each kind of evidence's tests), `decide`, `gate` and
`compare` (the decisions, typed in `comparison` and `verdicts`; the metrics in `metric_table`), `render/` (JSON,
terminal, Markdown, the page), `harness/` (lm-eval glue: the `compat_*` tasks, `LMEvalCallback`, `evaluate`'s loop)
and `action` (the GitHub Action). docs/architecture.md draws the layers."""
