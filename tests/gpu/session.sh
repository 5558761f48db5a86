# The H200 evidence of issues 3 and 6, in three calls on one warm GPU host (source it from the repository root
# after tests/gpu/host_setup.sh; $OUT is where results go; stage c first copies runs/ops/* into kernels/ops/ and
# then sources host_setup.sh, so that the installed op carries the new tables). Stages:
#   a: GPU tests, the fault suite, per-shape forward runs (bf16, fp16) and the bf16 backward run
#   b: the remaining per-shape runs (forward fp32, backward fp16), then the dispatch tables are exported
#   c: the bench reports against every baseline present (QuACK needs its wheels installed by then)
# Optional peers are found by import name only (quack, liger_kernel, rmsnorm for INT21's RMSNorm-H100).
kf_stage="${1:?stage a, b or c}"
kf_ev="/tmp/kf-ev/$kf_stage"   # everything lands here, and goes back to $OUT as two archives (few files)
mkdir -p "$kf_ev" runs
kf_run() {  # name, config, extra overrides...
  local name="$1" cfg="$2"; shift 2
  kernel-factory run "$cfg" --run-id "$name" "$@" > "$kf_ev/run-$name.log" 2>&1
  echo "run $name: rc=$? $(tail -n 4 "$kf_ev/run-$name.log" | tr '\n' ' ')"
}
kf_pack() {
  tar czf "$OUT/runs-$kf_stage.tgz" runs/h200-*/journal.jsonl runs/h200-*/lessons.md runs/ops 2>/dev/null
  tar czf "$OUT/ev-$kf_stage.tgz" -C /tmp/kf-ev "$kf_stage"
}
case "$kf_stage" in
a)
  timeout 300 python3 -m pytest -m gpu --gpu tests/gpu -q -p no:cacheprovider -rfE > "$kf_ev/gpu_tests.log" 2>&1
  tail -n 15 "$kf_ev/gpu_tests.log"
  kernel-factory faults --out "$kf_ev/faults.json" > "$kf_ev/faults.md" 2>&1; echo "faults rc=$?"
  cat "$kf_ev/faults.md"
  kf_run h200-fwd-bf16 configs/rmsnorm_fwd_pershape.yaml -o search.seeds_from=kernels/ops/rmsnorm_fwd.json \
    -o search.wall_clock_s=100
  kf_run h200-fwd-fp16 configs/rmsnorm_fwd_pershape.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=60 \
    -o search.seeds_from=kernels/ops/rmsnorm_fwd.json
  kf_run h200-bwd-bf16 configs/rmsnorm_bwd_pershape.yaml -o search.wall_clock_s=90
  ;;
b)
  timeout 100 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_fwd_wide_gpu.py -q \
    -p no:cacheprovider -rfE > "$kf_ev/gpu_tests_b.log" 2>&1; tail -n 4 "$kf_ev/gpu_tests_b.log"
  kernel-factory faults --out "$kf_ev/faults.json" > "$kf_ev/faults.md" 2>&1; echo "faults rc=$?"
  cat "$kf_ev/faults.md"
  kf_run h200-fwd-fp32 configs/rmsnorm_fwd_pershape.yaml -o 'dtypes=[float32]' -o search.wall_clock_s=60 \
    -o search.seeds_from=kernels/ops/rmsnorm_fwd.json
  kf_run h200-bwd-fp16 configs/rmsnorm_bwd_pershape.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=60
  kf_run h200-fwd-heldout configs/rmsnorm_fwd_pershape.yaml -o shapes=heldout -o search.wall_clock_s=40
  # Exports go to runs/ops (ignored, so kept on the host); stage c copies them into kernels/ops before installing.
  kernel-factory export --problem rmsnorm_fwd h200-fwd-bf16 h200-fwd-fp16 h200-fwd-fp32 --build \
    --out runs/ops/rmsnorm_fwd.json > "$kf_ev/export-fwd.log" 2>&1; echo "export fwd rc=$?"
  kernel-factory export --problem rmsnorm_bwd h200-bwd-bf16 h200-bwd-fp16 --build \
    --out runs/ops/rmsnorm_bwd.json > "$kf_ev/export-bwd.log" 2>&1; echo "export bwd rc=$?"
  kernel-factory export --problem rmsnorm_fwd h200-fwd-heldout --out runs/heldout/rmsnorm_fwd.json \
    > "$kf_ev/export-heldout.log" 2>&1; echo "export heldout rc=$?"
  ;;
c)
  export QUACK_FORCE_CACHE_UPDATE=1
  kernel-factory bench --problem rmsnorm_fwd --op --dtypes bfloat16 --repeat 2 --reps 40 --out "$kf_ev" \
    --stem fwd-bf16 > "$kf_ev/bench-fwd-bf16.log" 2>&1; echo "bench fwd bf16 rc=$?"
  kernel-factory bench --problem rmsnorm_fwd --op --dtypes float16,float32 --reps 30 \
    --baselines torch_eager,torch_compile,quack,liger,int21 --out "$kf_ev" --stem fwd-fp16-fp32 \
    > "$kf_ev/bench-fwd-other.log" 2>&1; echo "bench fwd fp16/fp32 rc=$?"
  kernel-factory bench --problem rmsnorm_bwd --op --dtypes bfloat16,float16 --reps 30 --out "$kf_ev" \
    --stem bwd > "$kf_ev/bench-bwd.log" 2>&1; echo "bench bwd rc=$?"
  # The op's general (fallback) genome at held-out widths against the best genome a search found for them.
  kernel-factory bench --problem rmsnorm_fwd --table runs/heldout/rmsnorm_fwd.json --shapes heldout \
    --dtypes bfloat16 --reps 30 --baselines factory_op,torch_eager,quack,int21 --out "$kf_ev" --stem fwd-heldout \
    > "$kf_ev/bench-heldout.log" 2>&1
  echo "bench heldout rc=$?"
  for f in "$kf_ev"/*.md; do echo "== $f"; grep -E "^\| (bfloat16|float16|float32)|Geomean|Repeat" "$f" | cut -c1-150; done
  ;;
esac
kf_pack
