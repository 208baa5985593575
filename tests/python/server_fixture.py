"""Starts a real gradserve-server for the Python tests and stops it again.

The server binary comes from the environment variable GRADSERVE_SERVER (CTest passes
$<TARGET_FILE:gradserve-server>), else build/py/server/gradserve-server in the repository. It
listens on 127.0.0.1 port 0, i.e. a free port the kernel picks, which the server logs at start
("listening on 127.0.0.1:PORT"); the fixture reads it from stderr. The generated Python stubs
are found through GRADSERVE_PY_STUBS (see client/python/gradserve/__init__.py).

Importing this module puts client/python on sys.path, so tests can `import gradserve`.

Errors: RuntimeError naming the binary and quoting its log when it is missing, exits, or does
not report its port within START_TIMEOUT_S. Threading: one ServerProcess per test class; a
daemon thread drains the server's stderr (kept, last lines only, for error messages).
"""

import collections
import os
import re
import subprocess
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import gradserve  # noqa: E402

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def server_binary():
    """The gradserve-server executable to test, or RuntimeError if there is none."""
    path = os.environ.get("GRADSERVE_SERVER") or os.path.join(
        REPO, "build", "py", "server", "gradserve-server")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"gradserve-server not found at {path}; build it and set "
                           "GRADSERVE_SERVER")
    return path


class ServerProcess:
    """A gradserve-server subprocess on 127.0.0.1; use as a context manager or start()/stop().

    extra_flags: more command-line flags (limits, worker threads, TLS); preexec_fn, if given,
    runs in the child before the server is executed. secrets: strings (tokens) that must never
    appear in the server's log; every line is checked, and leaked_secrets() says which did
    (never the lines themselves). address is "127.0.0.1:PORT" once started.
    """

    def __init__(self, *extra_flags, preexec_fn=None, secrets=()):
        self._flags = list(extra_flags)
        self._preexec_fn = preexec_fn  # runs in the child before exec (e.g. joins a cgroup)
        self._secrets = [s for s in secrets if s]
        self._leaked = set()  # indices into _secrets
        self._proc = None
        self._log = collections.deque(maxlen=200)
        self._port_seen = threading.Event()
        self._drainer = None
        self.address = None

    def start(self):
        binary = server_binary()
        self._proc = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0", "--grace_period=1s"] + self._flags,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, preexec_fn=self._preexec_fn)
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._port_seen.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{binary} did not start (exit {self._proc.returncode}):\n"
                                   + self.log())
        return self

    def _drain(self):
        for line in self._proc.stderr:
            self._leaked.update(i for i, s in enumerate(self._secrets) if s in line)
            self._log.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and self.address is None:
                self.address = f"127.0.0.1:{match.group(1)}"
                self._port_seen.set()

    def log(self):
        """The server's last log lines."""
        return "\n".join(self._log)

    def leaked_secrets(self):
        """How many of the secrets were seen in the server's log so far (0: none); the
        secrets themselves are not returned, so that a failing test does not print them."""
        return len(self._leaked)

    def alive(self):
        return self._proc is not None and self._proc.poll() is None

    def send_signal(self, sig):
        """Sends sig (signal.SIGKILL, signal.SIGTERM) to the server, without waiting."""
        self._proc.send_signal(sig)

    def stop(self):
        """Stops the server: SIGTERM, then SIGKILL if it has not exited in STOP_TIMEOUT_S."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(STOP_TIMEOUT_S)
        # The drain thread reads to the end of the pipe, which the exit closed; the pipe is
        # closed once it is done (an open one is a ResourceWarning when Python exits).
        if self._drainer is not None:
            self._drainer.join(STOP_TIMEOUT_S)
            if not self._drainer.is_alive() and not self._proc.stderr.closed:
                self._proc.stderr.close()

    def client(self, timeout=30, **security):
        """A gradserve.Client connected to this server; security: Client's TLS and token
        arguments (tls_ca, tls_cert, tls_key, token, token_file)."""
        c = gradserve.Client(self.address, timeout=timeout, **security)
        c.wait_ready(START_TIMEOUT_S)
        return c

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
