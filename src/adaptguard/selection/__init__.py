"""Task selection (Xu's thesis) and drift risk (Ni et al.): the maths in `coverage`, the embedders in
`embedders`, the CLI jobs in `jobs`."""

from .coverage import (
    FEATURES,
    METHODS,
    SelectionResult,
    consistency,
    coverage,
    drift_risk,
    first_principal_component,
    select_tasks,
    shrunk_covariance,
)

__all__ = ["FEATURES", "METHODS", "SelectionResult", "consistency", "coverage", "drift_risk",
           "first_principal_component", "select_tasks", "shrunk_covariance"]
