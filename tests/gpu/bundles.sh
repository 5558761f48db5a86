#!/usr/bin/env bash
# Pack what an offline GPU host lacks into carry folders, each of which fits one device call beside the checkout
# (64 MiB a call in all, counted on disk: the tracked and untracked files, and .int21/ where it is carried). Run on
# the connected CPU machine, from the repository root, after building the wheelhouses (docs/gpu-host.md):
#   ../shared/gpu-host/wheelhouse.sh .whl
#   ../shared/gpu-host/wheelhouse.sh --no-deps .whl-baselines quack-kernels==0.6.5 liger-kernel==0.8.5 ...
#   tests/gpu/bundles.sh
# Writes (all git-ignored):
#   .gpu-a/   every wheel of .whl, .whl-baselines and .whl-kda (FLA, for kda_fwd) except the large cutlass
#             CUDA-toolkit flavour and MLflow's server wheel (`mlflow`: its UI and server; the host logs through
#             mlflow-skinny, which holds the `mlflow` package); carried with .int21/
#   .gpu-b/   the large wheel's first part (NAME.whl.part-1-of-N)
#   .gpu-b2/, .gpu-b3/ ...  its middle parts, only where the checkout leaves too little room for two
#   .gpu-c/   its last part; carried with .int21/ (the call that completes QuACK times INT21 too)
# Each call carries one folder, back to back, in that order; `source tests/gpu/host_setup.sh FOLDER` collects the
# parts in /tmp, joins them once all have arrived (checked against their SHA-256), and installs. A part's name says
# how many parts make the wheel, so the host never installs a wheel that still misses a part. The script prints
# the folders in order and stops, naming the folder, if one of them and the checkout would not fit a call.
set -euo pipefail
cd "$(dirname "$0")/../.."
call=$(( 64 * 1024 ))   # KiB
margin=1024             # KiB: the checkout grows by commits between this script and the calls
tree=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- | tail -1 | cut -f1)
int21=$( [ -d .int21 ] && du -ck .int21 | tail -1 | cut -f1 || echo 0)
part_kib=$(( call - tree - int21 - margin ))
rm -rf .gpu-a .gpu-b .gpu-b[0-9]* .gpu-c
mkdir -p .gpu-a
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
folders=(.gpu-a)
for w in "${big[@]}"; do
  name="$(basename "$w")"
  size=$(stat -c %s "$w")
  chunk=$(( part_kib * 1024 ))
  n=$(( (size + chunk - 1) / chunk ))
  [ "$n" -ge 2 ] || n=2   # the first call has no room for it beside .gpu-a
  chunk=$(( (size + n - 1) / n ))
  for k in $(seq 1 "$n"); do
    if [ "$k" -eq 1 ]; then d=.gpu-b; elif [ "$k" -eq "$n" ]; then d=.gpu-c; else d=".gpu-b$k"; fi
    mkdir -p "$d"
    dd if="$w" of="$d/$name.part-$k-of-$n" iflag=skip_bytes,count_bytes skip=$(( (k - 1) * chunk )) \
      count="$chunk" status=none
    sha256sum "$w" | awk -v n="$name" '{print $1 "  " n}' > "$d/SHA256SUMS"
    folders+=("$d")
  done
  rm -f "$w"
done
for d in "${folders[@]}"; do
  kib=$(du -ck "$d" | tail -1 | cut -f1)
  extra=$( [ "$d" = .gpu-a ] || [ "$d" = .gpu-c ] && echo "$int21" || echo 0)
  if [ $(( kib + tree + extra )) -gt "$call" ]; then
    echo "bundles.sh: $d ($kib KiB on disk) with the checkout ($tree KiB) and .int21 ($extra KiB) is over a call's" \
      "$call KiB" >&2
    exit 2
  fi
  printf '%s  %6.1f MiB  %s files; with the checkout %6.1f MiB\n' "$d" "$(echo "$kib / 1024" | bc -l)" \
    "$(ls "$d" | wc -l)" "$(echo "($kib + $tree + $extra) / 1024" | bc -l)"
done
