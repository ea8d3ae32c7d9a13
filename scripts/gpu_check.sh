#!/usr/bin/env bash
# The prepared GPU check of issue 32, one command for the device machine (its own torch, onnx and
# onnxruntime; no internet; the project run from src/). Stages, chosen by GPU_STAGES (default
# "tests bench"):
#   tests    every GPU-marked test                                  -> $OUT/gpu_tests.log
#   bench    benchmarks/gpu.py without torch.compile (3 models)     -> $OUT/gpu_bench.log
#   compile  benchmarks/gpu.py, torch.compile figures only, on GPU_COMPILE_MODELS (default resnet50)
#                                                                   -> $OUT/gpu_compile.log
# ModelOpt runs beside qdq when its wheels were carried in .peerwhl/ (benchmarks/README.md, "GPU
# cost"): they are installed into /tmp/peersite and run by the machine's python3 through a small
# wrapper, never into qdq's path; GPU_PEERS=0 leaves it out. Writes the device line to $OUT/device.txt; exits with the tests'
# status.
#
#   GPU_STAGES="tests bench" bash scripts/gpu_check.sh     # on the device machine, repository root
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
stages="${GPU_STAGES:-tests bench}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then  # carried wheels for qdq (device README), if any
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
fi
peers=(--no-peers)
if compgen -G ".peerwhl/*.whl" >/dev/null; then  # ModelOpt, in a path of its own
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/peersite .peerwhl/*.whl || exit 2
    printf '#!/bin/sh\nPYTHONPATH=/tmp/peersite exec python3 "$@"\n' >/tmp/peer-python
    chmod +x /tmp/peer-python
    peers=(--peer-python /tmp/peer-python)
elif [ -x /tmp/peers/bin/python ]; then
    peers=()
fi
[ "${GPU_PEERS:-1}" = 0 ] && peers=(--no-peers)
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch, onnx, onnxruntime; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA',
      '| onnx', onnx.__version__, '| onnxruntime', onnxruntime.__version__)" | tee "$out/device.txt"
status=0
if [[ " $stages " == *" tests "* ]]; then
    gpu_tests=$(grep -l "mark.gpu" tests/test_*.py)
    # shellcheck disable=SC2086
    timeout "${GPU_TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -rfEs \
        --durations=12 -m gpu ${GPU_TESTS:-$gpu_tests} 2>&1 | tee "$out/gpu_tests.log"
    status=${PIPESTATUS[0]}
fi
if [[ " $stages " == *" bench "* ]]; then
    # shellcheck disable=SC2086
    timeout "${GPU_BENCH_TIMEOUT:-200}" python3 benchmarks/gpu.py "${peers[@]}" --no-compile \
        --repeats 5 ${GPU_BENCH_ARGS:-} 2>&1 | tee "$out/gpu_bench.log"
fi
if [[ " $stages " == *" compile "* ]]; then
    # why a compiled model recompiles or breaks its graph (on the H200 a compiled ResNet-50
    # forward cost ~15 s a call with recompile_limit hit, where this CPU recompiles 7 times in all)
    # shellcheck disable=SC2086
    TORCH_LOGS="${GPU_TORCH_LOGS:-recompiles,graph_breaks}" \
        timeout "${GPU_COMPILE_TIMEOUT:-300}" python3 benchmarks/gpu.py "${peers[@]}" --repeats 5 \
        --only-compiled --models ${GPU_COMPILE_MODELS:-resnet50} 2>&1 | tee "$out/gpu_compile.log"
fi
exit "$status"
