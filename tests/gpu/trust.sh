#!/usr/bin/env bash
# The GPU part of "every measurement a user can trust": three device calls, back to back, each carrying one bundle
# of tests/gpu/bundles.sh (docs/gpu-host.md). Results are packed into $OUT/trust-<stage>.tgz.
#   a  (carry .gpu-a .int21): deap, mlflow and Liger installed; INT21's build started in the background; the GPU
#      suite (tests/gpu/run.sh)
#   b  (carry .gpu-b): the search's fitness against its A/B re-time (python -m kernel_factory.evo.tools.agreement)
#      for torch eager, torch.compile and Liger, on the RMSNorm quickstart and on the softmax plugin
#   c  (carry .gpu-c): QuACK complete, every peer imports; the forward campaign's held-out bench with every peer
#   d  (nothing carried; the host of c): the forward bf16 benchmark rows with every peer, QuACK tuned included
set -uo pipefail
stage="${1:?usage: trust.sh a|b|c|d}"
export PYTHONUNBUFFERED=1
RES=/tmp/results-$stage
mkdir -p "$RES"
pack() { tar czf "$OUT/trust-$stage.tgz" -C "$RES" . ; ls -la "$OUT"; }
trap pack EXIT
case "$stage" in
a)
  export KF_PEERS=liger   # QuACK completes in call c; INT21 builds in the background meanwhile
  source tests/gpu/host_setup.sh .gpu-a > "$RES/host_setup.log" 2>&1 || { cat "$RES/host_setup.log"; exit 2; }
  tail -n 2 "$RES/host_setup.log"
  int21_build
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RES/gpu.txt"
  OUT="$RES/gpu-suite" timeout 480 tests/gpu/run.sh -p no:cacheprovider --durations=15 2>&1 | tail -n 30
  ;;
b)
  KF_PEERS=liger source tests/gpu/host_setup.sh .gpu-b > "$RES/host_setup.log" 2>&1 || { cat "$RES/host_setup.log"; exit 2; }
  timeout 330 python3 -m kernel_factory.evo.tools.agreement --config configs/quickstart.yaml \
    --baselines torch_eager,torch_compile,liger -o search.generations=3 --out "$RES/agreement-quickstart" \
    > "$RES/agreement-quickstart.log" 2>&1; tail -n 8 "$RES/agreement-quickstart.log"
  pack > /dev/null
  timeout 200 python3 -m kernel_factory.evo.tools.agreement --config configs/softmax.yaml \
    --baselines torch_eager,torch_compile,liger --out "$RES/agreement-softmax" \
    > "$RES/agreement-softmax.log" 2>&1; tail -n 8 "$RES/agreement-softmax.log"
  rm -rf "$RES"/agreement-*/runs/cache "$RES"/agreement-*/runs/artifacts
  ;;
c)
  source tests/gpu/host_setup.sh .gpu-c > "$RES/host_setup.log" 2>&1 || { cat "$RES/host_setup.log"; exit 2; }
  tail -n 2 "$RES/host_setup.log"
  int21_wait 240 || exit 2
  cp -r docs/results/workload/h200-fwd-workload-2 /tmp/campaign
  timeout 540 kernel-factory heldout /tmp/campaign 2>&1 | tee "$RES/heldout.log" | tail -n 6
  cp /tmp/campaign/heldout* "$RES/" 2>/dev/null
  ;;
d)
  source tests/gpu/host_setup.sh > "$RES/host_setup.log" 2>&1 || { cat "$RES/host_setup.log"; exit 2; }
  timeout 480 kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 \
    --reps 20 --out "$RES/bench" --stem fwd-bf16 2>&1 | tail -n 6
  ;;
*) echo "trust.sh: unknown stage $stage (a, b, c or d)" >&2; exit 2 ;;
esac
