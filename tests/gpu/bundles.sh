#!/usr/bin/env bash
# Pack what an offline GPU host lacks into three carry folders, so that each fits one device call beside the checkout
# (64 MiB a call in all: the tracked files, and .int21/ where it is carried with .gpu-a and .gpu-c). Run on the
# connected CPU machine, from the repository root, after building the wheelhouses (docs/gpu-host.md):
#   ../shared/gpu-host/wheelhouse.sh .whl
#   ../shared/gpu-host/wheelhouse.sh --no-deps .whl-baselines quack-kernels==0.6.5 liger-kernel==0.8.5 ...
#   tests/gpu/bundles.sh
# Writes (all git-ignored):
#   .gpu-a/  every wheel of .whl, .whl-baselines and .whl-kda (FLA, for kda_fwd) except the large cutlass
#            CUDA-toolkit flavour and MLflow's server wheel (`mlflow`: its UI and server; the host logs through
#            mlflow-skinny, which holds the `mlflow` package)
#   .gpu-b/  that flavour's first half   (NAME.whl.part-1-of-2)
#   .gpu-c/  its second half             (NAME.whl.part-2-of-2)
# On the host, `source tests/gpu/host_setup.sh .gpu-a` (then .gpu-b, then .gpu-c, one device call each, back to
# back) collects them in /tmp, joins the parts once all have arrived, and installs; .gpu-c completes QuACK.
# A part's name says how many parts make the wheel, so the host never installs a wheel that still misses a part.
# The script stops, naming the folder, if one of them and the checkout would not fit a call.
set -euo pipefail
cd "$(dirname "$0")/../.."
call=$(( 64 * 2**20 ))
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
int21=$( [ -d .int21 ] && du -cb .int21 | tail -1 | cut -f1 || echo 0)
rm -rf .gpu-a .gpu-b .gpu-c
mkdir -p .gpu-a .gpu-b .gpu-c
big=()
for w in .whl/*.whl .whl-baselines/*.whl .whl-kda/*.whl; do
  [ -e "$w" ] || continue
  case "$(basename "$w")" in mlflow-[0-9]*) continue ;; esac
  cp "$w" .gpu-a/
done
# wheelhouse.sh left the large wheel in parts under .whl-baselines-parts/: join them here, then split in two
for first in .whl-baselines-parts/*.part.aa; do
  [ -e "$first" ] || continue
  whl="$(basename "${first%.part.aa}")"
  cat "${first%.part.aa}".part.* > "/tmp/$whl"
  big+=("/tmp/$whl")
done
for w in "${big[@]}"; do
  name="$(basename "$w")"
  size=$(stat -c %s "$w")
  half=$(( (size + 1) / 2 ))
  head -c "$half" "$w" > ".gpu-b/$name.part-1-of-2"
  tail -c +$(( half + 1 )) "$w" > ".gpu-c/$name.part-2-of-2"
  sha256sum "$w" | awk -v n="$name" '{print $1 "  " n}' | tee .gpu-b/SHA256SUMS > .gpu-c/SHA256SUMS
  rm -f "$w"
done
for d in .gpu-a .gpu-b .gpu-c; do
  bytes=$(du -cb "$d" | tail -1 | cut -f1)
  extra=$( [ "$d" = .gpu-b ] && echo 0 || echo "$int21")
  if [ $(( bytes + tree + extra )) -gt "$call" ]; then
    echo "bundles.sh: $d ($bytes bytes) with the checkout ($tree) and .int21 ($extra) is over a call's $call" >&2
    exit 2
  fi
  printf '%s  %6.1f MiB  %s files; with the checkout %6.1f MiB\n' "$d" "$(echo "$bytes / 1048576" | bc -l)" \
    "$(ls "$d" | wc -l)" "$(echo "($bytes + $tree + $extra) / 1048576" | bc -l)"
done
