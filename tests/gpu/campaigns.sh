#!/usr/bin/env bash
# The forward's second workload campaign and the backward's first (issues 28 and 29), with their held-out benches
# against every declared peer: three device calls back to back, each carrying one bundle of tests/gpu/bundles.sh
# (QuACK installs whole only with the third). Results are packed into $OUT/campaigns-<stage>.tgz after every step.
#   fwd (carry .gpu-a .int21): INT21's build started in the background; the forward campaign
#       (configs/rmsnorm_fwd_workload.yaml: bucket searches in the grown space with sub-warp rows, the panels with the
#       op's genomes, their tail=peel twins and the 11 benchmark rows, the learned rule), no held-out bench yet
#   bwd (carry .gpu-b): the forward's rule learned again from its searches if call fwd was cut in its panels; then the
#       backward campaign (configs/rmsnorm_bwd_workload.yaml) in what is left of the call
#   heldout (carry .gpu-c .int21): every peer loads (QuACK complete, INT21 built); the held-out bench of the forward
#       campaign, then of the backward one, each against INT21, QuACK, Liger, torch eager and torch.compile
# On 2026-12-03 the forward's fp32 panel with the 11 benchmark rows ran out of GPU memory (the bf16 and fp16 panels'
# memory still held by the worker): both campaigns then ran with `-o workload.extra_train=null`, the forward as a
# second pass over its searches in call heldout, and the backward's held-out bench was cut by the call's limit
# (docs/results/workload/h200-2026-12-03/).
# Every step has its own timeout; a bench cut short keeps its rows so far (evo/tools/heldout.py).
set -uo pipefail
stage="${1:?usage: campaigns.sh fwd|bwd|heldout}"
export PYTHONUNBUFFERED=1
RES=/tmp/results-$stage
FWD=h200-fwd-workload-3
BWD=h200-bwd-workload-1
mkdir -p "$RES"
pack() { tar czf "$OUT/campaigns-$stage.tgz" -C "$RES" . ; ls -la "$OUT"; }
trap pack EXIT
setup() {
  source tests/gpu/host_setup.sh "$@" > "$RES/host_setup.log" 2>&1 || { cat "$RES/host_setup.log"; exit 2; }
  tail -n 2 "$RES/host_setup.log"
}
keep() {   # NAME: a campaign's folder (less its built kernels) and its bucket journals, gzipped, into $RES
  local name="$1"
  rm -rf "$RES/$name"; cp -r "/tmp/runs/$name" "$RES/$name"; rm -rf "$RES/$name/kernels/cubins" "$RES/$name/kernels/sources"
  for j in /tmp/runs/"$name".*/journal.jsonl; do
    [ -f "$j" ] || continue
    d="$RES/$name/journals/$(basename "$(dirname "$j")")"; mkdir -p "$d"; gzip -c "$j" > "$d/journal.jsonl.gz"
  done
  pack > /dev/null
}
campaign() {   # CONFIG NAME SECONDS [overrides...]
  local cfg="$1" name="$2" secs="$3"; shift 3
  echo "$name: $secs s from $SECONDS s"
  timeout "$secs" kernel-factory run "$cfg" -o out_dir=/tmp/runs -o workload.validate=false "$@" --run-id "$name" \
    > "$RES/$name.log" 2>&1; echo "exit $?" >> "$RES/$name.log"; grep -v "^gen\|^  " "$RES/$name.log" | tail -n 12
  keep "$name"
}
case "$stage" in
fwd)
  export KF_PEERS=liger   # QuACK completes in call heldout; INT21 builds in the background meanwhile
  setup .gpu-a
  int21_build
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RES/gpu.txt"
  campaign configs/rmsnorm_fwd_workload.yaml "$FWD" $(( 520 - SECONDS )) -o workload.search_s=170
  ;;
bwd)
  export KF_PEERS=liger
  setup .gpu-b
  if [ ! -f "/tmp/runs/$FWD/kernels/dispatch.json" ]; then   # call fwd was cut in its panels: learn from its searches
    campaign configs/rmsnorm_fwd_workload.yaml "$FWD-relearn" 260 -o "workload.searched_from=/tmp/runs/$FWD"
  fi
  campaign configs/rmsnorm_bwd_workload.yaml "$BWD" $(( 510 - SECONDS )) -o workload.search_s=170
  ;;
heldout)
  setup .gpu-c
  int21_wait 120 || exit 2
  for name in "$FWD" "$FWD-relearn" "$BWD"; do
    [ -f "/tmp/runs/$name/kernels/dispatch.json" ] || continue
    secs=290
    [ "$name" = "$BWD" ] && secs=$(( 560 - SECONDS ))
    echo "heldout $name: $secs s from $SECONDS s"
    timeout "$secs" kernel-factory heldout "/tmp/runs/$name" > "$RES/heldout-$name.log" 2>&1
    echo "exit $?" >> "$RES/heldout-$name.log"; tail -n 5 "$RES/heldout-$name.log"
    mkdir -p "$RES/$name"; cp /tmp/runs/"$name"/heldout* "$RES/$name/" 2>/dev/null; pack > /dev/null
  done
  ;;
*) echo "campaigns.sh: unknown stage $stage (fwd, bwd or heldout)" >&2; exit 2 ;;
esac
