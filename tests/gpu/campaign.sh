#!/usr/bin/env bash
# GPU campaigns of the workload and numbers issues, each one call of the device machine (bare host, offline).
# Every result is packed into $OUT/results.tgz (the device returns at most 8 files); docs/results/ holds the
# committed copies.
#   numbers  (carry .whl .whl-baselines): the evaluator's repeat-timing test; torch.compile re-measured per shape
#            for forward fp16/fp32 and backward bf16/fp16; the live throughput of the quickstart, today's inline
#            worker against the worker pool
#   workload (carry .whl .whl-baselines .int21): the forward workload campaign (configs/rmsnorm_fwd_workload.yaml):
#            bucket searches, the panel, the learned dispatch, and the held-out bench against INT21, Liger, torch
set -uo pipefail
stage="${1:?usage: campaign.sh numbers|workload}"
export PYTHONUNBUFFERED=1
RES=/tmp/results
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . ; ls -la "$OUT"; }
trap pack EXIT
source tests/gpu/host_setup.sh .whl-baselines
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$RES/gpu.txt"
case "$stage" in
numbers)
  timeout 90 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_gpu_evaluator.py 2>&1 \
    | tee "$RES/gpu-evaluator-tests.log" | tail -n 4
  timeout 120 kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json \
    --dtypes float16,float32 --baselines torch_compile,torch_eager --reps 20 --out "$RES/bench" \
    --stem fwd-compile-fp16-fp32 2>&1 | tail -n 6
  timeout 120 kernel-factory bench --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json \
    --dtypes bfloat16,float16 --baselines torch_compile,torch_eager --reps 20 --out "$RES/bench" \
    --stem bwd-compile 2>&1 | tail -n 6
  timeout 280 python3 -m kernel_factory.evo.tools.scaling --live --config configs/quickstart.yaml \
    --out "$RES/scaling" 2>&1 | tail -n 6
  ;;
workload)
  export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  timeout 560 kernel-factory run configs/rmsnorm_fwd_workload.yaml -o out_dir=/tmp/runs \
    --run-id h200-fwd-workload 2>&1 | tee "$RES/workload.log" | grep -v "^gen " | tail -n 30
  cp -r /tmp/runs/h200-fwd-workload "$RES/" 2>/dev/null
  for j in /tmp/runs/h200-fwd-workload.*/journal.jsonl; do
    d="$RES/journals/$(basename "$(dirname "$j")")"; mkdir -p "$d"; gzip -c "$j" > "$d/journal.jsonl.gz"
  done
  ;;
esac
