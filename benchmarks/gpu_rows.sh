#!/bin/bash
# The GPU rows of docs/benchmarks.md in one sitting on a CUDA machine, about 10
# minutes of an H100/H200 (a borrowed GPU's time is short):
#   1. tests/test_cuda.py (compiled flex, CUDA SDPA, KV cache, bf16 training), beside
#   2. each kind of bias scheme on the base model, flex (attention: auto) vs SDPA
#      with the bias as a mask (attention: sdpa), training;
#   then, alone on the GPU,
#   3. the base model (GPT-2-small shape, 50k vocabulary) in bf16 against Hugging
#      Face Llama and through Lightning: training tokens/s and MFU, with and without
#      torch.compile, and evaluation at 32k and 64k tokens with peak memory;
#   4. on a node with two GPUs or more, context parallelism: one sequence split over
#      2 GPUs (NCCL) against one GPU holding it, training tokens/s and each GPU's peak
#      memory beside the plan (benchmarks/context_parallel.py; skipped with one GPU,
#      where part 1's tests/test_cuda.py checks its FlexAttention path).
#
#   bash benchmarks/gpu_rows.sh <out dir>     # writes env.txt, *.log, *.json there
#
# Each part has its own time limit (TEST_S, SCHEMES_S, BASE_S, CP_S seconds), so a slow one
# cannot take the others' time; a part cut short still leaves its log (the bench logs
# every round). On an H200 (2026-11-27) the tests took 84 s, the first model of part 2
# about 3 min (a flex compile per scheme), part 3 over 220 s.
set -u
mkdir -p "${1:-gpu_rows}" && OUT=$(cd "${1:-gpu_rows}" && pwd) || exit 1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

{ date -u; nvidia-smi; $PY -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } > "$OUT/env.txt" 2>&1

stop_workers() { pkill -f benchmarks/bench_worker.py 2>/dev/null; sleep 1; }

timeout -k 10 "${TEST_S:-240}" $PY -m pytest tests/test_cuda.py -n 8 -q -p no:cacheprovider > "$OUT/pytest_cuda.log" 2>&1 &
tests=$!
sed 's/^name: base/name: base_sdpa/; s/^attention: auto/attention: sdpa/' conf/model/base.yaml > "$OUT/base_sdpa.yaml"
timeout -k 10 "${SCHEMES_S:-300}" $PY benchmarks/bench.py device=cuda "models=[base,$OUT/base_sdpa.yaml]" \
    schemes=[rope,alibi,t5,fire] peers=[plain] vocab_size=50257 seq_len=1024 batch_size=8 warmup=2 steps=5 \
    repeats=2 eval_lengths=[] peak_tflops=989 out="$OUT/bench_schemes.json" > "$OUT/bench_schemes.log" 2>&1
echo "bench_schemes rc=$?" >> "$OUT/env.txt"
stop_workers
wait $tests
echo "pytest rc=$?" >> "$OUT/env.txt"

timeout -k 10 "${BASE_S:-300}" $PY benchmarks/bench.py device=cuda models=[base] schemes=[rope] \
    peers=[hf,plain,lightning] compile=true vocab_size=50257 seq_len=1024 batch_size=16 warmup=3 steps=10 \
    repeats=3 eval_lengths=[32768,65536] eval_repeats=1 peak_tflops=989 out="$OUT/bench_base.json" > "$OUT/bench_base.log" 2>&1
echo "bench_base rc=$?" >> "$OUT/env.txt"
stop_workers

if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  timeout -k 10 "${CP_S:-240}" $PY benchmarks/context_parallel.py device=cuda model=base vocab_size=50257 \
      seq_lens=[8192,32768] steps=3 out="$OUT/context_parallel.json" > "$OUT/context_parallel.log" 2>&1
  echo "context_parallel rc=$?" >> "$OUT/env.txt"
else
  echo "context_parallel skipped: one GPU (it splits a sequence over two)" >> "$OUT/env.txt"
fi
date -u >> "$OUT/env.txt"
