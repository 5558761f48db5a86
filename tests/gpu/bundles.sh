#!/usr/bin/env bash
# Pack what an offline GPU host lacks into three carry folders of at most BUNDLE_MIB each (default 50), so that
# each fits one device call beside the checkout (64 MiB a call in all). Run on the connected CPU machine, from the
# repository root, after building the wheelhouses (docs/gpu-host.md):
#   ../shared/gpu-host/wheelhouse.sh .whl
#   ../shared/gpu-host/wheelhouse.sh --no-deps .whl-baselines quack-kernels==0.6.5 liger-kernel==0.8.5 ...
#   tests/gpu/bundles.sh
# Writes (all git-ignored):
#   .gpu-a/  every wheel of .whl and .whl-baselines except the large cutlass CUDA-toolkit flavour
#   .gpu-b/  that flavour's first half   (NAME.whl.part-1-of-2), and .whl-kda's wheels (FLA, for kda_fwd)
#   .gpu-c/  its second half             (NAME.whl.part-2-of-2), and QuACK's TVM FFI wheel
# On the host, `source tests/gpu/host_setup.sh .gpu-a` (then .gpu-b, then .gpu-c, one device call each, back to
# back) collects them in /tmp, joins the parts once all have arrived, and installs; .gpu-c completes QuACK.
# A wheel is split only when it is larger than BUNDLE_MIB; a part's name says how many parts make the wheel, so
# the host never installs a wheel that still misses a part.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$(( ${BUNDLE_MIB:-50} * 2**20 ))
rm -rf .gpu-a .gpu-b .gpu-c
mkdir -p .gpu-a .gpu-b .gpu-c
big=()
for w in .whl/*.whl .whl-baselines/*.whl; do
  [ -e "$w" ] || continue
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
  if [ "$half" -gt "$limit" ]; then
    echo "bundles.sh: $name ($size bytes) does not fit two bundles of $limit bytes" >&2; exit 2
  fi
  head -c "$half" "$w" > ".gpu-b/$name.part-1-of-2"
  tail -c +$(( half + 1 )) "$w" > ".gpu-c/$name.part-2-of-2"
  sha256sum "$w" | awk -v n="$name" '{print $1 "  " n}' | tee .gpu-b/SHA256SUMS > .gpu-c/SHA256SUMS
  rm -f "$w"
done
# the KDA forward's peer (FLA, small wheels) rides in .gpu-b, which has room beside its half of the large wheel
for w in .whl-kda/*.whl; do
  [ -e "$w" ] && cp "$w" .gpu-b/
done
# QuACK's TVM FFI wheel is needed only once QuACK completes: it rides in .gpu-c, so that .gpu-a leaves room for the
# checkout (with the op's widened tables, 15 MB) under a call's 64 MiB
for w in .gpu-a/apache_tvm_ffi-*.whl; do
  [ -e "$w" ] && mv "$w" .gpu-c/
done
for d in .gpu-a .gpu-b .gpu-c; do
  bytes=$(du -cb "$d" | tail -1 | cut -f1)
  if [ "$bytes" -gt "$limit" ]; then
    echo "bundles.sh: $d holds $bytes bytes, over $limit: set BUNDLE_MIB or carry less" >&2; exit 2
  fi
  printf '%s  %6.1f MiB  %s files\n' "$d" "$(echo "$bytes / 1048576" | bc -l)" "$(ls "$d" | wc -l)"
done
