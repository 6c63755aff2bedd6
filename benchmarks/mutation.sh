#!/usr/bin/env bash
# The mutation score of the decision code (issue 95): mutmut (3.x) mutates compat/stats/, decide, evidence,
# metric_table, gate, action and testing/ ([tool.mutmut] in pyproject.toml: the modules and the fast tests that
# cover them), runs, for each mutant, the tests that reach the mutated function, and prints the score and every
# survivor. Not part of .ci/run. Resumable: mutmut keeps its results in mutants/ (ignored by git) and skips what it
# decided before; `rm -rf mutants` starts afresh.
#   bash benchmarks/mutation.sh                      every mutant of every module (about 7,500: hours on 2 cores)
#   bash benchmarks/mutation.sh 'adaptguard.compat.gate*'   only the mutants whose names match (mutmut's globs)
#   MUTATION_SAMPLE=70 bash benchmarks/mutation.sh   a uniform random sample of 70 mutants per module (seed
#       MUTATION_SEED, default 95), drawn from every mutant mutmut generates; the score over the sample, per module
#       and pooled, with 95 % Wilson intervals (about 20 minutes for 70 per module)
# In the project's venv (`pip install mutmut`, in [dev]). The score: killed / (killed + survived + timeout + no
# tests); a mutant no test reaches counts against it, as it should.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ADAPTGUARD_CACHE="${ADAPTGUARD_CACHE:-$(mktemp -d)}"
children="${MUTATION_CHILDREN:-2}"
names=("$@")
if [ -n "${MUTATION_SAMPLE:-}" ]; then
  # mutmut writes its mutants (and times the tests) on a run; a glob that matches none runs nothing else
  [ -d mutants ] || mutmut run --max-children "$children" 'adaptguard.no_such_module*' >/dev/null || true
  mapfile -t names < <(mutmut results --all true | python benchmarks/mutation_score.py sample "${MUTATION_SAMPLE}" \
    "${MUTATION_SEED:-95}")
  printf '%s\n' "${names[@]}" > mutants/sample.txt
fi
status=0
mutmut run --max-children "$children" "${names[@]}" || status=$?
mutmut results --all true > mutants/all.txt || true
python benchmarks/mutation_score.py score ${MUTATION_SAMPLE:+mutants/sample.txt}
exit "$status"
