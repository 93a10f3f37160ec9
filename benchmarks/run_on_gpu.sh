#!/usr/bin/env bash
# The GPU checks of README "On a GPU", in one go, on a machine with a CUDA GPU and elmokit
# importable (installed, or PYTHONPATH=src):
#
#   bash benchmarks/run_on_gpu.sh TEXT_DIR OUT_DIR
#
# TEXT_DIR holds the three lm1b held-out shards (news.en.heldout-0001[0-2]-of-00050);
# OUT_DIR receives each step's log and JSON. Steps, each under its own time limit:
#   1. the CUDA tests (tests/test_cuda.py and the CUDA tests of the scoring and softmax files);
#   2. benchmarks/bench_gpu.py: inference, small and original shapes, batch 64 and 1, fp32 and bf16;
#   3. benchmarks/bench_train.py --devices cuda: training steps/s, small and original presets;
#   4. the whole test suite on that machine (pytest-xdist when installed).
set -uo pipefail
text=${1:?usage: run_on_gpu.sh TEXT_DIR OUT_DIR}
out=${2:?usage: run_on_gpu.sh TEXT_DIR OUT_DIR}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' | tee -a "$out/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run it with a limit, log to OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || status=1
}

step cuda-tests 150 "$python" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py \
    tests/test_scoring.py::test_scores_and_distributions_on_a_gpu_equal_the_cpus \
    tests/test_softmax.py::test_cuda_device_follows_inputs
step bench-gpu 160 "$python" benchmarks/bench_gpu.py --sentences "$text/news.en.heldout-00010-of-00050" \
    --time-budget 5 --json "$out/bench_gpu.json"
step bench-train 200 "$python" benchmarks/bench_train.py --train "$text/news.en.heldout-000*-of-00050" \
    --devices cuda --presets small,original --precisions fp32,bf16 --batch-size 128 --warmup 3 \
    --steps 20 --time-budget 10 --wait-quiet 1 --retry-busy 0 --json "$out/bench_train.json"
xdist=()
"$python" -c 'import xdist' 2>/dev/null && xdist=(-n 12)
step test-suite 200 "$python" -m pytest -q -p no:cacheprovider "${xdist[@]}"
exit $status
