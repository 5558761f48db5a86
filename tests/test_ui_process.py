"""`kernel-factory ui`'s process handling: a bad or taken port is one clear line before anything else and a
non-zero exit; a port that a just-stopped UI left in TIME_WAIT is free; the server listens on 127.0.0.1 unless
told otherwise, and the command says it listens only once a connect succeeds; SIGTERM or Ctrl-C stops the server's
whole process tree (the MLflow CLI starts a uvicorn child), so no orphan keeps the port, with no run-resume hint."""
import errno
import io
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kernel_factory.evo.tools import cli, ui

# A stand-in server: a parent that starts a child (as `mlflow ui` starts uvicorn), listens on the port, and writes
# both pids.
TREE = textwrap.dedent("""
    import os, socket, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(sys.argv[2])))
    server.listen()
    open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(600)
""")
# A stand-in server that listens only when told (SIGUSR1), as MLflow's listens seconds after it starts.
GATED = textwrap.dedent("""
    import os, signal, socket, sys, time
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    open(sys.argv[1], "w").write(str(os.getpid()))
    signal.sigwait([signal.SIGUSR1])
    server = socket.socket()
    server.bind(("127.0.0.1", int(sys.argv[2])))
    server.listen()
    time.sleep(600)
""")
# `kernel-factory ui` as a user runs it, with the stand-in server for MLflow's and a start link for its store.
DRIVER = textwrap.dedent("""
    import sys
    from kernel_factory.evo.observers import mlflow_store
    from kernel_factory.evo.tools import cli
    tree, pids, store, port = sys.argv[1:5]
    mlflow_store.ui_command = lambda *args, **kw: [sys.executable, "-c", tree, pids, port]
    mlflow_store.ui_links = lambda store, base: [("rmsnorm_fwd", base + "/#/experiments/1/runs")]
    sys.exit(cli.main(["ui", "--store", store, "--port", port]))
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
    pids_file, store, port = tmp_path / "pids", tmp_path / "mlflow.db", free_port()
    store.write_bytes(b"")
    # SIGINT as a terminal gives it (a shell's background job inherits it ignored, and Python then leaves it so)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, TREE, str(pids_file), str(store), str(port)],
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    while not any("listening on" in line for line in seen):   # the command says so once the server listens
        seen.append(proc.stderr.readline())
        assert seen[-1] or proc.poll() is None, "".join(seen)
    assert ui.listens("127.0.0.1", port)
    server, child = map(int, pids_file.read_text().split())
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=60)
    err = "".join(seen) + rest
    assert proc.returncode == code, err
    assert "listening on 127.0.0.1 only" in err and "Traceback" not in err
    assert f"MLflow UI on 127.0.0.1:{port} stopped" in err and "resume" not in err   # no run to resume
    assert not alive(server) and not alive(child), "an orphan of the server survived"


def test_it_says_listening_only_once_the_port_accepts(tmp_path):
    pid_file, port, out = tmp_path / "pid", free_port(), io.StringIO()
    codes = []
    serving = threading.Thread(target=lambda: codes.append(
        ui.serve([sys.executable, "-c", GATED, str(pid_file), str(port)], "127.0.0.1", port, out=out)))
    serving.start()
    deadline = time.monotonic() + 120
    while not (pid_file.is_file() and pid_file.read_text()):
        assert serving.is_alive() and time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    server = int(pid_file.read_text())
    try:
        assert "listening" not in out.getvalue() and not ui.listens("127.0.0.1", port)   # started, not listening
        os.kill(server, signal.SIGUSR1)
        while "listening" not in out.getvalue():
            assert serving.is_alive() and time.monotonic() < deadline, out.getvalue()
            time.sleep(0.05)
        assert ui.listens("127.0.0.1", port)
    finally:
        os.killpg(server, signal.SIGTERM)
        serving.join(timeout=60)
    assert codes == [-signal.SIGTERM], out.getvalue()


def test_a_server_that_ends_or_never_listens_is_one_line(tmp_path):
    out = io.StringIO()
    assert ui.serve([sys.executable, "-c", "import sys; sys.exit(3)"], "127.0.0.1", free_port(), out=out) == 3
    assert "the MLflow UI ended (exit code 3) before it listened" in out.getvalue()
    out, pid_file, port = io.StringIO(), tmp_path / "pid", free_port()
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    assert ui.serve([sys.executable, "-c", script, str(pid_file)], "127.0.0.1", port, out=out, deadline_s=5) == 1
    assert f"did not listen on 127.0.0.1:{port} within 5 s; stopped it" in out.getvalue()
    assert len(out.getvalue().splitlines()) == 1 and not alive(int(pid_file.read_text()))


def test_a_port_a_stopped_server_left_in_time_wait_is_free():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn sets it
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()     # the server closes first (as a stopping server does): its side waits in TIME_WAIT
        client.close()
    with socket.socket() as plain, pytest.raises(OSError) as taken:
        plain.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE   # nothing listens, yet a bind without SO_REUSEADDR is refused
    ui.check_port("127.0.0.1", port)


def test_a_port_in_use_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["ui", "--store", str(tmp_path / "mlflow.db"), "--port", str(port)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "Traceback" not in err


def test_a_bad_port_is_the_only_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"")
    assert cli.main(["ui", "--store", str(tmp_path / "mlflow.db"), "--port", "99999"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert err == ["kernel-factory: error: --port must be between 1 and 65535, got 99999"]


def test_it_binds_loopback_unless_told_otherwise(tmp_path):
    from kernel_factory.evo.observers.mlflow_store import ui_command
    args = cli.parser().parse_args(["ui"])
    assert args.host == "127.0.0.1"
    argv = ui_command(tmp_path / "m.db", tmp_path / "a", host=args.host, port=5000)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(cli.ConfigError, match="--port must be between 1 and 65535"):
        ui.check_port("127.0.0.1", 70000)


def test_the_screenshots_command_says_what_it_lacks_in_one_line(tmp_path, capsys):
    from kernel_factory.evo.tools import screenshots
    missing = tmp_path / "no-such.yaml"
    assert screenshots.main([str(tmp_path / "img"), "--config", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"screenshots: error: no config at {str(missing)!r}: run from the repository's root or pass --config"]
    assert not (tmp_path / "img").exists()
