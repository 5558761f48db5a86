# The H200 evidence of issues 3 and 6 (runs/evidence/h200-2026-11-30c): five calls on one warm GPU host. Source it
# from the repository root after tests/gpu/host_setup.sh; $OUT is where results go. Stages:
#   a: INT21's JIT build starts in the background; GPU tests of the op, the backward and the wide forward
#      templates; the op's host cost per call; a backward bf16 search of the five widest rows only
#   b: a forward bf16 search of the four widest rows; then the dispatch tables are exported from every run (the
#      per-shape runs of the earlier session included)
#   c: the bench reports of forward bf16 (every baseline, QuACK autotuned per shape), backward bf16/fp16 against
#      torch and Liger, and the held-out widths
#   d: forward fp16/fp32 against every baseline but QuACK autotuned
#   e: backward bf16/fp16 against QuACK and INT21
# Stages c to e first copy runs/ops/* into kernels/ops/ and run host_setup.sh again, so that the op carries the new
# tables. Optional peers are found by import name only (quack, liger_kernel, rmsnorm for INT21's RMSNorm-H100, built
# from its public repository beside the project in the ignored .int21/, carried in every call that benches it; none
# of its code is part of the project). QuACK's 92 MB cutlass wheel does not fit one call beside the working tree:
# here it is cut in halves (`split -n 2`) into two ignored folders, carried in calls b and c, stashed in /tmp by b
# and joined by c into a folder that host_setup.sh is given (see README "On a GPU").
#
# Stages f to j are the fourth session's (runs/evidence/h200-2026-11-30d; its README says how each call went):
#   f: setup; GPU tests of the backward template (the cp.async ring and clusters of 16 among them) and of the
#      forward's clusters of 16; a backward search of the ring variant at mid rows (bf16) and a forward bf16 search
#      of the two widest rows with clusters of 8 and 16
#   g: backward searches of the ring variant at the five widest rows, one per dtype; both tables exported
#   h: (carries the cutlass wheel's first half) backward bf16/fp16 against torch, torch.compile, Liger and INT21
#   i: (carries the second half and .whl-baselines) backward bf16/fp16 against QuACK, INT21, Liger and torch eager;
#      forward bf16 against every baseline, QuACK autotuned per shape
#   j: the op's and the backward template's GPU tests, on the new tables
#
# Stages k to m are the fifth session's (runs/evidence/h200-2026-11-30e; its README says how each call went):
#   k: setup (INT21's build in the background); backward searches with whole rows on chip (rings of up to eight
#      16-byte vectors per thread, CTAs of 4 to 16 warps), one per dtype; the backward table exported
#   l: a backward fp16 search of the mid rows, seeded from the table (the bf16 winners among them); the table
#      exported again; backward bf16/fp16 against INT21, Liger and torch eager
#   m: the op's and the backward template's GPU tests, on the new table
#   n: after a profile (.gpu/profile_bwd.py, not part of the project) showed the cluster's per-row exchange
#      as the gap at N = 262144: the backward template's GPU tests with the new cluster_sum gene; the whole-row
#      searches again, one per dtype, with cluster_sum=warps; the table exported; the op's GPU tests on it; backward
#      bf16/fp16 against INT21, Liger and torch eager
#   o: a search of the widest row alone (both dtypes) with cluster_sum=warps in CTAs of 16 or 32 warps (where the GPU
#      test's corner of that kind was faster than the table); the table exported; the backward bench again
#
# Stages p to s are the sixth session's (runs/evidence/h200-2026-12-01; its README says how each call went). The
# earlier runs' journals travel in the ignored .gpu/prev-runs (runs/evidence stays behind, to leave room for the
# cutlass halves):
#   p: the backward template's GPU tests with the new stream_batch gene; a backward bf16 search of the three widest
#      rows with streamed batches (configs/rmsnorm_bwd_stream.yaml); a forward fp16 search of the four widest rows
#      (the first since the forward's clusters of 8 and 16 exist), seeded from the table
#   q: (carries the cutlass wheel's first half) the same two searches in fp16 (backward) and fp32 (forward); both
#      tables exported
#   r: (carries the second half) QuACK installed; forward fp16/fp32 against every baseline, QuACK autotuned per
#      shape (this ran past its 400 s limit and wrote nothing); the op's GPU tests on the new tables
#   s: backward bf16/fp16 against every baseline (QuACK autotuned too: past its 290 s limit, nothing written);
#      forward fp16/fp32 against every baseline but QuACK autotuned (INT21 was not importable: .int21 not carried)
#   t: (carries .int21) the same two benches without QuACK autotuned, but on the previous tables (kernels/ops as
#      carried, not refreshed from runs/ops): the same-process "before" of this session
#   u: (carries .int21) both benches again on the new tables: the current reports
kf_stage="${1:?stage a to u}"
kf_ev="/tmp/kf-ev/$kf_stage"   # everything lands here, and goes back to $OUT as archives (few files)
mkdir -p "$kf_ev" runs
export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
kf_pack() {   # after every step, so that a call cut short still returns what it finished
  tar czf "$OUT/runs-$kf_stage.tgz" runs/h200-*/journal.jsonl runs/h200-*/lessons.md runs/ops 2>/dev/null
  tar czf "$OUT/ev-$kf_stage.tgz" -C /tmp/kf-ev "$kf_stage"
}
kf_run() {  # name, config, extra overrides...
  local name="$1" cfg="$2"; shift 2
  kernel-factory run "$cfg" --run-id "$name" "$@" > "$kf_ev/run-$name.log" 2>&1
  echo "run $name: rc=$? $(tail -n 4 "$kf_ev/run-$name.log" | tr '\n' ' ')"
  kf_pack
}
kf_bench() {  # seconds, stem, bench arguments...
  local limit="$1" stem="$2"; shift 2
  timeout "$limit" kernel-factory bench "$@" --out "$kf_ev" --stem "$stem" > "$kf_ev/bench-$stem.log" 2>&1
  echo "bench $stem: rc=$?"
  grep -E "^\| (bfloat16|float16|float32)|Geomean|Repeat" "$kf_ev/$stem.md" 2>/dev/null | cut -c1-160
  kf_pack
}
kf_restore() {  # earlier runs back under runs/ (journals gzip'd in evidence folders): warm starts and exports
  local d
  for d in "$@"; do
    mkdir -p "runs/${d##*/}" && gunzip -c "$d/journal.jsonl.gz" > "runs/${d##*/}/journal.jsonl"
  done
}
kf_int21() {  # INT21's JIT build, in the background, for the benches that time it later in the call
  (cd .int21 && setsid nohup python3 -c "import rmsnorm; rmsnorm._extension.get_extension()" \
    > /tmp/int21_build.log 2>&1 &)
}
kf_bwd_tests() {  # seconds, lines of the log to show besides the outcome: the backward template's GPU tests
  timeout "$1" python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_bwd_gpu.py -q -p no:cacheprovider -rfE -s \
    > "$kf_ev/gpu_tests_bwd.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|$2" "$kf_ev/gpu_tests_bwd.log" | tail -n 12 | cut -c1-300
  kf_pack
}
kf_export_fwd() {  # the forward table from every forward run on the host (more run ids: extra arguments)
  mkdir -p runs/ops
  timeout 150 kernel-factory export --problem rmsnorm_fwd h200-fwd-bf16 h200-fwd-bf16-wide h200-fwd-fp16 \
    h200-fwd-fp32 h200-fwd-c16 "$@" --build --out runs/ops/rmsnorm_fwd.json > "$kf_ev/export-fwd.log" 2>&1
  echo "export fwd rc=$?"; tail -n 4 "$kf_ev/export-fwd.log"
  kf_pack
}
kf_export_bwd() {  # the backward table from every backward run on the host (more run ids: extra arguments)
  mkdir -p runs/ops   # ignored, so kept on the host; later stages copy the tables into kernels/ops
  timeout 150 kernel-factory export --problem rmsnorm_bwd h200-bwd-bf16 h200-bwd-bf16-wide h200-bwd-fp16 \
    h200-bwd-ring h200-bwd-ring-mid h200-bwd-ring-fp16 h200-bwd-ring-row h200-bwd-ring-row-fp16 "$@" --build \
    --out runs/ops/rmsnorm_bwd.json > "$kf_ev/export-bwd.log" 2>&1
  echo "export bwd rc=$?"; tail -n 3 "$kf_ev/export-bwd.log"
  kf_pack
}
WIDE_BWD=32768x16384,32768x32768,32768x65536,16384x131072,8192x262144
WIDE_FWD=32768x32768,32768x65536,16384x131072,8192x262144
PEERS=torch_eager,torch_compile,quack,quack_tuned,liger,int21   # every baseline but the op itself
case "$kf_stage" in
a)
  # The earlier session's runs (committed as evidence) back under runs/, for warm starts and the export.
  for d in runs/evidence/h200-2026-11-30b/runs/h200-*; do
    mkdir -p "runs/${d##*/}" && cp "$d/lessons.md" "runs/${d##*/}/" && gunzip -c "$d/journal.jsonl.gz" \
      > "runs/${d##*/}/journal.jsonl"
  done
  mkdir -p runs/heldout && cp .gpu/heldout/rmsnorm_fwd.json runs/heldout/
  kf_int21
  timeout 210 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_rmsnorm_bwd_gpu.py \
    tests/gpu/test_rmsnorm_fwd_wide_gpu.py -q -p no:cacheprovider -rfE > "$kf_ev/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; tail -n 12 "$kf_ev/gpu_tests.log"
  timeout 40 python3 .gpu/profile_op.py > "$kf_ev/op_profile.log" 2>&1; head -n 30 "$kf_ev/op_profile.log"
  kf_pack
  kf_run h200-bwd-bf16-wide configs/rmsnorm_bwd_pershape.yaml -o shapes=$WIDE_BWD -o search.wall_clock_s=100 \
    -o search.seeds_from=kernels/ops/rmsnorm_bwd.json
  tail -n 3 /tmp/int21_build.log
  ;;
b)
  kf_run h200-fwd-bf16-wide configs/rmsnorm_fwd_pershape.yaml -o shapes=$WIDE_FWD -o search.wall_clock_s=100 \
    -o search.seeds_from=kernels/ops/rmsnorm_fwd.json
  # Exports go to runs/ops (ignored, so kept on the host); stages c and d copy them into kernels/ops first.
  kernel-factory export --problem rmsnorm_fwd h200-fwd-bf16 h200-fwd-bf16-wide h200-fwd-fp16 h200-fwd-fp32 --build \
    --out runs/ops/rmsnorm_fwd.json > "$kf_ev/export-fwd.log" 2>&1; echo "export fwd rc=$?"
  kernel-factory export --problem rmsnorm_bwd h200-bwd-bf16 h200-bwd-bf16-wide h200-bwd-fp16 --build \
    --out runs/ops/rmsnorm_bwd.json > "$kf_ev/export-bwd.log" 2>&1; echo "export bwd rc=$?"
  kf_pack
  tail -n 3 /tmp/int21_build.log
  ;;
c)
  export QUACK_FORCE_CACHE_UPDATE=1
  python3 -c "import quack.rmsnorm, rmsnorm; print('quack and int21 import')" 2>&1 | tail -n 1
  kf_bench 330 fwd-bf16 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 --reps 30
  kf_bench 170 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines torch_eager,torch_compile,quack,liger,int21
  # The op's general (fallback) genome at held-out widths against the best genome a search found for them.
  kf_bench 40 fwd-heldout --problem rmsnorm_fwd --table runs/heldout/rmsnorm_fwd.json --shapes heldout \
    --dtypes bfloat16 --reps 20 --baselines factory_op,torch_eager,quack,int21
  ;;
d)
  export QUACK_FORCE_CACHE_UPDATE=1
  kf_bench 130 fwd-fp16-fp32 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 \
    --reps 20 --baselines torch_eager,torch_compile,quack,liger,int21
  ;;
e)
  export QUACK_FORCE_CACHE_UPDATE=1
  kf_bench 130 bwd-peers --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 \
    --reps 20 --baselines quack,int21
  ;;
f)
  kf_restore runs/evidence/h200-2026-11-30[bc]/runs/h200-*
  kf_int21
  timeout 200 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_bwd_gpu.py tests/gpu/test_rmsnorm_fwd_wide_gpu.py \
    -q -p no:cacheprovider -rfE -s > "$kf_ev/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|cluster16|\{" "$kf_ev/gpu_tests.log" | tail -n 12 | cut -c1-400
  kf_pack
  kf_run h200-bwd-ring-mid configs/rmsnorm_bwd_ring.yaml -o shapes=32768x2048,32768x4096,32768x8192 \
    -o search.wall_clock_s=50 -o 'search.space={stages: [2, 3, 4], prefetch: [false], cluster: [1, 2]}'
  kf_run h200-fwd-c16 configs/rmsnorm_fwd_wide.yaml -o shapes=16384x131072,8192x262144 -o search.wall_clock_s=45 \
    -o 'search.space={cluster: [8, 16], stage: [smem]}'
  tail -n 2 /tmp/int21_build.log
  ;;
g)
  kf_run h200-bwd-ring configs/rmsnorm_bwd_ring.yaml
  kf_run h200-bwd-ring-fp16 configs/rmsnorm_bwd_ring.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=80
  mkdir -p runs/ops   # ignored, so kept on the host; later stages copy the tables into kernels/ops
  kernel-factory export --problem rmsnorm_bwd h200-bwd-bf16 h200-bwd-bf16-wide h200-bwd-fp16 h200-bwd-ring \
    h200-bwd-ring-mid h200-bwd-ring-fp16 --build --out runs/ops/rmsnorm_bwd.json > "$kf_ev/export-bwd.log" 2>&1
  echo "export bwd rc=$?"
  kernel-factory export --problem rmsnorm_fwd h200-fwd-bf16 h200-fwd-bf16-wide h200-fwd-fp16 h200-fwd-fp32 \
    h200-fwd-c16 --build --out runs/ops/rmsnorm_fwd.json > "$kf_ev/export-fwd.log" 2>&1
  echo "export fwd rc=$?"
  kf_pack
  ;;
h)
  cp .cut1/*.half1 /tmp/
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines > /tmp/setup-h.log 2>&1
  kf_bench 200 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines torch_eager,torch_compile,liger,int21
  ;;
i)
  W=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  mkdir -p /tmp/cutwhl && cat "/tmp/$W.half1" ".cut2/$W.half2" > "/tmp/cutwhl/$W"
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines /tmp/cutwhl > /tmp/setup-i.log 2>&1
  export QUACK_FORCE_CACHE_UPDATE=1
  python3 -c "import quack.rmsnorm, rmsnorm, liger_kernel; print('quack, int21, liger import')" 2>&1 | tail -n 1
  kf_bench 190 bwd-peers --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 \
    --reps 20 --baselines quack,int21,liger,torch_eager
  kf_bench 320 fwd-bf16 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 --reps 20
  ;;
j)
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh > /tmp/setup-j.log 2>&1
  timeout 230 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_rmsnorm_bwd_gpu.py -q \
    -p no:cacheprovider -rfE -s > "$kf_ev/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|\{'cluster" "$kf_ev/gpu_tests.log" | tail -n 5 | cut -c1-300
  kf_pack
  ;;
k)
  kf_restore runs/evidence/h200-2026-11-30[bcd]/runs/h200-*
  kf_int21
  kf_run h200-bwd-ring-row configs/rmsnorm_bwd_ring_row.yaml
  kf_run h200-bwd-ring-row-fp16 configs/rmsnorm_bwd_ring_row.yaml -o 'dtypes=[float16]'
  kf_export_bwd
  tail -n 2 /tmp/int21_build.log
  ;;
l)
  kf_run h200-bwd-mid-fp16 configs/rmsnorm_bwd_pershape.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=90 \
    -o shapes=32768x2048,32768x4096,32768x8192,32768x16384 -o search.seeds_from=runs/ops/rmsnorm_bwd.json
  kf_export_bwd h200-bwd-mid-fp16
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines > /tmp/setup-l.log 2>&1
  python3 -c "import rmsnorm, liger_kernel; print('int21 and liger import')" 2>&1 | tail -n 1
  kf_bench 200 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines int21,liger,torch_eager
  ;;
m)
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh > /tmp/setup-m.log 2>&1
  timeout 300 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_rmsnorm_bwd_gpu.py -q \
    -p no:cacheprovider -rfE -s > "$kf_ev/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|\{'cluster|^ring_row|^genome" "$kf_ev/gpu_tests.log" | tail -n 12 \
    | cut -c1-300
  kf_pack
  ;;
n)
  kf_restore runs/evidence/h200-2026-11-30[bcde]/runs/h200-*
  kf_int21
  kf_bwd_tests 150 "\{'cluster|^ring_row|^cluster8_1024_w|^genome"
  SPACE='{stages: [2, 3, 4], prefetch: [false], cluster: [2, 4, 8, 16], rows_per_cta: [1], threads: [128, 256, 512],
    reg_vecs: [4, 8], vec_bytes: [16], load: [nc], reduce: [shfl], cluster_sum: [warps]}'
  kf_run h200-bwd-warps configs/rmsnorm_bwd_ring_row.yaml -o "search.space=$SPACE" -o search.wall_clock_s=90
  kf_run h200-bwd-warps-fp16 configs/rmsnorm_bwd_ring_row.yaml -o "search.space=$SPACE" -o search.wall_clock_s=90 \
    -o 'dtypes=[float16]'
  kf_export_bwd h200-bwd-mid-fp16 h200-bwd-warps h200-bwd-warps-fp16
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines > /tmp/setup-n.log 2>&1
  timeout 60 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py -q -p no:cacheprovider -rfE \
    > "$kf_ev/gpu_tests_op.log" 2>&1
  echo "op gpu tests rc=$?"; tail -n 1 "$kf_ev/gpu_tests_op.log"
  kf_bench 150 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines int21,liger,torch_eager
  ;;
o)
  kf_restore runs/evidence/h200-2026-11-30[bcde]/runs/h200-*
  kf_int21
  SPACE='{stages: [0, 2, 3, 4], prefetch: [false], cluster: [4, 8, 16], rows_per_cta: [1], threads: [512, 1024],
    reg_vecs: [1, 2, 4], load: [nc], reduce: [shfl], cluster_sum: [warps]}'
  kf_run h200-bwd-warps-wide configs/rmsnorm_bwd_ring_row.yaml -o "search.space=$SPACE" -o search.wall_clock_s=60 \
    -o 'dtypes=[bfloat16, float16]' -o shapes=8192x262144
  kf_export_bwd h200-bwd-mid-fp16 h200-bwd-warps h200-bwd-warps-fp16 h200-bwd-warps-wide
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines > /tmp/setup-o.log 2>&1
  tail -n 1 /tmp/int21_build.log
  kf_bench 120 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines int21,liger,torch_eager
  ;;
p)
  kf_restore .gpu/prev-runs/h200-*
  kf_int21
  kf_bwd_tests 170 "^genome|^stream|^cluster8_1024_w|^default"
  kf_run h200-bwd-stream configs/rmsnorm_bwd_stream.yaml -o search.wall_clock_s=75
  kf_run h200-fwd-fp16-wide configs/rmsnorm_fwd_wide.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=70
  ;;
q)
  cp .cut1/*.half1 /tmp/
  kf_run h200-bwd-stream-fp16 configs/rmsnorm_bwd_stream.yaml -o 'dtypes=[float16]' -o search.wall_clock_s=75
  kf_run h200-fwd-fp32-wide configs/rmsnorm_fwd_wide.yaml -o 'dtypes=[float32]' -o search.wall_clock_s=70
  kf_export_bwd h200-bwd-mid-fp16 h200-bwd-warps h200-bwd-warps-fp16 h200-bwd-warps-wide h200-bwd-stream \
    h200-bwd-stream-fp16
  kf_export_fwd h200-fwd-fp16-wide h200-fwd-fp32-wide
  ;;
r)
  W=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  mkdir -p /tmp/cutwhl && cat "/tmp/$W.half1" ".cut2/$W.half2" > "/tmp/cutwhl/$W"
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines /tmp/cutwhl > /tmp/setup-r.log 2>&1
  export QUACK_FORCE_CACHE_UPDATE=1
  python3 -c "import quack.rmsnorm, rmsnorm, liger_kernel; print('quack, int21, liger import')" 2>&1 | tail -n 1
  kf_bench 400 fwd-fp16-fp32 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 \
    --reps 20 --baselines $PEERS
  timeout 60 python3 -m pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py -q -p no:cacheprovider -rfE \
    > "$kf_ev/gpu_tests_op.log" 2>&1
  echo "op gpu tests rc=$?"; tail -n 1 "$kf_ev/gpu_tests_op.log"
  kf_pack
  ;;
s)
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines /tmp/cutwhl > /tmp/setup-s.log 2>&1
  export QUACK_FORCE_CACHE_UPDATE=1
  kf_bench 290 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines $PEERS
  kf_bench 200 fwd-fp16-fp32 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 \
    --reps 20 --baselines torch_eager,torch_compile,quack,liger,int21
  ;;
t)
  source tests/gpu/host_setup.sh .whl-baselines /tmp/cutwhl > /tmp/setup-t.log 2>&1
  python3 -c "import rmsnorm; print('int21 import')" 2>&1 | tail -n 1
  kf_bench 230 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines int21,quack,liger,torch_eager,torch_compile
  kf_bench 105 fwd-fp16-fp32-int21 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json \
    --dtypes float16,float32 --reps 20 --baselines int21
  ;;
u)
  cp -r runs/ops/. kernels/ops/ && source tests/gpu/host_setup.sh .whl-baselines /tmp/cutwhl > /tmp/setup-u.log 2>&1
  kf_bench 110 bwd --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 --reps 20 \
    --baselines int21,quack,liger,torch_eager,torch_compile
  kf_bench 100 fwd-fp16-fp32 --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 \
    --reps 20 --baselines int21,quack,liger,torch_eager,torch_compile
  ;;
esac
