#!/usr/bin/env bash
# Failures worth seeing (issue 23): re-make the quickstart's recording with the genomes its rule rejects that fail
# on a real H200, so that a replayed quickstart shows measured failures with their logs. Run from the repository
# root on the GPU host where the project is installed; everything is written under $OUT, nothing in the checkout.
#
#   OUT=/some/folder tests/gpu/record_failures.sh
#
# Why a GPU: NVRTC 13.0 compiles all 336 genomes of the recording's space that the rule rejects (96 declare more
# than 48 KiB of static shared memory, which ptxas accepts; 240 spill registers), so the CPU (record --cpu-failures)
# adds nothing. Only a launch and the correctness gate can say which of them fail, and how.
#
# Step 1 evaluates those 336 genomes with the recording's own gate and timing options (configs/
# rmsnorm_fwd_record.yaml) and writes the recording with the failures added, marked outside_rule; the header's
# gpu_outside_rule lists the ones that passed (left out: a live run's rule never proposes them). Step 2 replays the
# quickstart from it on the CPU path of the same host, as a check. To adopt it, copy
# $OUT/rmsnorm_fwd-bfloat16-h200.jsonl.gz over problems/recorded/ and update problems/recorded/README.md from
# $OUT/summary.txt (a replay that meets a recorded failure shows it in its candidate table, failures.md and lineage).
# Cut short (a time limit, a kill), step 1 keeps each result in $OUT/rmsnorm_fwd-bfloat16-h200.partial.jsonl; run
# the script again with the same $OUT (that file carried back) and it measures only the rest.
set -euo pipefail
out="${OUT:?set OUT to the folder for the results}"
mkdir -p "$out"
rec=problems/recorded/rmsnorm_fwd-bfloat16-h200.jsonl.gz

kernel-factory record configs/rmsnorm_fwd_record.yaml --outside-rule "$rec" \
  --out "$out/rmsnorm_fwd-bfloat16-h200.jsonl.gz" 2>&1 | tee "$out/record_outside_rule.log"

python3 - "$out/rmsnorm_fwd-bfloat16-h200.jsonl.gz" > "$out/summary.txt" <<'PY'
import collections, json, sys
from kernel_factory.evo.evaluate import recording
rec = recording.read(sys.argv[1])
note = rec.header["gpu_outside_rule"]
counts = collections.Counter(rec.entries[g][1].status.value for g in rec.outside_rule)
print(json.dumps({"measured": note["measured"], "failures": note["failures"], "passed": len(note["passed"]),
                  "by_status": counts, "fingerprint": note["fingerprint"], "date": note["date"]}, indent=2))
for gid, why in list(rec.outside_rule.items())[:5]:
    print(gid, why, "->", rec.entries[gid][1].status.value, rec.entries[gid][1].message[:300].replace("\n", " "))
PY
cat "$out/summary.txt"

kernel-factory run configs/quickstart.yaml -o evaluator.kind=replay \
  -o "evaluator.replay.recording=$out/rmsnorm_fwd-bfloat16-h200.jsonl.gz" -o "out_dir=$out/replay" \
  2>&1 | tee "$out/replay_quickstart.log"
