#!/usr/bin/env bash
# The mutation score of the decision code (issue 95): mutmut (3.x) mutates compat/stats/, decide, evidence,
# metric_table, gate, action and testing/ ([tool.mutmut] in pyproject.toml: the modules and the fast tests that
# cover them), runs, for each mutant, the tests that reach the mutated function, and prints the score and every
# survivor. Not part of .ci/run: it takes hours on 2 cores for all of them. Resumable: mutmut keeps its results
# in mutants/ (ignored by git) and skips what it decided before; `rm -rf mutants` starts afresh.
#   bash benchmarks/mutation.sh                      every module of [tool.mutmut]
#   bash benchmarks/mutation.sh 'adaptguard.compat.gate*'   only the mutants whose names match (mutmut's globs)
# In the project's venv (`pip install mutmut`, in [dev]). The score: killed / (killed + survived + timeout + no
# tests); a mutant no test reaches counts against it, as it should.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ADAPTGUARD_CACHE="${ADAPTGUARD_CACHE:-$(mktemp -d)}"
status=0
mutmut run --max-children "${MUTATION_CHILDREN:-2}" "$@" || status=$?
mutmut export-cicd-stats >/dev/null
mutmut results > mutants/survivors.txt || true
python - "$@" <<'EOF'
import json
import sys
from pathlib import Path

stats = json.loads(Path("mutants/mutmut-cicd-stats.json").read_text())
against = stats["survived"] + stats["timeout"] + stats["no_tests"] + stats["suspicious"]
decided = stats["killed"] + against
score = stats["killed"] / decided if decided else float("nan")
print(f"mutation score: {stats['killed']} killed of {decided} ({100 * score:.1f} %); survived {stats['survived']}, "
      f"no tests {stats['no_tests']}, timeout {stats['timeout']}, suspicious {stats['suspicious']}, "
      f"skipped {stats['skipped']}, not yet run {stats['total'] - decided - stats['skipped']}")
survivors = [line.strip() for line in Path("mutants/survivors.txt").read_text().splitlines()
             if line.strip() and not line.strip().endswith(": not checked")]
print(f"{len(survivors)} not killed (mutmut show NAME prints one's diff):")
print("\n".join(f"  {s}" for s in survivors))
EOF
exit "$status"
