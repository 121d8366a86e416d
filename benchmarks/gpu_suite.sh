#!/usr/bin/env bash
# The GPU suite (tests/train/test_gpu.py) on a machine with a CUDA GPU, its logs kept:
#   bash benchmarks/gpu_suite.sh OUT [pytest args]
# OUT gets env.txt (nvidia-smi, torch), pytest.log, gpu.md/gpu.json (also written to benchmarks/results/) and
# logs.tgz (each case's plan.json, launch output, metrics.jsonl and verify report). GENCONF_GPU_CASES=a,b runs
# those cases alone; GENCONF_GPU_TIMEOUT bounds pytest (seconds) so the logs still come back.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/gpu_suite.sh OUT [pytest args]}
shift
mkdir -p "$out/logs"
{
  nvidia-smi
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  python3 -m pip list 2>/dev/null | grep -i -E '^(torch|deepspeed|megatron|transformer|torchao|triton|numpy) '
} >"$out/env.txt" 2>&1
GENCONF_GPU_LOGS="$out/logs" PYTHONUNBUFFERED=1 timeout "${GENCONF_GPU_TIMEOUT:-7200}" \
  python3 -m pytest -m gpu tests/train/test_gpu.py -v -rA -p no:cacheprovider "$@" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
cp benchmarks/results/gpu.md benchmarks/results/gpu.json "$out/" 2>/dev/null
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
exit "$rc"
