#!/usr/bin/env bash
# The forward's and the backward's workload campaigns (issues 28 and 29), their held-out benches against every
# declared peer and the op as shipped, and the GPU suite: device calls back to back, each carrying one bundle of
# tests/gpu/bundles.sh (QuACK installs whole only with the third, .gpu-c). Results are packed into
# $OUT/campaigns-<stage>.tgz after every step; every step has its own timeout, and a bench cut short keeps its rows
# (`kernel-factory heldout FOLDER --go-on` times only the cases it lacks).
# The next session's calls (2026-12-04 evening), back to back:
#   record (carry .gpu-a): configs/rmsnorm_fwd_fp16_record.yaml, the held-out recording of 1398 genomes for the
#       search-efficiency audit (issues 27 and 32); cut by its limit, it resumes in suite2
#   suite1 (carry .gpu-b): the GPU suite's first part (SUITE1: the bench, faults, evaluator, KDA and backward files);
#       FLA's wheels arrive with .gpu-b, and no GPU test needs QuACK
#   suite2 (carry .gpu-c .int21): the recording finished if it was cut, the suite's second part (the forward and op
#       files), then KDA's first search (configs/kda_fwd.yaml) and its best genome against FLA's chunk_kda
#   The two parts run at one commit: together they are every file of tests/gpu.
# 2026-12-05 night, after the weight-ahead gene (w_ahead: the weight fetched before the row's reduction), back to back:
#   wa1 (carry .gpu-a .int21): the forward's GPU test files (the gene's genomes through the gate's corners); on an
#       H200, the forward learned again with the gene (h200-fwd-workload-7: no search, the shipped table's genomes and
#       h200-fwd-workload-5's panel winners with their w_ahead twins; h200-fwd-workload-5's times kept, so only the
#       twins are timed); on an H100 (whose times must not join H200 panels), the evaluator and fault tests instead
#   wa2 (carry .gpu-b): QuACK's second bundle; on an H200 an unfinished campaign goes on
#   wa3 (carry .gpu-c .int21): QuACK complete; the small-M study (tests/gpu/small_m_study.py: a rule for M <= 64
#       learned from a grid timed on small-M training shapes; on held-out ones the shipped genome,
#       its w_ahead twins and a grid's best against every peer, M <= 64); then on an H200 the campaign's held-out
#       bench against every peer and the shipped op (a cut bench goes on with --go-on)
# 2026-12-06, the small-M rule learned on an H200 and grafted into the op's table (issue 28), and the GPU suite at
# one commit on an H200 (issue 27), back to back:
#   sm1 (carry .gpu-a .int21): the small-M study's training (a 280-genome grid, 16-CTA clusters among them, timed on
#       48 shapes of M <= 64; rules into /tmp/small-m), then the forward's and the evaluator's GPU test files
#   sm2 (carry .gpu-b): QuACK's second bundle, and what of the rest of the GPU suite fits 220 s (faults, bench, the
#       backward's, silu_mul, KDA)
#   sm3 (carry .gpu-c .int21): QuACK complete; the study's held-out shapes against every peer; the rules grafted
#       onto the shipped table for M <= 64 (`kernel-factory graft`) and that table's held-out bench against every
#       peer and the op as shipped (h200-fwd-workload-5's held-out shapes; cut, it goes on with --go-on); then the
#       grafted table installed and the op's GPU tests run through it
# 2026-12-06 night, after first-call tuning (kernels/tune.py: the op times its table's kernels of the dtype on a
# shape's first call and keeps the fastest), back to back:
#   t1 (carry .gpu-a .int21): the tuning's GPU tests, then the RMSNorm op's and the SiLU-mul op's (the generic op
#       tunes too)
#   t2 (carry .gpu-b): what a first call costs (tests/gpu/tune_cost.py)
#   t3 (carry .gpu-c .int21): QuACK complete; the op's forward as shipped on h200-fwd-workload-5's held-out shapes
#       against every peer: the table's rule (the bench's subject) and the op as users call it, tuned (factory_op)
#   t4 (carry .int21: INT21's module is imported from the checkout's copy): the same for the backward, on
#       h200-bwd-workload-2's held-out shapes; t5 (carry .int21) goes on with what t4 left (--go-on). Run each with
#       the call's full 600 s: its bench stops itself at 560 s and copies what it measured into $OUT. Ran t1-t3; t4's
#       first try lacked .int21 (the peer check stopped it), its second was cut by a 540 s call limit before the
#       bench's own limit, so nothing came back (next session)
# 2026-12-07, where the forward's small shapes lose (issue 28) and the backward as shipped, tuned (issue 29), back to
# back:
#   p1 (carry .gpu-a .int21): QuACK's first bundle, INT21 built in the background (nothing else: the host is warm
#       for the next call within seconds)
#   p2 (carry .gpu-b): QuACK's second bundle; the backward op's run-to-run spread on small batches
#       (tests/gpu/jitter.py, M <= 1025; the peers then loaded beside it, QuACK and INT21 not yet)
#   p3 (carry .gpu-c .int21): QuACK complete; tests/gpu/latency_probe.py (the table's kernels, a minimal kernel with
#       and without code in its way, the op, every peer and a copy, flushed and hot, on seeded small shapes); then the
#       backward as shipped on h200-bwd-workload-2's held-out shapes against every peer (the rest of the call)
#   p4 (carry .int21): that bench goes on (--go-on), 560 s
#   p5 (carry .int21): what is left of it, or the gap report's forward rows
#   Ran p1-p3 on an H100 (no H200 was lent); p3's backward bench finished within its call, so p4 was not needed, and
#   the gap report's forward rows (`trust.sh gap fwd bfloat16,float16`) took the last call (21 of 22 rows by its
#   limit). Committed under docs/results/{workload/h100-shipped-bwd-2026-12-07,latency,jitter,rows}/.
# Next session, grids of genomes the shipped tables lack, studied on seeded small shapes (none a campaign's) and
# added as tuning candidates bounded to the region they were studied on (issues 28 and 29), back to back:
#   q1 (carry .gpu-a .int21): the latency probe with the forward's grid (sub-warp to four-warp rows, x kept or not,
#       the weight ahead or not; tests/gpu/grid_study.py); its winners added to the forward table for rows of at most
#       8192 elements (`kernel-factory widen ... --where log2_n<=13`, built on the host) and installed as the op's
#       table; the forward's sub-warp and op GPU tests through it
#   q2 (carry .gpu-b): the backward's small-M grid (one-launch and grouped plans, sub-warp rows, clusters, dw in
#       registers or shared memory, the narrow path) on M up to 1024, its winners added for log2_m<=10 and installed;
#       the backward's small-M, sub-warp and tuning GPU tests through both tables; both tables and their kernels packed
#   q3 (carry .gpu-c .int21): QuACK complete; the forward as shipped, widened, on h200-fwd-workload-5's held-out
#       shapes against every peer (compare with t3's lines on the same kind of card)
#   q4 (carry .int21): the backward as shipped, widened, on h200-bwd-workload-2's held-out shapes (compare with p3's)
# 2026-12-07 (later), the backward's peeled tail (gene tail=peel: rows no multiple of the vector take the vector path
# with a one-element head and tail; issue 29), back to back:
#   pe1 (carry .gpu-a .int21): QuACK's first bundle, INT21 built in the background; the backward's GPU test file (its
#       corners include nine tail=peel and seven narrow genomes, gated on every correctness and held-out shape in
#       every dtype); the op's backward table twinned on the host (`kernel-factory twin --set tail=peel`, then
#       `--set narrow=True`: each genome whose twin is feasible swapped for it) into /tmp/twin-bwd, packed; then, the twin installed, the held-out shapes whose N is
#       no multiple of the vector against every peer but QuACK (not installed yet), the shipped table the subject
#   pe2 (carry .gpu-b): QuACK's second bundle; the twinned table installed as the op's; the backward's small-M and
#       sub-warp GPU tests and the op's, through it
#   pe3 (carry .gpu-c .int21): QuACK complete; the twinned table installed; h200-bwd-workload-2's held-out shapes
#       against every peer: the subject is the shipped (untwinned) table's rule, the op is the twinned one, tuned
#       (compare with p3's lines, where the op was the untwinned table, on the same kind of card)
#   pe4 (carry .int21): what pe3's bench left (--go-on)
#   Each pe stage ends by END (seconds from its start; the call's limit less 15 s) where the budget is short.
# 2026-12-07 (evening), the grids and the twin together, every table through a test of every kernel the op may run
# (tests/gpu/test_op_table_gpu.py: tuning keeps the fastest without checking), back to back:
#   r1 (carry .gpu-a .int21): QuACK's first bundle, INT21 built in the background; the backward table twinned on the
#       host (tail=peel, then narrow=True); KDA's chunked genomes gated (their own share, KDA_S); the latency probe
#       with the forward's grid, its winners added to the forward table for log2_n<=13 (as q1)
#   r2 (carry .gpu-b): QuACK's second bundle; the twin installed; the backward's small-M grid and its wide-row grid
#       (N >= 16384: clusters, register vectors, dw partials), their winners added to the twinned table for
#       log2_m<=10 and log2_n>=14; both tables installed and run through test_op_table_gpu.py, the
#       op's and the tuning's GPU tests and FLA's KDA peer test; both tables and their kernels packed
#   r3 (carry .gpu-c .int21): QuACK complete; h200-bwd-workload-2's held-out shapes against every peer, the shipped
#       table's rule the subject and the op (twinned, widened, tuned) beside it; then, while the call lasts,
#       h200-fwd-workload-5's held-out shapes of at most 8192 elements a row (the widened region) likewise
#   r4 (carry .gpu-b; the twinned and widened tables committed as the op's): the tuning's, the op's and every
#       kernel's GPU tests through them, KDA's chunked gate (with mma=mma_sync), then the chunked form's default
#       genome with and without tensor cores against FLA's chunk_kda on the benchmark workloads
#   Each r stage ends by END (seconds from its start) where the budget is short.
#   Ran r1-r3 on an H100 (r1 with END=470 KDA_S=150; r2 END=560; r3 END=570); the tables r2 built are the op's since
#   (rebuilt on the CPU from the committed panels, byte for byte). r4 was not run: no device time was left. Its
#   `BUNDLE=.gpu-r4` is .gpu-a less QuACK and the CUDA-toolkit flavour, with .gpu-b's FLA wheels (a cold host
#   within 64 MiB beside the checkout)
# 2026-12-07 (night), on an H200 at last: the GPU suite at one commit, KDA's chunked form against FLA, and both
# tables as shipped (twinned and widened on an H100) against every peer (issues 27, 28, 29, 31), back to back; each
# bundle of tests/gpu/bundles.sh fits its call beside the checkout:
#   h1 (carry .gpu-a .int21): QuACK's first bundle, INT21 built in the background; every GPU test file but KDA's
#   h2 (carry .gpu-b): QuACK's second bundle; KDA's GPU tests (both forms' gates, FLA's peer test), then the chunked
#       form's default genome with and without tensor cores against FLA's chunk_kda on the benchmark workloads
#   h3 (carry .gpu-c .int21): QuACK complete; the backward op as shipped on h200-bwd-workload-2's held-out shapes
#       against every peer, then the forward's on h200-fwd-workload-5's (h3 ended in the backward; n5 goes on)
#   Ran h1-h3 on an H200 (h1 END=540, h2 END=470 TESTS_S=320, h3 END=580); h2 first failed to start: the checkout
#   and .gpu-b were over 64 MiB counted on disk. bundles.sh now counts on disk and splits the large wheel into as many
#   parts as the checkout leaves room for (three since): carry each middle folder in a call of its own between b
#   and c (`bash tests/gpu/campaigns.sh bundle .gpu-b2`, seconds).
# Next session (written 2026-12-07 night), on an H200, back to back; bundles.sh makes four folders now (.gpu-b2
# between b and c):
#   n1 (carry .gpu-a .int21): QuACK's first part, INT21 built in the background; the backward's three GPU files
#       whole (the small_m=cols corners among the gate's), the column split beside torch.compile on few-row,
#       huge-width shapes, then what h1 left of the GPU suite (the evaluator's, faults', bench's and SiLU-mul's files)
#   n2 (carry .gpu-b): the large wheel's first part; KDA's chunked form, with and without tensor cores, against FLA
#   n3 (carry .gpu-b2): its middle part (`bundle .gpu-b2`, seconds)
#   n4 (carry .gpu-c .int21): QuACK complete; the backward op as shipped on h200-bwd-workload-2's held-out shapes
#       against every peer again, whole, with the bench's new records (host time per call, the host's load, GPU memory
#       free and the allocator's retries) on a host cleared of earlier steps
#   n5 (carry .int21): what n4 left (--go-on), then the forward op as shipped on h200-fwd-workload-5's held-out shapes
#   n6 (carry .int21): what n5 left of the forward (--go-on), then the 11 benchmark rows, every dtype, QuACK tuned
#   n5 and n6 go on only on the card n1 named (an H100 lent for all six is one H100 set; mixed cards are refused)
# Ran 2026-12-07 late on an H100 (three failed starts first): n1 (END=330), n2 (END=90, KDA's bench cut before its
#   first case), bundle .gpu-b2, n4f (END=575: the forward whole), n4 (END=470: fp32 cut at 43 of 48).
# Next session, the timer's hold (evo/evaluate/measure.py) on a GPU for the first time, back to back: n1 (its GPU
#   tests: the evaluator's and the bench's files time through the hold), n2, bundle .gpu-b2, n4f, then n4; their
#   eager rows set against h100-shipped-{fwd,bwd}-2026-12-07b's (the op's time over its table kernel's, row by row).
# 2026-12-08, the same plan with the hold's own GPU test (tests/gpu/test_measure_gpu.py) first, back to back:
#   m1 (carry .gpu-a .int21): the hold's, the bench's and the evaluator's GPU test files; the column split's second
#       version (8 rows a CTA, dw partials by group) through the backward's gate and beside torch.compile, torch eager,
#       Liger, INT21 and the op on few-row, wide shapes (none a campaign's held-out one)
#   n2 (carry .gpu-b, END about 240): KDA's chunked form against FLA; bundle .gpu-b2; n4f; n4 as far as the budget goes
#   Ran m1 (END=585), n2 (END=200: FLA's first calls took the whole share again, no KDA case), bundle .gpu-b2, n4f
#   (END=575, done in 369 s) and n4 (END=440: bf16 whole, fp16 46 of 48, no fp32) on an H100, after two failed starts.
#   n2 now warms FLA first (tests/gpu/fla_warm.py, each workload's time logged): give it the call's full 585 s
# Next session, back to back: m1 is not needed again (the hold passed on a GPU); n1's first part instead (QuACK's
#   first bundle, INT21 built, the backward's small-M and sub-warp GPU files, which last ran before the column split's
#   second version), then n2 with END=585 (KDA against FLA, FLA warmed first), bundle .gpu-b2, then n4 for the
#   backward whole (the 2026-12-08 bench stopped before fp32) and n4f only if an H200 is lent (an H200 set of both)
# Stages not run yet:
#   fwd6 (carry .gpu-a .int21 .campaigns/h200-fwd-workload-3): the forward's rule learned from a denser training
#       set (h200-fwd-workload-6): `48` more training shapes per dtype (workload.train_more), timed in the panels
#       only; the 43 shapes per dtype h200-fwd-workload-5 timed keep its times (workload.panel_times_from). It needs
#       the bucket journals of h200-fwd-workload-3, which no committed folder holds (its 2026-12-04 try stopped at
#       once: keep() packs them, but that folder was committed without them)
#   whole (no carry; the host still warm): the GPU suite in one call, at one commit
#   kda (no carry; after a call that carried .gpu-b, whose FLA wheels it needs): the KDA forward's GPU tests, then
#       its first search
# Ran on 2026-12-04 afternoon: suiteb (KDA's gate test took most of its limit), rows (the backward's table on the
#   benchmark rows against every peer but tuned QuACK).
# Earlier stages: panels (both campaigns learned again from their searches with the benchmark rows), bwd (the
# backward alone, h200-bwd-workload-2); fwd, suite, heldout and more ran on 2026-12-03 at 20:05
# (h200-fwd-workload-5). On 2026-12-03 the backward's fp32 panel first ran out of GPU memory (fixed: pools made on
# demand), the suite was cut before its summary, and held-out benches were cut at 270 to 330 s; the
# commands and their logs are indexed in docs/results/README.md.
set -uo pipefail
stage="${1:?usage: campaigns.sh bundle FOLDER|m1|n1|n2|n4|n4f|n5|n6|h1|h2|h3|r1|r2|r3|r4|pe1|pe2|pe3|pe4|q1|q2|q3|q4|p1|p2|p3|p4|p5|t1|t2|t3|t4|t5|sm1|sm2|sm3|wa1|wa2|wa3|record|suite1|suite2|fwd6|suiteb|rows|whole|kda|fwd|suite|heldout|more|\
panels|bwd}"
export PYTHONUNBUFFERED=1
RES=/tmp/results-$stage
FWD=h200-fwd-workload-5
FWD6=h200-fwd-workload-6
BWD=h200-bwd-workload-2
FWD_SEARCHED=h200-fwd-workload-3
FWD7=h200-fwd-workload-7
FWD_FILES="tests/gpu/test_rmsnorm_fwd_tail_gpu.py tests/gpu/test_rmsnorm_fwd_wide_gpu.py
  tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py tests/gpu/test_rmsnorm_op_gpu.py"
BWD_SEARCHED=h200-bwd-workload-1
SUITE1="tests/gpu/test_bench_gpu.py tests/gpu/test_faults_gpu.py tests/gpu/test_gpu_evaluator.py
  tests/gpu/test_kda_fwd_gpu.py tests/gpu/test_rmsnorm_bwd_gpu.py tests/gpu/test_rmsnorm_bwd_small_gpu.py
  tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py"
SUITE2="tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py tests/gpu/test_rmsnorm_fwd_tail_gpu.py
  tests/gpu/test_rmsnorm_fwd_wide_gpu.py tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_silu_mul_op_gpu.py"
RECORDING=/tmp/runs/recordings/rmsnorm_fwd-float16-sub.jsonl.gz
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
widened() {   # PART PANELS REGION: the panels' winners added to the op's PART table for REGION, built, installed
  local part="$1" panels="$2" region="$3"
  mkdir -p "/tmp/widened-$part"
  kernel-factory widen "$panels" --problem "rmsnorm_$part" --where "$region" \
    --out "/tmp/widened-$part/rmsnorm_$part.json" > "$RES/widen-$part.log" 2>&1
  echo "exit $?" >> "$RES/widen-$part.log"; tail -n 3 "$RES/widen-$part.log"
  grep -q "^exit 0" "$RES/widen-$part.log" || rm -rf "/tmp/widened-$part"
  install_widened
}
twinned() {   # the op's backward table twinned, built into /tmp/twin-bwd: every genome whose tail=peel twin is
  # feasible swapped for it, then every genome for its narrow=True twin (those that cannot peel, e.g. one 16-byte
  # register vector at 64 registers: their even widths take 2-element vectors instead of one element at a time)
  mkdir -p /tmp/twin-bwd
  [ -f /tmp/twin-bwd/rmsnorm_bwd.json ] || { kernel-factory twin --problem rmsnorm_bwd --set tail=peel \
    --out /tmp/twin-bwd/rmsnorm_bwd.json && kernel-factory twin --problem rmsnorm_bwd --set narrow=True \
    --table /tmp/twin-bwd/rmsnorm_bwd.json; } > "$RES/twin.log" 2>&1
  echo "exit $?" >> "$RES/twin.log"; grep "^twins\|^exit" "$RES/twin.log"
}
ops_dirs() {   # the checkout's kernels/ops and the one the op loads (host_setup installs the package, not editable)
  { realpath kernels/ops; python3 -c "from kernel_factory.kernels.runtime import OPS_DIR; print(OPS_DIR)"; } | sort -u
}
install_table() {   # FOLDER PROBLEM: FOLDER/PROBLEM.json and its kernels as the op's, in every ops folder
  local dir
  for dir in $(ops_dirs); do
    mkdir -p "$dir/cubins" "$dir/sources"
    cp "$1/$2.json" "$dir/" && cp "$1"/cubins/* "$dir/cubins/" && cp "$1"/sources/* "$dir/sources/" || return 1
  done
  echo "installed $1/$2.json as the op's ($(python3 -c "from kernel_factory.kernels.runtime import OPS_DIR; \
print(OPS_DIR)"))"
}
install_twin() {   # the twinned table as the op's (each call's checkout restores the tracked one)
  install_table /tmp/twin-bwd rmsnorm_bwd
}
install_widened() {   # every table widened on this host so far, as the op's own (each call's checkout restores them)
  local part
  for part in fwd bwd; do
    [ -f "/tmp/widened-$part/rmsnorm_$part.json" ] && install_table "/tmp/widened-$part" "rmsnorm_$part"
  done
}
campaign() {   # CONFIG NAME SECONDS [overrides...]
  local cfg="$1" name="$2" secs="$3"; shift 3
  echo "$name: $secs s from $SECONDS s"
  timeout "$secs" kernel-factory run "$cfg" -o out_dir=/tmp/runs -o workload.validate=false "$@" --run-id "$name" \
    > "$RES/$name.log" 2>&1; echo "exit $?" >> "$RES/$name.log"; grep -v "^gen\|^  " "$RES/$name.log" | tail -n 12
  keep "$name"
}
quiet_host() {   # STEP: before it times anything, what else the host runs (logged into $RES/host-STEP.txt), and
  # the leftovers of an earlier call's step stopped: on 2026-12-07 an H200 bench right after two steps cut by their
  # limits (a KDA gate test, a live run) timed the torch-side providers at 2 to 5 times their H100 times on some rows,
  # its own kernels and INT21 not (the host paths of the others lengthened, or a GPU shared: not told apart then)
  { date; uptime; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    ps -eo pid,pcpu,etime,args --sort=-pcpu | head -n 12; } > "$RES/host-$1.txt" 2>&1
  pkill -f "python3 -m pytest" ; pkill -f "multiprocessing.spawn" ; pkill -f "bin/kernel-factory"
  sleep 1
  return 0
}
heldout() {   # NAME SECONDS [--go-on]: a campaign's held-out bench, against every peer and the op as shipped
  local name="$1" secs="$2"; shift 2
  [ -f "/tmp/runs/$name/kernels/dispatch.json" ] || { echo "heldout $name: no learned table"; return 0; }
  quiet_host "heldout-$name"
  echo "heldout $name $*: $secs s from $SECONDS s"
  timeout "$secs" kernel-factory heldout "/tmp/runs/$name" "$@" > "$RES/heldout-$name.log" 2>&1
  echo "exit $?" >> "$RES/heldout-$name.log"; tail -n 8 "$RES/heldout-$name.log"
  mkdir -p "$RES/$name"; cp /tmp/runs/"$name"/heldout* "$RES/$name/" 2>/dev/null; pack > /dev/null
}
gpu_tests() {   # SECONDS PYTEST ARGS...: tests/gpu/run.sh, its log and junit into $RES
  local secs="$1"; shift
  quiet_host gpu-tests
  # -vv: each test's name and outcome as it ends (run.sh's -q leaves one level), so a run cut by its limit still
  # names its failures (the 2026-12-03 suite was cut before pytest's summary)
  OUT="$RES/gpu-tests" timeout "$secs" bash tests/gpu/run.sh -vv --durations=20 "$@" > "$RES/gpu-tests.log" 2>&1
  echo "exit $?" >> "$RES/gpu-tests.log"; tail -n 15 "$RES/gpu-tests.log"; pack > /dev/null
}
recording() {   # SECONDS: configs/rmsnorm_fwd_fp16_record.yaml into $RECORDING (a cut one resumes), then into $RES
  mkdir -p /tmp/runs/recordings
  echo "record: $1 s from $SECONDS s"
  timeout "$1" kernel-factory record configs/rmsnorm_fwd_fp16_record.yaml --out "$RECORDING" >> "$RES/record.log" 2>&1
  echo "exit $?" >> "$RES/record.log"; tail -n 3 "$RES/record.log"; cp /tmp/runs/recordings/* "$RES/"; pack > /dev/null
}
kda_search() {   # SECONDS: KDA's first search, then its best genome against FLA's chunk_kda on the benchmark shapes
  local end=$(( SECONDS + $1 ))
  timeout $(( end - SECONDS - 120 )) kernel-factory run configs/kda_fwd.yaml -o out_dir=/tmp/runs --run-id kda-fwd-1 \
    > "$RES/kda-fwd-1.log" 2>&1; echo "exit $?" >> "$RES/kda-fwd-1.log"; tail -n 6 "$RES/kda-fwd-1.log"
  gzip -c /tmp/runs/kda-fwd-1/journal.jsonl > "$RES/kda-fwd-1.journal.jsonl.gz" 2>/dev/null; pack > /dev/null
  timeout $(( end - SECONDS )) kernel-factory bench --problem kda_fwd --run /tmp/runs/kda-fwd-1/journal.jsonl \
    --shapes benchmark --baselines fla,torch_eager --reps 10 --out "$RES/kda-bench" --stem kda-fwd-1 \
    > "$RES/kda-bench.log" 2>&1; echo "exit $?" >> "$RES/kda-bench.log"; tail -n 14 "$RES/kda-bench.log"
  pack > /dev/null
}
h200() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; }
wahead() {   # SECONDS: the forward learned again with w_ahead's twins (H200 only), going on from a cut try
  local from="docs/results/workload/$FWD"
  [ -f "/tmp/runs/$FWD7/kernels/dispatch.json" ] && return 0
  rm -rf "/tmp/runs/$FWD7"   # a cut try starts over (its finished panels came from the same kept times)
  campaign configs/rmsnorm_fwd_workload.yaml "$FWD7" "$1" -o workload.search=false \
    -o "workload.panel_winners_from=$from" -o "workload.panel_times_from=$from" \
    -o 'workload.panel_twins={tail: peel, w_ahead: [l2, regs]}'
}
first_call() {   # the first of three calls: the first bundle, INT21 built in the background, the GPU named
  export KF_PEERS=liger   # QuACK imports only once the third bundle has come
  setup .gpu-a
  int21_build
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    | tee "$RES/gpu.txt"
  gpu_name > /tmp/kf-first-gpu
}
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1; }
SMALL_M=/tmp/small-m
GRAFT=graft-fwd-small-m
subject() {   # PART CAMPAIGN: a folder for that campaign's held-out shapes, the op's table (as it is now) its subject
  local name="shipped-$1"
  if [ ! -f "/tmp/runs/$name/kernels/dispatch.json" ]; then
    mkdir -p "/tmp/runs/$name/kernels"
    cp "docs/results/workload/$2/workload.json" "/tmp/runs/$name/"
    cp "kernels/ops/rmsnorm_$1.json" "/tmp/runs/$name/kernels/dispatch.json"
  fi
}
peel_subject() {   # h200-bwd-workload-2's held-out shapes whose N is no multiple of a 16-byte vector, the shipped
  # backward table their subject (call it before install_twin): /tmp/runs/peel-bwd
  [ -f /tmp/runs/peel-bwd/kernels/dispatch.json ] && return 0
  mkdir -p /tmp/runs/peel-bwd/kernels && cp kernels/ops/rmsnorm_bwd.json /tmp/runs/peel-bwd/kernels/dispatch.json
  python3 - "docs/results/workload/$BWD/workload.json" /tmp/runs/peel-bwd/workload.json <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))
vec = {"bfloat16": 8, "float16": 8, "float32": 4}
w["heldout"] = [c for c in w["heldout"] if int(c.split("x")[-1]) % vec[c.split(":")[0]]]
json.dump(w, open(sys.argv[2], "w"))
print(f"peel-bwd: {len(w['heldout'])} held-out shapes")
EOF
}
small_n() {   # PART: the shipped PART table on its campaign's held-out shapes of at most 8192 elements a row (the
  # region the grids widen), in /tmp/runs/small-n-PART (call it after subject, before a widened table is installed)
  [ -f "/tmp/runs/small-n-$1/kernels/dispatch.json" ] && return 0
  mkdir -p "/tmp/runs/small-n-$1/kernels"
  cp "/tmp/runs/shipped-$1/kernels/dispatch.json" "/tmp/runs/small-n-$1/kernels/"
  python3 - "/tmp/runs/shipped-$1/workload.json" "/tmp/runs/small-n-$1/workload.json" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))
w["heldout"] = [c for c in w["heldout"] if int(c.split("x")[-1]) <= 8192]
json.dump(w, open(sys.argv[2], "w"))
print(f"{sys.argv[2]}: {len(w['heldout'])} held-out shapes")
EOF
}
shipped() {   # PART CAMPAIGN SECONDS [--go-on]: the op's shipped table on that campaign's held-out shapes
  local part="$1" from="$2" secs="$3"; shift 3
  subject "$part" "$from"
  heldout "shipped-$part" "$secs" "$@"
}
kda_vs_fla() {   # the chunked form's default genome, with and without tensor cores, against FLA until END
  local mma
  for mma in mma_sync fma; do
    [ $(( ${END:-585} - SECONDS )) -gt 40 ] || break
    timeout $(( ${END:-585} - SECONDS - 10 )) kernel-factory bench --problem kda_fwd --shapes benchmark \
      --genes "{\"form\": \"chunked\", \"mma\": \"$mma\"}" --baselines fla --reps 10 --out "$RES/kda-bench" \
      --stem "chunked-$mma" > "$RES/kda-bench-$mma.log" 2>&1
    echo "exit $?" >> "$RES/kda-bench-$mma.log"; tail -n 12 "$RES/kda-bench-$mma.log"; pack > /dev/null
  done
}
case "$stage" in
q1)
  first_call   # QuACK completes in q3
  OUT="$RES" timeout 300 python3 tests/gpu/latency_probe.py --grid --budget 260 > "$RES/latency_probe.log" 2>&1
  echo "exit $?" >> "$RES/latency_probe.log"; grep "^latency\|^exit" "$RES/latency_probe.log"; pack > /dev/null
  widened fwd "$RES/latency-panels" 'log2_n<=13'
  gpu_tests $(( 585 - SECONDS )) tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py tests/gpu/test_rmsnorm_op_gpu.py
  ;;
q2)
  export KF_PEERS=liger
  setup .gpu-b
  install_widened
  OUT="$RES" timeout 240 python3 tests/gpu/grid_study.py --problem rmsnorm_bwd --grid small-m --budget 200 \
    > "$RES/grid_study.log" 2>&1; echo "exit $?" >> "$RES/grid_study.log"; tail -n 4 "$RES/grid_study.log"
  widened bwd "$RES/grid-rmsnorm_bwd-small-m" 'log2_m<=10'
  gpu_tests $(( 560 - SECONDS )) tests/gpu/test_rmsnorm_bwd_small_gpu.py tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py \
    tests/gpu/test_op_tune_gpu.py
  mkdir -p "$RES/widened" && cp kernels/ops/rmsnorm_fwd.json kernels/ops/rmsnorm_bwd.json "$RES/widened/" && \
    tar czf "$RES/widened/kernels.tgz" -C kernels/ops cubins sources; pack > /dev/null
  ;;
q3)
  setup .gpu-c
  install_widened
  int21_wait 200 || exit 2
  shipped fwd "$FWD" $(( 580 - SECONDS ))
  ;;
q4)
  setup
  install_widened
  shipped bwd "$BWD" $(( 570 - SECONDS ))
  ;;
r1)
  first_call   # QuACK completes in r3
  twinned
  mkdir -p "$RES/twin" && cp /tmp/twin-bwd/rmsnorm_bwd.json "$RES/twin/" && pack > /dev/null
  gpu_tests "${KDA_S:-200}" tests/gpu/test_kda_fwd_gpu.py -k chunked
  mv "$RES/gpu-tests.log" "$RES/gpu-tests-kda.log"
  # the rest of the call less about 100 s for the widened table's build (every kernel of it, NVRTC on the host)
  OUT="$RES" timeout $(( ${END:-585} - SECONDS - 100 )) python3 tests/gpu/latency_probe.py --grid \
    --budget $(( ${END:-585} - SECONDS - 140 )) > "$RES/latency_probe.log" 2>&1
  echo "exit $?" >> "$RES/latency_probe.log"; grep "^latency\|^exit" "$RES/latency_probe.log"; pack > /dev/null
  widened fwd "$RES/latency-panels" 'log2_n<=13'
  ;;
r2)
  export KF_PEERS=liger
  setup .gpu-b
  twinned
  install_twin
  for grid in small-m wide; do   # GRID_S, WIDE_S: each grid's share of the call
    secs=$([ $grid = wide ] && echo "${WIDE_S:-170}" || echo "${GRID_S:-150}")
    OUT="$RES" timeout "$secs" python3 tests/gpu/grid_study.py --problem rmsnorm_bwd --grid $grid --per-dtype 6 \
      --budget $(( secs - 40 )) > "$RES/grid_study-$grid.log" 2>&1
    echo "exit $?" >> "$RES/grid_study-$grid.log"; tail -n 4 "$RES/grid_study-$grid.log"; pack > /dev/null
  done
  # each on the table before it (the twin, installed): installs the widened tables
  widened bwd "$RES/grid-rmsnorm_bwd-small-m" 'log2_m<=10'
  widened bwd "$RES/grid-rmsnorm_bwd-wide" 'log2_n>=14'
  mkdir -p "$RES/tables" && cp kernels/ops/rmsnorm_fwd.json kernels/ops/rmsnorm_bwd.json "$RES/tables/" && \
    tar czf "$RES/tables/kernels.tgz" -C kernels/ops cubins sources; pack > /dev/null
  gpu_tests $(( ${END:-585} - SECONDS )) tests/gpu/test_op_table_gpu.py tests/gpu/test_rmsnorm_op_gpu.py \
    tests/gpu/test_op_tune_gpu.py tests/gpu/test_kda_fwd_gpu.py -k "not every_genome and not chunked_reference"
  ;;
r3)
  setup .gpu-c
  twinned
  subject bwd "$BWD"   # the shipped tables the subjects, before the twinned and widened ones are installed
  subject fwd "$FWD"
  small_n fwd
  install_twin
  install_widened
  int21_wait 200 || exit 2
  shipped bwd "$BWD" $(( ${END:-585} - SECONDS - 10 ))
  [ $(( ${END:-585} - SECONDS )) -gt 60 ] && heldout small-n-fwd $(( ${END:-585} - SECONDS - 10 ))
  ;;
r4)
  export KF_PEERS=liger
  setup "${BUNDLE:-.gpu-b}"   # FLA's wheels (a cold host: a bundle of .gpu-a less QuACK, and FLA)
  gpu_tests "${TESTS_S:-150}" tests/gpu/test_op_tune_gpu.py tests/gpu/test_op_table_gpu.py \
    tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_kda_fwd_gpu.py -k "not recurrent"
  kda_vs_fla
  ;;
bundle)   # a middle bundle of tests/gpu/bundles.sh (.gpu-b2, ...: a part of the large wheel), staged in seconds
  export KF_PEERS=liger
  setup "${2:?usage: campaigns.sh bundle FOLDER}"
  ;;
n1)
  first_call   # QuACK completes in n4
  # the backward's three GPU files whole (the template gained the column split; its cols corners among the gate's),
  # then the column split beside torch.compile on few-row, huge-width shapes (none a campaign's held-out one), then
  # what h1 left of the GPU suite
  gpu_tests 240 tests/gpu/test_rmsnorm_bwd_gpu.py tests/gpu/test_rmsnorm_bwd_small_gpu.py \
    tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py
  mv "$RES/gpu-tests.log" "$RES/gpu-tests-bwd.log"; mv "$RES/gpu-tests" "$RES/gpu-tests-bwd"
  timeout 150 kernel-factory bench --problem rmsnorm_bwd --genes '{"small_m": "cols"}' --dtypes float16,float32 \
    --shapes 3x250000,9x90000,40x120000,24x32768 --baselines torch_compile,torch_eager,factory_op --reps 20 \
    --out "$RES/cols-bench" --stem cols > "$RES/cols-bench.log" 2>&1; echo "exit $?" >> "$RES/cols-bench.log"
  tail -n 14 "$RES/cols-bench.log"; pack > /dev/null
  gpu_tests $(( ${END:-585} - SECONDS )) tests/gpu/test_gpu_evaluator.py tests/gpu/test_faults_gpu.py \
    tests/gpu/test_bench_gpu.py tests/gpu/test_silu_mul_op_gpu.py
  ;;
m1)
  first_call   # QuACK completes in n4f
  # the timer's hold first (its own GPU test, then the evaluator's and the bench's files time through it), then the
  # column split's second version through the backward's gate (KF_BWD_GENOMES: the default and the cols corners), then
  # its time beside torch.compile, torch eager, Liger, INT21 (if built by then) and the op
  gpu_tests "${HOLD_S:-230}" tests/gpu/test_measure_gpu.py tests/gpu/test_bench_gpu.py tests/gpu/test_gpu_evaluator.py
  mv "$RES/gpu-tests.log" "$RES/gpu-tests-hold.log"; mv "$RES/gpu-tests" "$RES/gpu-tests-hold"
  KF_BWD_GENOMES=cols gpu_tests "${COLS_S:-150}" tests/gpu/test_rmsnorm_bwd_gpu.py -k "every_genome or corners"
  mv "$RES/gpu-tests.log" "$RES/gpu-tests-cols.log"; mv "$RES/gpu-tests" "$RES/gpu-tests-cols"
  peers=torch_compile,torch_eager,liger,factory_op
  int21_wait 1 2> /dev/null && peers="$peers,int21"
  timeout $(( ${END:-585} - SECONDS )) kernel-factory bench --problem rmsnorm_bwd --genes '{"small_m": "cols"}' \
    --dtypes bfloat16,float32 --shapes 3x250000,9x90000,40x120000,24x32768,64x16384 --baselines "$peers" --reps 20 \
    --out "$RES/cols-bench" --stem cols2 > "$RES/cols-bench.log" 2>&1; echo "exit $?" >> "$RES/cols-bench.log"
  tail -n 16 "$RES/cols-bench.log"; pack > /dev/null
  ;;
n2)
  export KF_PEERS=liger
  setup .gpu-b
  quiet_host kda
  # FLA's first calls (Triton compiles of every autotuned configuration) outlasted two KDA benches' shares (180 s)
  # before their first case: made first, alone on the GPU, each workload's line logged, then the benches
  [ -f /tmp/fla_warm.log ] || fla_warm
  fla_wait $(( ${END:-585} - SECONDS - 150 )); cp /tmp/fla_warm.log "$RES/"; tail -n 3 "$RES/fla_warm.log"
  kda_vs_fla
  ;;
n4)
  setup .gpu-c
  int21_wait 200 || exit 2
  shipped bwd "$BWD" $(( ${END:-585} - SECONDS - 10 ))
  ;;
n4f)   # n4 with the forward: QuACK complete, the forward op as shipped on h200-fwd-workload-5's held-out shapes
  setup .gpu-c
  int21_wait 200 || exit 2
  shipped fwd "$FWD" $(( ${END:-585} - SECONDS - 10 ))
  ;;
n5|n6)
  setup
  # a bench goes on only on the card that began it (n1 named it): an H100's times must not join an H200's
  [ "$(gpu_name)" = "$(cat /tmp/kf-first-gpu 2>/dev/null)" ] || { echo "$stage: not the card n1 named"; exit 2; }
  # --go-on times only the cases a bench lacks (none: it returns at once)
  [ -f /tmp/runs/shipped-bwd/heldout-bench.json ] && shipped bwd "$BWD" $(( ${END:-585} - SECONDS - 10 )) --go-on
  if [ -f /tmp/runs/shipped-fwd/heldout-bench.json ]; then
    shipped fwd "$FWD" $(( ${END:-585} - SECONDS - 10 )) --go-on
  elif [ $(( ${END:-585} - SECONDS )) -gt 60 ]; then
    shipped fwd "$FWD" $(( ${END:-585} - SECONDS - 10 ))
  fi
  if [ "$stage" = n6 ]; then
    for part in fwd bwd; do   # the 11 benchmark rows, the op as users call it, every peer (QuACK tuned among them)
      [ $(( ${END:-585} - SECONDS )) -gt 60 ] || break
      timeout $(( ${END:-585} - SECONDS - 10 )) kernel-factory bench --problem "rmsnorm_$part" --op \
        --dtypes bfloat16,float16,float32 --reps 20 --out "$RES/bench" --stem "$part-rows" > "$RES/bench-$part.log" 2>&1
      echo "exit $?" >> "$RES/bench-$part.log"; tail -n 16 "$RES/bench-$part.log"; pack > /dev/null
    done
  fi
  ;;
h1)
  first_call   # QuACK completes in h3
  # every file but KDA's (h2), the op's and its tables' first
  gpu_tests $(( ${END:-585} - SECONDS )) tests/gpu/test_op_table_gpu.py tests/gpu/test_op_tune_gpu.py \
    tests/gpu/test_rmsnorm_op_gpu.py tests/gpu/test_rmsnorm_bwd_gpu.py tests/gpu/test_rmsnorm_bwd_small_gpu.py \
    tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py tests/gpu/test_rmsnorm_fwd_tail_gpu.py \
    tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py tests/gpu/test_rmsnorm_fwd_wide_gpu.py tests/gpu/test_gpu_evaluator.py \
    tests/gpu/test_faults_gpu.py tests/gpu/test_bench_gpu.py tests/gpu/test_silu_mul_op_gpu.py
  ;;
h2)
  export KF_PEERS=liger
  setup .gpu-b
  gpu_tests "${TESTS_S:-340}" tests/gpu/test_kda_fwd_gpu.py
  kda_vs_fla
  ;;
h3)
  setup .gpu-c
  int21_wait 200 || exit 2
  shipped bwd "$BWD" $(( ${END:-585} - SECONDS - 10 ))
  [ $(( ${END:-585} - SECONDS )) -gt 60 ] && shipped fwd "$FWD" $(( ${END:-585} - SECONDS - 10 ))
  ;;
pe1)
  first_call   # QuACK completes in pe3
  # a short call gates the peel corners only (KF_BWD_GENOMES: the default and the corners whose name holds it)
  focus=()
  if [ "${END:-585}" -lt 500 ]; then export KF_BWD_GENOMES=peel,narrow; focus=(-k "every_genome and not recurrent"); fi
  # TESTS_S: the tests' share of the call (default half of it); EXTRA_TESTS: more test files in it (e.g. KDA's, whose
  # chunked genomes a short call gates, its recurrent ones left out by the focus)
  # shellcheck disable=SC2086
  gpu_tests "${TESTS_S:-$(( ${END:-585} / 2 ))}" tests/gpu/test_rmsnorm_bwd_gpu.py ${EXTRA_TESTS:-} "${focus[@]}"
  twinned
  mkdir -p "$RES/twin" && cp /tmp/twin-bwd/rmsnorm_bwd.json "$RES/twin/" && pack > /dev/null
  peel_subject
  install_twin
  int21_wait 60 || exit 2
  heldout peel-bwd $(( ${END:-585} - SECONDS )) --without quack   # END: the call's limit less 15 s
  ;;
pe2)
  export KF_PEERS=liger
  setup .gpu-b
  twinned
  install_twin
  gpu_tests $(( ${END:-330} - SECONDS )) tests/gpu/test_rmsnorm_bwd_small_gpu.py \
    tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py tests/gpu/test_rmsnorm_op_gpu.py
  ;;
pe3)
  setup .gpu-c
  twinned
  subject bwd "$BWD"   # the shipped table the subject, before the twin is installed
  install_twin
  int21_wait 200 || exit 2
  shipped bwd "$BWD" $(( ${END:-580} - SECONDS ))
  ;;
pe4)
  setup
  install_twin
  shipped bwd "$BWD" $(( 560 - SECONDS )) --go-on
  ;;
p1)
  first_call   # QuACK completes in p3
  ;;
p2)
  export KF_PEERS=liger
  setup .gpu-b
  OUT="$RES" timeout 170 python3 tests/gpu/jitter.py --problem rmsnorm_bwd > "$RES/jitter.log" 2>&1
  echo "exit $?" >> "$RES/jitter.log"; tail -n 12 "$RES/jitter.log"
  ;;
p3)
  setup .gpu-c
  int21_wait 200 || exit 2
  OUT="$RES" timeout 260 python3 tests/gpu/latency_probe.py --budget 220 > "$RES/latency_probe.log" 2>&1
  echo "exit $?" >> "$RES/latency_probe.log"; grep "^latency\|^exit" "$RES/latency_probe.log"; pack > /dev/null
  shipped bwd "$BWD" $(( 570 - SECONDS ))
  ;;
p4)
  setup
  shipped bwd "$BWD" $(( 560 - SECONDS )) --go-on
  ;;
p5)
  setup
  if grep -q "^held-out bwd fp32, op as shipped" /tmp/runs/shipped-bwd/heldout.md 2>/dev/null; then
    timeout $(( 560 - SECONDS )) kernel-factory bench --problem rmsnorm_fwd --op --dtypes bfloat16,float16,float32 \
      --reps 20 --out "$RES/bench" --stem fwd-all > "$RES/bench.log" 2>&1; echo "exit $?" >> "$RES/bench.log"
    tail -n 16 "$RES/bench.log"
  else
    shipped bwd "$BWD" $(( 560 - SECONDS )) --go-on
  fi
  ;;
t1)
  first_call   # QuACK completes in t3
  gpu_tests $(( 450 - SECONDS )) tests/gpu/test_op_tune_gpu.py tests/gpu/test_rmsnorm_op_gpu.py \
    tests/gpu/test_silu_mul_op_gpu.py
  ;;
t2)
  export KF_PEERS=liger
  setup .gpu-b
  timeout 120 python3 tests/gpu/tune_cost.py > "$RES/tune_cost.txt" 2>&1; echo "exit $?" >> "$RES/tune_cost.txt"
  cat "$RES/tune_cost.txt"
  ;;
t3)
  setup .gpu-c
  int21_wait 200 || exit 2
  shipped fwd "$FWD" $(( 580 - SECONDS ))
  ;;
t4)
  setup
  shipped bwd "$BWD" $(( 560 - SECONDS ))
  ;;
t5)
  setup
  shipped bwd "$BWD" $(( 560 - SECONDS )) --go-on
  ;;
sm1)
  first_call   # QuACK completes in sm3
  echo "small-M training from $SECONDS s"
  OUT="$RES" timeout 330 python3 tests/gpu/small_m_study.py train --rules "$SMALL_M/small_m_rule.json" --budget 270 \
    > "$RES/small_m_train.log" 2>&1
  echo "exit $?" >> "$RES/small_m_train.log"; tail -n 5 "$RES/small_m_train.log"; gzip -kf "$SMALL_M/small_m_rule.json"
  cp "$SMALL_M/small_m_rule.json.gz" "$RES/"; pack > /dev/null
  # shellcheck disable=SC2086  # a list of test files
  gpu_tests $(( 575 - SECONDS )) $FWD_FILES tests/gpu/test_gpu_evaluator.py
  ;;
sm2)
  export KF_PEERS=liger
  setup .gpu-b
  # short: two failed starts took this session's device time; what it cuts is named by -vv (the rest: next session)
  gpu_tests $(( 380 - SECONDS )) tests/gpu/test_faults_gpu.py tests/gpu/test_bench_gpu.py \
    tests/gpu/test_rmsnorm_bwd_small_gpu.py tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py tests/gpu/test_silu_mul_op_gpu.py \
    tests/gpu/test_rmsnorm_bwd_gpu.py tests/gpu/test_kda_fwd_gpu.py
  ;;
sm3)
  setup .gpu-c
  int21_wait 200 || exit 2
  [ -f "$SMALL_M/small_m_graft.json" ] || { echo "sm3: no $SMALL_M/small_m_graft.json (sm1 did not train)"; exit 2; }
  echo "small-M held-out from $SECONDS s"
  OUT="$RES" timeout 260 python3 tests/gpu/small_m_study.py heldout --rules "$SMALL_M/small_m_rule.json" \
    > "$RES/small_m.log" 2>&1
  echo "exit $?" >> "$RES/small_m.log"; tail -n 16 "$RES/small_m.log"; pack > /dev/null
  mkdir -p "/tmp/runs/$GRAFT" && cp "docs/results/workload/$FWD/workload.json" "/tmp/runs/$GRAFT/"
  kernel-factory graft "$SMALL_M/small_m_graft.json" --problem rmsnorm_fwd \
    --out "/tmp/runs/$GRAFT/kernels/dispatch.json" > "$RES/graft.log" 2>&1; echo "exit $?" >> "$RES/graft.log"
  tail -n 5 "$RES/graft.log"
  heldout "$GRAFT" $(( 490 - SECONDS ))
  # the grafted table as the op's own, then the op's GPU tests through it
  cp "/tmp/runs/$GRAFT/kernels/dispatch.json" "/tmp/runs/$GRAFT/kernels/rmsnorm_fwd.json"
  install_table "/tmp/runs/$GRAFT/kernels" rmsnorm_fwd
  gpu_tests $(( 585 - SECONDS )) tests/gpu/test_rmsnorm_op_gpu.py
  ;;
wa1)
  first_call   # QuACK completes in wa3
  # shellcheck disable=SC2086  # a list of test files
  gpu_tests 240 $FWD_FILES
  cp "$RES/gpu-tests.log" "$RES/gpu-tests-fwd.log"
  if h200; then
    wahead $(( 480 - SECONDS ))
  else
    gpu_tests $(( 330 - SECONDS )) tests/gpu/test_gpu_evaluator.py tests/gpu/test_faults_gpu.py
  fi
  ;;
wa2)
  export KF_PEERS=liger
  setup .gpu-b   # the second bundle of QuACK's toolkit flavour; on an H200 a cut campaign goes on
  h200 && wahead 240
  ;;
wa3)
  setup .gpu-c
  int21_wait 200 || exit 2
  echo "small-M study from $SECONDS s"
  OUT="$RES" timeout 420 python3 tests/gpu/small_m_study.py > "$RES/small_m.log" 2>&1
  echo "exit $?" >> "$RES/small_m.log"; tail -n 8 "$RES/small_m.log"; pack > /dev/null
  h200 && heldout "$FWD7" $(( 580 - SECONDS ))
  ;;
fwd6)
  export KF_PEERS=liger   # QuACK completes in call rows; INT21 builds in the background meanwhile
  setup .gpu-a
  int21_build
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RES/gpu.txt"
  mkdir -p /tmp/runs && cp -r .campaigns/* /tmp/runs/
  campaign configs/rmsnorm_fwd_workload.yaml "$FWD6" $(( 530 - SECONDS )) -o workload.train_more=48 \
    -o "workload.searched_from=.campaigns/$FWD_SEARCHED" \
    -o "workload.panel_times_from=docs/results/workload/$FWD"
  ;;
suiteb)
  export KF_PEERS=liger
  setup .gpu-b
  gpu_tests $(( 450 - SECONDS ))
  ;;
rows)
  setup .gpu-c
  int21_wait 120 || exit 2
  mkdir -p /tmp/runs && cp -r .campaigns/h200-bwd-workload-2 /tmp/runs/
  echo "rows $BWD: from $SECONDS s"
  timeout 240 kernel-factory bench --problem rmsnorm_bwd --table "/tmp/runs/$BWD/kernels/dispatch.json" \
    --shapes benchmark --dtypes bfloat16,float16,float32 --reps 20 --out "$RES/$BWD/bench" --stem rows \
    --baselines quack,int21,liger,torch_eager,factory_op \
    > "$RES/rows-$BWD.log" 2>&1; echo "exit $?" >> "$RES/rows-$BWD.log"
  tail -n 12 "$RES/rows-$BWD.log"; pack > /dev/null
  heldout "$FWD6" $(( 545 - SECONDS ))
  ;;
whole)
  setup
  gpu_tests 560
  ;;
kda)
  setup
  gpu_tests 200 tests/gpu/test_kda_fwd_gpu.py
  timeout $(( 570 - SECONDS )) kernel-factory run configs/kda_fwd.yaml -o out_dir=/tmp/runs --run-id kda-fwd-1 \
    > "$RES/kda-fwd-1.log" 2>&1; echo "exit $?" >> "$RES/kda-fwd-1.log"; tail -n 12 "$RES/kda-fwd-1.log"
  gzip -c /tmp/runs/kda-fwd-1/journal.jsonl > "$RES/kda-fwd-1.journal.jsonl.gz" 2>/dev/null; pack > /dev/null
  ;;
fwd)
  export KF_PEERS=liger   # QuACK completes in call heldout; INT21 builds in the background meanwhile
  setup .gpu-a
  int21_build
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$RES/gpu.txt"
  mkdir -p /tmp/runs && cp -r .campaigns/* /tmp/runs/
  campaign configs/rmsnorm_fwd_workload.yaml "$FWD" 430 -o "workload.searched_from=.campaigns/$FWD_SEARCHED"
  gpu_tests $(( 575 - SECONDS )) \
    tests/gpu/test_rmsnorm_bwd_gpu.py::test_every_genome_passes_the_gate_on_odd_and_held_out_shapes \
    tests/gpu/test_rmsnorm_bwd_gpu.py::test_live_evaluator_checks_and_times_a_spread
  ;;
suite)
  export KF_PEERS=liger
  setup .gpu-b
  gpu_tests 300 tests/gpu/test_gpu_evaluator.py
  ;;
heldout)
  setup .gpu-c
  int21_wait 120 || exit 2
  mkdir -p /tmp/runs && cp -r .campaigns/h200-bwd-workload-2 /tmp/runs/
  heldout "$BWD" 270 --go-on
  heldout "$FWD" $(( 580 - SECONDS ))
  ;;
more)
  setup
  heldout "$FWD" 330 --go-on
  gpu_tests $(( 560 - SECONDS )) tests/gpu/test_bench_gpu.py
  ;;
panels)
  export KF_PEERS=liger
  setup .gpu-a
  int21_build
  mkdir -p /tmp/runs && cp -r .campaigns/* /tmp/runs/
  campaign configs/rmsnorm_fwd_workload.yaml "$FWD" 270 -o "workload.searched_from=.campaigns/$FWD_SEARCHED"
  campaign configs/rmsnorm_bwd_workload.yaml "$BWD" $(( 560 - SECONDS )) \
    -o "workload.searched_from=.campaigns/$BWD_SEARCHED"
  ;;
bwd)
  export KF_PEERS=liger
  setup .gpu-a
  int21_build
  mkdir -p /tmp/runs && cp -r .campaigns/* /tmp/runs/
  campaign configs/rmsnorm_bwd_workload.yaml "$BWD" $(( 575 - SECONDS )) \
    -o "workload.searched_from=.campaigns/$BWD_SEARCHED"
  ;;
record)   # carry .gpu-a: the held-out recording for the efficiency audit; suite2 finishes it if it is cut
  export KF_PEERS=liger
  setup .gpu-a
  recording $(( 570 - SECONDS ))
  ;;
suite1)
  export KF_PEERS=liger
  setup .gpu-b
  # shellcheck disable=SC2086  # a list of test files
  gpu_tests $(( 560 - SECONDS )) $SUITE1
  ;;
suite2)
  setup .gpu-c
  [ -f "$RECORDING" ] || recording 150
  # shellcheck disable=SC2086
  gpu_tests $(( 400 - SECONDS )) $SUITE2
  cp "$RES/gpu-tests.log" "$RES/gpu-tests-suite2.log"
  kda_search $(( 575 - SECONDS ))
  ;;
*) echo "campaigns.sh: unknown stage $stage (t1 to t5, sm1, sm2, sm3, wa1, wa2, wa3, record, suite1, suite2, fwd6, suiteb, rows, whole, kda, fwd, suite," \
     "heldout, more, panels or bwd)" >&2; exit 2 ;;
esac
