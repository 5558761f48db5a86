#!/usr/bin/env bash
# The exported op on an H200, in three calls of the device machine (the cutlass wheel that QuACK needs arrives in two
# halves; the machine must stay warm between the calls). Results go to $OUT; docs/results/op/ holds the committed ones.
#   stage 1 (carry .whl .whl-baselines .int21): installs; INT21's JIT build in the background; the op's GPU tests and
#            the evaluator's; per-call cost without QuACK (in case stage 3 never runs)
#   stage 2 (carry the cutlass wheel's first half): the rest of the GPU test suite
#   stage 3 (carry the second half): QuACK installed; per-call cost with every peer
#   quickstart (carry .whl): a live quickstart run, today's pipeline throughput
#   final-a (carry .whl .whl-baselines .int21 .peer): the op's GPU tests, QuACK's own RMSNorm test file run against
#            the op (fetched into the ignored .peer/, imports pointed at the op; not part of the repository), the
#            per-call profile and cost without QuACK, and the torch.compile baseline re-measured (fwd bf16)
#   final-b (carry the cutlass wheel's first half): the live throughput of today's pipeline and of the worker pool
#   final-c (carry the second half): per-call cost with QuACK beside INT21 and torch
#   op (carry .int21; no wheels: the op needs torch and cuda-python only): the op's GPU tests, its per-call profile,
#            and per-call cost against INT21 and torch
set -uo pipefail
stage="${1:?usage: op_campaign.sh 1|2|3|quickstart}"
export PYTHONUNBUFFERED=1
int21_ready() {  # wait up to $1 seconds for INT21's JIT build
  for _ in $(seq "$1"); do grep -q "^built" /tmp/int21_build.log 2>/dev/null && break; sleep 1; done
  tail -n 2 /tmp/int21_build.log
}
case "$stage" in
1)
  source tests/gpu/host_setup.sh .whl-baselines
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  timeout 240 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_op_gpu.py \
    tests/gpu/test_gpu_evaluator.py 2>&1 | tee "$OUT/gpu-tests-op.log" | tail -n 8
  int21_ready 150
  export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
  timeout 200 python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall-no-quack" 2>"$OUT/percall-no-quack.log"
  ;;
2)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  timeout 500 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu --ignore=tests/gpu/test_rmsnorm_op_gpu.py \
    2>&1 | tee "$OUT/gpu-tests-rest.log" | tail -n 12
  ;;
3)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:$PWD/.int21:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  python3 -c "import quack.rmsnorm; print('quack importable')"
  timeout 400 python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall" 2>"$OUT/percall.log"
  ;;
final-a)
  source tests/gpu/host_setup.sh .whl-baselines
  export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  timeout 120 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_op_gpu.py 2>&1 \
    | tee "$OUT/gpu-tests-op.log" | tail -n 3
  (cd .peer && timeout 80 python3 -m pytest -q -p no:cacheprovider test_quack_suite_on_our_op.py -rf \
    -k "not True and not tuned and not cache and not degenerate and not large" 2>&1 | tee "$OUT/quack-suite.log" \
    | tail -n 15)
  python3 tests/gpu/profile_op.py 2>&1 | tee "$OUT/profile.txt" | head -n 10
  int21_ready 60
  timeout 90 python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall-no-quack" 2>"$OUT/percall-no-quack.log" \
    | tail -n 8
  timeout 150 kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 \
    --baselines torch_compile,torch_eager --reps 20 --out "$OUT/bench" --stem fwd-compile 2>&1 | tail -n 16
  ;;
final-b)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  timeout 230 python3 -m kernel_factory.evo.tools.scaling --live --out "$OUT/scaling" 2>&1 | tail -n 12
  ;;
final-c)
  source /tmp/install-wheels.sh .whl-baselines-parts
  export PYTHONPATH="/tmp/kf:$PWD/.int21:${PYTHONPATH}"; export PATH="/tmp/kf/bin:${PATH}"
  timeout 100 python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall" 2>"$OUT/percall.log" | tail -n 40
  ;;
op)
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/kf . 2>&1 | grep -v WARNING
  export PYTHONPATH="/tmp/kf:$PWD/.int21:${PYTHONPATH:-}"
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  timeout 200 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_op_gpu.py 2>&1 \
    | tee "$OUT/gpu-tests-op.log" | tail -n 4
  python3 tests/gpu/profile_op.py 2>&1 | tee "$OUT/profile.txt" | head -n 12
  int21_ready 150
  timeout 200 python3 -m kernel_factory.evo.tools.percall --out "$OUT/percall-no-quack" 2>"$OUT/percall-no-quack.log"
  ;;
quickstart)
  source tests/gpu/host_setup.sh
  timeout 200 kernel-factory run configs/quickstart.yaml -o out_dir=/tmp/runs --run-id h200-quickstart \
    2>&1 | tail -n 8 | tee "$OUT/quickstart.log"
  ;;
esac
