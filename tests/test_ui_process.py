"""`kernel-factory ui`'s process handling: a port in use is one clear line and a non-zero exit; the server listens
on 127.0.0.1 unless told otherwise and says so; SIGTERM or Ctrl-C stops the server's whole process tree (the MLflow
CLI starts a uvicorn child), so no orphan keeps the port."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from kernel_factory.evo.tools import cli, ui

# A stand-in server: a parent that starts a child (as `mlflow ui` starts uvicorn) and writes both pids.
TREE = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(f"{__import__('os').getpid()} {child.pid}")
    time.sleep(600)
""")
# Runs ui.serve as the CLI does: SIGTERM raises exits.Terminated inside it.
DRIVER = textwrap.dedent("""
    import sys
    from kernel_factory.evo.tools import cli, exits, ui
    cli.setup_logging()
    try:
        with exits.sigterm_as_interrupt():
            ui.serve([sys.executable, "-c", sys.argv[1], sys.argv[2]], "127.0.0.1", int(sys.argv[3]))
    except KeyboardInterrupt as exc:
        sys.exit(exits.interrupt_code(exc))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie (exited, not yet reaped by its parent) counts as gone
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_whole_server_tree(tmp_path, sig, code):
    pids_file = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, TREE, str(pids_file), str(free_port())],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (pids_file.is_file() and len(pids_file.read_text().split()) == 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    server, child = map(int, pids_file.read_text().split())
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "listening on 127.0.0.1 only" in err and "Traceback" not in err
    assert not alive(server) and not alive(child), "an orphan of the server survived"


def test_a_port_in_use_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["ui", "--store", str(tmp_path / "mlflow.db"), "--port", str(port)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "Traceback" not in err


def test_it_binds_loopback_unless_told_otherwise(tmp_path):
    from kernel_factory.evo.observers.mlflow_store import ui_command
    args = cli._parser().parse_args(["ui"])
    assert args.host == "127.0.0.1"
    argv = ui_command(tmp_path / "m.db", tmp_path / "a", host=args.host, port=5000)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(cli.ConfigError, match="--port must be between 1 and 65535"):
        ui.check_port("127.0.0.1", 70000)
