# Source this on an offline GPU host (the device machine), from the repository root, before GPU tests or runs:
#   source tests/gpu/host_setup.sh
# It installs the carried wheelhouse (.whl: deap, mlflow; see README "GPU host"), then this project and any
# plugin packages under tests/plugins/ into /tmp/kf, without build isolation and without an index.
set -e
source .whl/install-wheels.sh .whl ${KF_EXTRA_WHEELS:-}
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/kf . tests/plugins/*/ 2>&1 \
  | grep -v "^WARNING: Target directory" || true
export PYTHONPATH="/tmp/kf:${PYTHONPATH}"
export PATH="/tmp/kf/bin:${PATH}"
export PYTHONUNBUFFERED=1
set +e
python3 -c "import kernel_factory.evo.cli, deap, mlflow, torch; print('host ready: torch', torch.__version__, \
  'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
