#!/usr/bin/env bash
# One pass of everything that needs a CUDA device, sized for a short GPU lease (at most 9.5 minutes with the
# machine's start): the CUDA tests, where the encoder's time goes (against the previous tree where .base holds it),
# build throughput with fp16 layers and int8 codes, and encoder throughput with errors against the reference.
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
# transformers and its dependencies (~21 MB of wheels in .whl-tf/) do not fit beside .whl/ and the tree in the 64 MiB
# one call carries: a first call carrying only .whl-tf installs them into /tmp/site-tf, which stays on the machine
# for the next call while it is warm (benchmarks/README.md, "On a GPU").
if compgen -G ".whl-tf/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-tf \
        .whl-tf/*.whl || exit 1
fi
if [ -d /tmp/site-tf ]; then
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site-tf
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { cat "$OUT/install.log"; exit 1; }

step() {  # step NAME SECONDS COMMAND...: run, keep its log, say how it ended (only the steps named in STEPS)
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" ${name%%-*} "*) ;; *) return ;; esac
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}
# Which steps run: all by default, e.g. STEPS="tests phases" for a second, shorter call.
STEPS=${STEPS:-tests phases disk pipeline build encoder invariance transformer}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  grep -m1 'model name' /proc/cpuinfo; nproc; } | tee "$OUT/machine.txt"

step tests 150 python3 -m pytest -q -p no:cacheprovider -rs tests/encoder/test_cuda.py tests/encoder/test_transfer.py \
    tests/encoder/test_encoder.py tests/compat/test_compat_embedder.py tests/train/test_train.py \
    -k "cuda or Cuda or CUDA or test_cuda"
tail -5 "$OUT/tests.log" 2>/dev/null
# Where the encoder's time goes, per precision and batch size: outputs left on the device against host arrays.
step phases 120 python3 benchmarks/bench_encoder_phases.py --device cuda --precision bf16,fp32 \
    --batch-tokens 32768,65536,131072 --json "$OUT/phases.json"
grep -E "tok/s" "$OUT/phases.log" 2>/dev/null
# The same on the tree before this one, where a copy of its package lies in .base (see benchmarks/README.md).
if [ -d .base/elmo_cache ]; then
    step phases-base 70 env PYTHONPATH=".base:${PYTHONPATH:-}" python3 benchmarks/bench_encoder_phases.py \
        --device cuda --precision bf16,fp32 --batch-tokens 8192,32768 --json "$OUT/phases-base.json"
    grep -E "tok/s" "$OUT/phases-base.log" 2>/dev/null
fi
# The ceilings the writer works under: filling fresh against reused memory, writing from 1-8 threads, syncing.
mkdir -p "$ELMO_CACHE_BENCH_DIR"
step disk 60 python3 benchmarks/bench_disk.py --gib 4 --threads 1,2,4,8 --dir "$ELMO_CACHE_BENCH_DIR"
cat "$OUT/disk.log" 2>/dev/null
# The build without the model (the rate the host side allows), profiled per thread where yappi is installed, and
# the same on the previous tree where .base holds it.
step pipeline-fp16 100 python3 benchmarks/bench_build.py pipeline --size original --device cuda \
    --sentences 48000 --layers 1,2 --fp16 --repeats 2 --profile
if [ -d .base/elmo_cache ]; then
    step pipeline-base 80 env PYTHONPATH=".base:${PYTHONPATH:-}" python3 benchmarks/bench_build.py pipeline \
        --size original --device cuda --sentences 48000 --layers 1,2 --fp16 --repeats 2
fi
step pipeline-int8 60 python3 benchmarks/bench_build.py pipeline --size original --device cuda --sentences 48000 \
    --quantize int8 --repeats 1
grep -E "best|run " "$OUT"/pipeline-*.log 2>/dev/null
step build-fp16 70 python3 benchmarks/bench_build.py throughput --size original --device cuda --precision bf16 \
    --sentences 24000 --layers 1,2 --fp16 --repeats 2 --batch-tokens 65536
step build-int8 60 python3 benchmarks/bench_build.py throughput --size original --device cuda --precision bf16 \
    --sentences 24000 --quantize int8 --repeats 1 --batch-tokens 65536
grep -E "median|run " "$OUT"/build-*.log 2>/dev/null
# Against the plain reference implementation, side by side, with the errors of each precision.
step encoder 100 python3 benchmarks/bench_encoder.py --device cuda --precision fp32,bf16 --tokens 200000 \
    --repeats 1 --json "$OUT/encoder.json"
tail -25 "$OUT/encoder.log" 2>/dev/null
# Whether a sentence's rows are the same bits alone and in any batch on this device (issue 32): where they are,
# build --update copies single sentences' rows; where not, it encodes whole windows.
step invariance 60 python3 benchmarks/batch_invariance.py --device cuda --precision fp32,bf16
grep -E "check|random batches" "$OUT/invariance.log" 2>/dev/null
# A Transformer encoder against a plain transformers loop (issue 37, item 4), where transformers imports.
if python3 -c "import transformers" 2>/dev/null; then
    step transformer 150 python3 benchmarks/bench_transformer.py --size base --tokens 100000 --device cuda --repeats 2
    tail -12 "$OUT/transformer.log" 2>/dev/null
fi
cat "$OUT/summary.txt"
