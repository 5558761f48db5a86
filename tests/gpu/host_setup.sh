# Source this on an offline GPU host (the device machine), from the repository root, before GPU tests, runs or
# benches:
#   source tests/gpu/host_setup.sh [BUNDLE_DIR ...]      e.g. .gpu-a, then .gpu-b, then .gpu-c (tests/gpu/bundles.sh)
# Each call collects the wheels and wheel parts of the folders it is given into /tmp/kf-wheels (what earlier calls
# on the same warm host brought is kept), joins a split wheel once all its parts are there and its SHA-256 matches,
# installs every wheel into /tmp/site whenever a new one arrived (in one pip call: the cutlass-dsl wheels share a
# top-level folder), then this checkout, the plugin packages under tests/plugins/ and any plugin folder given into
# /tmp/kf. INT21's RMSNorm-H100 source, carried as .int21/, goes on PYTHONPATH (its first import builds it with
# nvcc; start `tests/gpu/host_setup.sh`'s int21_build early). Its last step imports every peer named in KF_PEERS (default:
# quack liger int21) and fails, naming each peer and the first line of its error, unless KF_PEERS is set to
# fewer; a peer whose wheels have not all arrived yet is named as such.
# The older layout (.whl/ with install-wheels.sh) still works: `source tests/gpu/host_setup.sh .whl-baselines`.
# A folder with a pyproject.toml among the arguments is a problem plugin package (one outside this repository,
# carried beside it): it is installed with the plugins under tests/plugins/, e.g.
#   source tests/gpu/host_setup.sh .gpu-a ../kf_my_op
_kf_dirs=()
_kf_plugins=()
for _d in "$@"; do
  if [ -f "$_d/pyproject.toml" ]; then _kf_plugins+=("$_d"); else _kf_dirs+=("$_d"); fi
done
[ -d .whl ] && _kf_dirs=(.whl "${_kf_dirs[@]}")
mkdir -p /tmp/kf-wheels/parts /tmp/kf-wheels/whl
touch /tmp/kf-wheels/installed
for _d in "${_kf_dirs[@]}"; do
  [ -d "$_d" ] || { echo "host_setup: no folder $_d" >&2; return 2; }
  cp -f "$_d"/*.whl /tmp/kf-wheels/whl/ 2>/dev/null || true
  cp -f "$_d"/*.part-* /tmp/kf-wheels/parts/ 2>/dev/null || true
  cp -f "$_d"/*.part.* /tmp/kf-wheels/parts/ 2>/dev/null || true
  [ -f "$_d/SHA256SUMS" ] && cat "$_d/SHA256SUMS" >> /tmp/kf-wheels/SHA256SUMS
done
# Split wheels: NAME.whl.part-K-of-N (bundles.sh), or wheelhouse.sh's NAME.whl.part.aa, .ab, ... (whole when its
# last part is under 56 MiB)
for _p in /tmp/kf-wheels/parts/*.part-1-of-*; do
  [ -e "$_p" ] || continue
  _w="${_p%.part-1-of-*}"; _n="${_p##*-of-}"; _name="$(basename "$_w")"
  [ -e "/tmp/kf-wheels/whl/$_name" ] && continue
  _have=$(ls "$_w".part-*-of-"$_n" 2>/dev/null | wc -l)
  if [ "$_have" -lt "$_n" ]; then
    echo "host_setup: $_name has $_have of $_n parts; it installs when the rest arrive" >&2; continue
  fi
  for _k in $(seq 1 "$_n"); do cat "$_w.part-$_k-of-$_n"; done > "/tmp/kf-wheels/$_name"
  _want=$(grep "  $_name\$" /tmp/kf-wheels/SHA256SUMS 2>/dev/null | head -1 | cut -d' ' -f1)
  if [ -n "$_want" ] && [ "$(sha256sum "/tmp/kf-wheels/$_name" | cut -d' ' -f1)" != "$_want" ]; then
    echo "host_setup: $_name joined from its parts does not match its SHA-256; not installed" >&2
    rm -f "/tmp/kf-wheels/$_name"; return 2
  fi
  mv "/tmp/kf-wheels/$_name" /tmp/kf-wheels/whl/
done
for _p in /tmp/kf-wheels/parts/*.part.aa; do
  [ -e "$_p" ] || continue
  _w="${_p%.part.aa}"; _name="$(basename "$_w")"; _last="$(ls "$_w".part.* | tail -1)"
  if [ "$(stat -c %s "$_last")" -lt $((56 * 2**20)) ] && [ ! -e "/tmp/kf-wheels/whl/$_name" ]; then
    cat "$_w".part.* > "/tmp/kf-wheels/whl/$_name"
  fi
done
_new=0
for _w in /tmp/kf-wheels/whl/*.whl; do
  [ -e "$_w" ] || continue
  grep -qxF "$(basename "$_w")" /tmp/kf-wheels/installed || _new=$((_new + 1))
done
if [ "$_new" -gt 0 ]; then
  rm -rf /tmp/site && mkdir -p /tmp/site && : > /tmp/kf-wheels/installed
  python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/kf-wheels/whl/*.whl 2>&1 | grep -v "^WARNING: Target" \
    ; ls /tmp/kf-wheels/whl/*.whl | xargs -n1 basename >> /tmp/kf-wheels/installed
fi
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
_extra="$(python3 -c 'import site,sys; b=set(sys.path); site.addsitedir("/tmp/site"); print(":".join(p for p in sys.path if p not in b))')"
[ -n "$_extra" ] && export PYTHONPATH="$PYTHONPATH:$_extra"
echo "host_setup: $_new new wheel(s), $(wc -l < /tmp/kf-wheels/installed) installed in /tmp/site"

kf_pip() { python3 -m pip install -q --root-user-action=ignore --no-deps --no-build-isolation --no-index --upgrade --target /tmp/kf "$1" 2>&1 \
  | grep -v "^WARNING: Target" || true; }
kf_pip .
for plugin in tests/plugins/*/pyproject.toml; do kf_pip "$(dirname "$plugin")"; done
for plugin in "${_kf_plugins[@]}"; do kf_pip "$plugin"; echo "host_setup: plugin $plugin installed"; done
export PYTHONPATH="/tmp/kf:${PYTHONPATH}"
[ -d .int21/rmsnorm ] && export PYTHONPATH="$PWD/.int21:${PYTHONPATH}"
export PATH="/tmp/kf/bin:${PATH}"
export PYTHONUNBUFFERED=1
python3 -c "import kernel_factory.evo.tools.cli, deap, mlflow, torch; print('host ready: torch', torch.__version__, \
  'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))" || return 2

# INT21 builds with nvcc on its first import (minutes): int21_build starts that in the background, in a session of
# its own so that it outlives this device call; int21_wait waits for it (at most $1 seconds).
int21_build() {
  [ -d .int21/rmsnorm ] || { echo "host_setup: no .int21/ carried" >&2; return 2; }
  (cd .int21 && setsid nohup python3 -c "import rmsnorm._extension as e; e.get_extension(); print('built')" \
     > /tmp/int21_build.log 2>&1 &)
}
int21_wait() {
  for _ in $(seq "${1:-300}"); do grep -q "^built" /tmp/int21_build.log 2>/dev/null && return 0; sleep 1; done
  echo "host_setup: INT21 not built within ${1:-300} s:" >&2; tail -n 5 /tmp/int21_build.log >&2; return 2
}

# FLA's Triton kernels compile (and autotune) on their first call, minutes for chunk_kda's on the KDA workloads:
# fla_warm makes those calls in the background (tests/gpu/fla_warm.py), fla_wait waits for them (at most $1 s).
fla_warm() {
  setsid nohup python3 tests/gpu/fla_warm.py > /tmp/fla_warm.log 2>&1 &
}
fla_wait() {
  for _ in $(seq "${1:-300}"); do grep -q "^warmed" /tmp/fla_warm.log 2>/dev/null && return 0; sleep 1; done
  echo "host_setup: FLA not warmed within ${1:-300} s:" >&2; tail -n 5 /tmp/fla_warm.log >&2; return 2
}

# Every peer named in KF_PEERS must import; each failure is one line, and the setup fails.
kf_peers() {
  python3 - ${KF_PEERS-quack liger int21} <<'EOF'
import importlib, sys
modules = {"quack": "quack.rmsnorm", "liger": "liger_kernel.ops.rms_norm", "int21": "rmsnorm"}
bad = []
for peer in sys.argv[1:]:
    try:
        importlib.import_module(modules[peer])
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        bad.append(f"peer {peer} ({modules[peer]}) does not import: {type(exc).__name__}: {first[:300]}")
print("\n".join(bad) or f"host_setup: peers import: {', '.join(sys.argv[1:]) or 'none asked'}",
      file=sys.stderr if bad else sys.stdout)
sys.exit(2 if bad else 0)
EOF
}
kf_peers || return 2
