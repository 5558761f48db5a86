#!/usr/bin/env bash
# GPU campaigns of the workload and numbers issues, each one call of the device machine (bare host, offline).
# Every result is packed into $OUT/results.tgz (the device returns at most 8 files); docs/results/ holds the
# committed copies.
#   numbers  (carry .whl .whl-baselines): the evaluator's repeat-timing test; torch.compile re-measured per shape
#            for forward fp16/fp32 and backward bf16/fp16; the live throughput of the quickstart, today's inline
#            worker against the worker pool
#   workload (carry .whl .whl-baselines): the GPU test of the forward's tail genomes; the forward workload campaign
#            (configs/rmsnorm_fwd_workload.yaml): bucket searches, the panels, the learned dispatch (the held-out bench
#            is the next call's, to fit the 10-minute limit)
#   relearn  (carry .whl .whl-baselines .int21): a second pass over that campaign: its buckets' winners and the
#            per-row table's genomes timed on the training shapes, the rule learned again; its held-out bench; the
#            11 rows in bf16 with the new table. (A first try that also added the 11 rows to the panels ran out of
#            GPU memory: a worker taken over kept the last panel's inputs; fixed in evo/evaluate/worker.py.)
#   heldout  (carry .whl .whl-baselines .int21): the op's GPU tests with the learned table and the backward's
#            small-M GPU tests; the quickstart's rule-refused genomes on the GPU (tests/gpu/record_failures.sh);
#            the held-out bench of the committed campaign (docs/results/workload/h200-fwd-workload) against INT21,
#            QuACK, Liger and torch
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
  timeout 90 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_fwd_tail_gpu.py 2>&1 \
    | tee "$RES/fwd-tail-gpu-tests.log" | tail -n 3
  pack >/dev/null
  timeout 420 kernel-factory run configs/rmsnorm_fwd_workload.yaml -o out_dir=/tmp/runs -o workload.validate=false \
    --run-id h200-fwd-workload 2>&1 | tee "$RES/workload.log" | tail -n 12
  cp -r /tmp/runs/h200-fwd-workload "$RES/campaign"
  rm -rf "$RES/campaign/kernels/cubins" "$RES/campaign/kernels/sources"
  for j in /tmp/runs/h200-fwd-workload.*/journal.jsonl; do
    d="$RES/journals/$(basename "$(dirname "$j")")"; mkdir -p "$d"; gzip -c "$j" > "$d/journal.jsonl.gz"
  done
  ;;
heldout)
  export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  timeout 100 python3 -m pytest -q -m gpu --gpu -p no:cacheprovider tests/gpu/test_rmsnorm_op_gpu.py \
    tests/gpu/test_rmsnorm_bwd_small_gpu.py 2>&1 | tee "$RES/op-and-bwd-small-gpu-tests.log" | tail -n 4
  pack >/dev/null
  for _ in $(seq 150); do grep -q "^built" /tmp/int21_build.log 2>/dev/null && break; sleep 1; done
  tail -n 1 /tmp/int21_build.log
  cp -r docs/results/workload/h200-fwd-workload /tmp/campaign
  timeout 270 kernel-factory heldout /tmp/campaign 2>&1 | tee "$RES/heldout.log" | tail -n 5
  cp /tmp/campaign/heldout* "$RES/" 2>/dev/null; pack >/dev/null
  timeout 60 kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 \
    --baselines int21,quack,liger,torch_eager --reps 20 --out "$RES/bench" --stem fwd-bf16-learned 2>&1 | tail -n 3
  pack >/dev/null
  OUT_SAVED="$OUT"; OUT="$RES/record-failures" timeout 100 bash tests/gpu/record_failures.sh \
    > "$RES/record-failures.log" 2>&1; OUT="$OUT_SAVED"; tail -n 4 "$RES/record-failures.log"
  ;;
relearn)
  export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
  W=docs/results/workload/h200-fwd-workload
  timeout 130 kernel-factory run configs/rmsnorm_fwd_workload.yaml -o out_dir=/tmp/runs -o workload.validate=false \
    -o workload.searched_from=$W -o workload.panel_from=$W/per-row-table.json \
    --run-id h200-fwd-workload-2 2>&1 | tee "$RES/workload.log" | tail -n 6
  cp -r /tmp/runs/h200-fwd-workload-2 "$RES/campaign"; rm -rf "$RES/campaign/kernels/cubins" "$RES/campaign/kernels/sources"
  pack >/dev/null
  for _ in $(seq 60); do grep -q "^built" /tmp/int21_build.log 2>/dev/null && break; sleep 1; done
  timeout 60 kernel-factory heldout /tmp/runs/h200-fwd-workload-2 2>&1 | tee "$RES/heldout.log" | tail -n 4
  cp /tmp/runs/h200-fwd-workload-2/heldout* "$RES/" 2>/dev/null; pack >/dev/null
  kernel-factory export /tmp/runs/h200-fwd-workload-2 --problem rmsnorm_fwd --build > /dev/null 2>&1
  timeout 25 kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 \
    --baselines int21,quack,liger,torch_eager --reps 20 --out "$RES/bench" --stem fwd-bf16-learned 2>&1 | tail -n 2
  ;;
esac
