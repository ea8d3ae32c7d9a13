#!/usr/bin/env bash
# The prepared GPU check of issue 32, one command for the device machine (its own torch, onnx and
# onnxruntime; no internet; the project run from src/): every GPU-marked test, then
# benchmarks/gpu.py (ModelOpt beside it when a peer environment exists at /tmp/peers, see
# benchmarks/README.md). Sized for one H100/H200 in under 8 minutes. Writes the device line, the
# test log and the benchmark table to ${OUT:-gpu-check}/; exits with the tests' status.
#
#   bash scripts/gpu_check.sh                  # on the device machine, from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels (device README), if any
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
fi
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA')" | tee "$out/device.txt"
gpu_tests=$(grep -l "mark.gpu" tests/test_*.py)
# shellcheck disable=SC2086
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu $gpu_tests 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
peers=()
[ -x /tmp/peers/bin/python ] || peers=(--no-peers)
timeout 240 python3 benchmarks/gpu.py "${peers[@]}" --repeats 5 2>&1 | tee "$out/gpu_bench.log"
exit "$status"
