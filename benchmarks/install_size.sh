#!/usr/bin/env bash
# What each install costs (issue 94): a fresh venv per row, timed from `python -m venv` to the last package, its
# size (du of the venv) and its package count, then the gate on the shipped pair with what it installed. Rows run one
# after another, never at once; pip's own cache is left as the machine has it (say so with the numbers).
#   bash benchmarks/install_size.sh [ROWS...]    # rows: core train eval (default: core train)
#   core:  pip install -c constraints.txt .              (the gate; no torch)
#   train: pip install torch==2.13.0, then -c constraints.txt ".[train]"   (what `pip install .` was before 94)
#   eval:  pip install torch==2.13.0, then -c constraints.txt ".[eval]"
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(core train)
base="$(python3 -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
echo "| install | seconds | MB | packages | gate (compare example:fp32 example:int8 --fail-on 'nfr>10%') |"
echo "|---|---:|---:|---:|---|"
for row in "${rows[@]}"; do
    work="$(mktemp -d)"
    start=$(date +%s.%N)
    "$base" -m venv "$work/venv"
    pip=("$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check)
    case "$row" in
        core) "${pip[@]}" -c constraints.txt . ;;
        train|eval) "${pip[@]}" torch==2.13.0 && "${pip[@]}" -c constraints.txt ".[$row]" ;;
        *) echo "unknown row $row" >&2; exit 2 ;;
    esac
    seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$start" "$(date +%s.%N)")
    size=$(du -sm "$work/venv" | cut -f1)
    count=$("$work/venv/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l)
    status=0
    (cd "$work" && "$work/venv/bin/adaptguard" compare example:fp32 example:int8 --fail-on 'nfr>10%' >/dev/null 2>&1) \
        || status=$?
    echo "| $row | $seconds | $size | $count | exit $status |"
    rm -rf "$work"
    cd "$root"
done
