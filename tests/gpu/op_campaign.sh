#!/usr/bin/env bash
# The exported op on an H200, in three calls of the device machine (the cutlass wheel that QuACK needs arrives in two
# halves; the machine must stay warm between the calls). Results go to $OUT; docs/results/op/ holds the committed ones.
#   stage 1 (carry .whl .whl-baselines .int21): installs; INT21's JIT build in the background; the op's GPU tests and
#            the evaluator's; a live quickstart run (today's pipeline throughput)
#   stage 2 (carry the cutlass wheel's first half): per-call cost without QuACK (in case stage 3 never runs)
#   stage 3 (carry the second half): QuACK installed; per-call cost with every peer
set -uo pipefail
stage="${1:?usage: op_campaign.sh 1|2|3}"
export PYTHONUNBUFFERED=1
case "$stage" in
1)
  source tests/gpu/host_setup.sh .whl-baselines
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension()" \
     > /tmp/int21_build.log 2>&1 &)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  timeout 330 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_op_gpu.py \
    tests/gpu/test_gpu_evaluator.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -n 25
  timeout 150 kernel-factory run configs/quickstart.yaml -o out_dir=/tmp/runs --run-id h200-quickstart \
    2>&1 | tail -n 8 | tee "$OUT/quickstart.log"
  cp /tmp/runs/h200-quickstart/summary.json "$OUT/quickstart-summary.json" 2>/dev/null
  tail -n 3 /tmp/int21_build.log
  ;;
2)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:$PWD/.int21:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  tail -n 3 /tmp/int21_build.log
  python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall-no-quack" 2>"$OUT/percall-no-quack.log"
  ;;
3)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:$PWD/.int21:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  python3 -c "import quack.rmsnorm; print('quack', quack.__version__ if hasattr(quack, '__version__') else '?')"
  python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall" 2>"$OUT/percall.log"
  ;;
esac
