# Source this on an offline GPU host (the device machine), from the repository root, before GPU tests or runs:
#   source tests/gpu/host_setup.sh [MORE WHEEL DIRS]   (e.g. .whl-baselines and split parts of a large wheel)
# A later call on the same warm host need not carry .whl again (its wheels stay installed under /tmp).
# It installs the carried wheelhouse (.whl: deap, mlflow; see docs/gpu-host.md), then this project and the
# plugin packages under tests/plugins/ into /tmp/kf, without build isolation and without an index.
if [ -f .whl/install-wheels.sh ]; then
  source .whl/install-wheels.sh .whl "$@"
else   # a later call on the same warm host: the wheelhouse was installed, and the script kept in /tmp
  source /tmp/install-wheels.sh "$@"
fi
kf_pip() { python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/kf "$1" 2>&1 \
  | grep -v "^WARNING: Target" || true; }
kf_pip .
for plugin in tests/plugins/*/pyproject.toml; do kf_pip "$(dirname "$plugin")"; done
export PYTHONPATH="/tmp/kf:${PYTHONPATH}"
export PATH="/tmp/kf/bin:${PATH}"
export PYTHONUNBUFFERED=1
python3 -c "import kernel_factory.evo.tools.cli, deap, mlflow, torch; print('host ready: torch', torch.__version__, \
  'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
