#!/usr/bin/env bash
# Paired before/after on one CUDA machine: earlier trees' own bench/bench_gpu.py and this tree's, in
# the order given, so that every figure of the comparison comes from the same device in one session:
#
#     bash bench/gpu_before_after.sh DATA OUT TREES STEP...     # from the repository root
#
# TREES: a folder of earlier trees, TREES/<label>/ holding one commit's torchmover/ and bench/
# (`git archive <commit> torchmover bench | tar -x -C TREES/<label>`); the label `head` is this
# tree. STEP: LIMIT:LABEL:MODELS[:ARGS], bench_gpu for MODELS (default or base) with the extra ARGS
# (spaces allowed) under LIMIT seconds, published into OUT/<label>_<MODELS>/ (the JSON only). Needs
# what bench/gpu_suite.sh needs. The comparison's table: `python bench/gpu_before_after.py OUT
# --commit LABEL=<commit> ... --pairs MODELS=N ...`. The run of
# bench/results/bench_gpu_cuda_before_after.md:
#
#     bash bench/gpu_before_after.sh DATA OUT TREES "95:memprev:base:--pairs 5344 --repeats 3" \
#         "95:head:base:--pairs 5344 --repeats 3" 80:issue:default 80:head:default \
#         "95:issue:base:--pairs 5344 --repeats 3"
set -u -o pipefail
DATA=$(realpath -m "$1") OUT=$(realpath -m "$2") TREES=$(realpath -m "$3")
shift 3
ROOT=$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || {
    echo "gpu_before_after: no CUDA device here: nothing measured"; exit 2; }
mkdir -p "$OUT"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    for step in "$@"; do
        IFS=: read -r limit label models args <<<"$step"
        dir=$ROOT; [ "$label" = head ] || dir=$TREES/$label
        echo "== $label $models (limit ${limit}s) $(date +%T)"
        # shellcheck disable=SC2086  # ARGS are words
        (cd "$dir" && PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} timeout "$limit" python bench/bench_gpu.py \
            --data "$DATA" --out "$OUT/${label}_$models" --models "$models" $args)
        rm -f "$OUT/${label}_$models"/*.md
    done
} 2>&1 | grep --line-buffered -v -E 'it/s\]|s/step' | tee "$OUT/gpu_before_after.log"
