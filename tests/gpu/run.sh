#!/usr/bin/env bash
# The GPU tests, on a GPU host: one command from the repository root, logs under $OUT. docs/gpu-host.md says more.
#
#   tests/gpu/run.sh [PYTEST ARGS...]
#     tests/gpu/run.sh                                   every GPU test (tests/gpu)
#     tests/gpu/run.sh tests/gpu/test_faults_gpu.py      some files only
#     tests/gpu/run.sh -k op -x                          any pytest selection
#
# On an offline host (a .whl/ wheelhouse carried in, or a host set up by an earlier call), it first sources
# tests/gpu/host_setup.sh, which installs the wheels and this checkout into /tmp/kf; KF_WHEELS names more wheel
# folders for it (the optional peers: KF_WHEELS=".whl-baselines"). Elsewhere it uses the active environment
# (`pip install -e ".[test]"`). Written under $OUT (default runs/gpu-tests, git-ignored): host_setup.log,
# pytest.log and junit.xml. Exit status: pytest's, or 2 if the host setup failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-runs/gpu-tests}"
mkdir -p "$out"

if [ -d .whl ] || [ -d .gpu-a ] || [ -f /tmp/kf-wheels/installed ]; then
  # shellcheck disable=SC1091,SC2086  # KF_WHEELS is a list of folders
  # (a sourced script given no arguments would see this script's pytest arguments as its own)
  pytest_args=("$@"); set -- ${KF_WHEELS:-}
  if ! source tests/gpu/host_setup.sh "$@" > "$out/host_setup.log" 2>&1; then
    echo "tests/gpu/run.sh: host setup failed; see $out/host_setup.log" >&2
    tail -n 20 "$out/host_setup.log" >&2
    exit 2
  fi
  tail -n 1 "$out/host_setup.log"
  set -- "${pytest_args[@]}"
fi

targets=(tests/gpu)   # unless the arguments name test files or folders themselves
for arg in "$@"; do
  case "$arg" in tests/*) targets=() ;; esac
done
python3 -m pytest -m gpu --gpu "${targets[@]}" -q -rfE -p no:cacheprovider --junitxml "$out/junit.xml" "$@" \
  2>&1 | tee "$out/pytest.log"
exit "${PIPESTATUS[0]}"
