#!/usr/bin/env bash
# One pass of everything that needs a CUDA device, sized for a short GPU lease (at most 9 minutes):
# the CUDA tests, the precision table, encoder throughput per precision, build throughput, and the whole suite.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]          # logs and JSON land in OUT_DIR (default ./gpu-check)
#
# On a machine without the project's dependencies, put their wheels in .whl/ first (see benchmarks/README.md,
# "On a GPU"); they are installed to /tmp/site and put on PYTHONPATH. Each step has its own time limit, so one
# that hangs costs its own slot and the rest still run.
set -u
OUT=${1:-${OUT:-gpu-check}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ELMO_CACHE_BENCH_DIR=/tmp/elmo-bench
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { cat "$OUT/install.log"; exit 1; }

step() {  # step NAME SECONDS COMMAND...: run, keep its log, say how it ended
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  grep -m1 'model name' /proc/cpuinfo; nproc; } | tee "$OUT/machine.txt"

step tests 150 python3 -m pytest -q -p no:cacheprovider -rs tests/encoder/test_cuda.py tests/encoder/test_encoder.py \
    tests/compat/test_compat_embedder.py tests/train/test_train.py -k "cuda or Cuda or CUDA or test_cuda"
tail -5 "$OUT/tests.log"
step precision 30 python3 benchmarks/precision_error.py --device cuda
tail -12 "$OUT/precision.log"
step encoder 150 python3 benchmarks/bench_encoder.py --device cuda --precision fp32,bf16,fp16 --tokens 200000 \
    --repeats 2 --json "$OUT/encoder.json"
tail -25 "$OUT/encoder.log"
step build 90 python3 benchmarks/bench_build.py throughput --size original --device cuda --sentences 4000 \
    --layers 1,2 --fp16 --repeats 2
tail -8 "$OUT/build.log"
# The whole suite on this machine's torch and Python (and with CUDA as the default device), where time is left.
step suite 120 python3 -m pytest -q -p no:cacheprovider -n 12 -rfE tests --ignore tests/encoder/test_cuda.py
tail -30 "$OUT/suite.log"
cat "$OUT/summary.txt"
