#!/usr/bin/env bash
# The GPU check (issue 56), ready to run on one card with no network: MUSCLE and TALR against plain LoRA / full SFT
# at the issue's sizes, in fp32 and bf16, each table written to a folder (8 files), after the tiled loss's CUDA test.
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default OUT_DIR: $OUT if set, else gpu-bench-out
#   QUICK=1 bash benchmarks/gpu.sh out        # small sizes, a few steps: the script's mechanics (on a CPU too)
#
# Python packages: the machine's own (torch, transformers, peft, accelerate, ...); what it lacks is installed from
# wheels in .whl/ beside the repository (`bash benchmarks/gpu_wheels.sh` fetches them on a machine with PyPI),
# never from the network. adaptguard itself runs from src/. Time: on one H200 (2026-11-28, 10 rounds) the CUDA test
# and MUSCLE fp32 / TALR fp32 / MUSCLE bf16 took about 9 minutes, so with 6 rounds the four tables take about 8;
# TILES=1 adds two fixed-tile rows (~2 min each). Sizes: the issue's (V 131,072, L 1,024, B 8, hidden 1,024,
# 8 layers, LoRA r 16; TALR at L 2,048, B 4).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-bench-out}}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
device=$(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
python3 -c "import torch, transformers, trl, peft; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'trl', trl.__version__, 'peft', peft.__version__, 'device',
torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" | tee "$out/versions.txt" || exit 1
if [ "${QUICK:-0}" = 1 ]; then
    muscle=(--vocab 4096 --seq 64 --batch 2 --hidden 64 --layers 2 --steps 2 --memory-repeats 1)
    talr=(--vocab 4096 --seq 64 --batch 2 --hidden 64 --layers 2 --steps 2 --memory-repeats 1)
else
    muscle=(--vocab 131072 --seq 1024 --batch 8 --hidden 1024 --layers 8 --steps 6 --memory-repeats 1)
    talr=(--vocab 131072 --seq 2048 --batch 4 --hidden 1024 --layers 8 --steps 6 --memory-repeats 1)
fi
status=0
# the GPU path (compiled tiles, tile sizes from free memory) against the reference loss on the card (skips on a CPU)
python3 -m pytest -q -p no:cacheprovider tests/muscle/test_muscle_tiled.py -k cuda 2>&1 | tee "$out/tests_cuda.txt" || status=1
# MUSCLE first (the goal), then TALR: a run cut off at its limit loses the least
for dtype in fp32 bf16; do
    flag=$([ "$dtype" = bf16 ] && echo --bf16 || true)
    python3 benchmarks/bench_muscle.py "${muscle[@]}" --device "$device" $flag --with-logits \
        2>&1 | tee "$out/muscle_$dtype.txt" || status=1
done
# the exact rows with the student's log-sum-exp from cut-cross-entropy (a mask that reads only the teachers), against
# the same mask on the chunked torch path: the kernel's own ratio to SFT
if python3 -c "import cut_cross_entropy" 2>/dev/null; then
    for dtype in bf16 fp32; do
        flag=$([ "$dtype" = bf16 ] && echo --bf16 || true)
        for kernel in cut_cross_entropy torch; do
            python3 benchmarks/bench_muscle.py "${muscle[@]}" --device "$device" $flag --mask old_likelier_token \
                --lse-kernel "$kernel" 2>&1 | tee "$out/muscle_${dtype}_lse_${kernel}.txt" || status=1
        done
    done
fi
for dtype in fp32 bf16; do
    flag=$([ "$dtype" = bf16 ] && echo --bf16 || true)
    python3 benchmarks/bench_talr.py "${talr[@]}" --device "$device" $flag \
        2>&1 | tee "$out/talr_$dtype.txt" || status=1
done
# TILES=1: the tile rule's check, the same MUSCLE steps at the fixed CPU tile (1,024 x 8,192) beside the auto rows
if [ "${TILES:-0}" = 1 ]; then
    for dtype in fp32 bf16; do
        flag=$([ "$dtype" = bf16 ] && echo --bf16 || true)
        python3 benchmarks/bench_muscle.py "${muscle[@]}" --device "$device" $flag --tiles 1024x8192 \
            2>&1 | tee "$out/muscle_${dtype}_tiles_1024x8192.txt" || status=1
    done
fi
exit $status
