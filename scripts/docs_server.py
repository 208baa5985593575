"""A gradserve-server started for a documentation script or test, and stopped again.

Imported by scripts/generate_ops_md and tests/docs/*.py (standard library only). The server
listens on 127.0.0.1 port 0 (a free port the kernel picks) and logs
"listening on 127.0.0.1:PORT" at start, which is read from its stderr.

Usage (as a module):
    with DocServer("build/release/server/gradserve-server") as server:
        print(server.address)  # "127.0.0.1:PORT"

Errors: RuntimeError quoting the server's last log lines when it does not report its port
within 30 s or exits first.
"""

import collections
import re
import subprocess
import threading
import time

_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


class DocServer:
    """A gradserve-server subprocess on 127.0.0.1; a context manager."""

    def __init__(self, binary, *flags):
        self._binary = binary
        self._flags = list(flags)
        self._proc = None
        self._log = collections.deque(maxlen=50)
        self._port = threading.Event()
        self.address = None

    def __enter__(self):
        self._proc = subprocess.Popen(
            [self._binary, "--listen=127.0.0.1:0", "--grace_period=1s"] + self._flags,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 30
        while not self._port.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"{self._binary} did not start:\n" + "\n".join(self._log))
        return self

    def _drain(self):
        for line in self._proc.stderr:
            self._log.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not self._port.is_set():
                self.address = f"127.0.0.1:{match.group(1)}"
                self._port.set()

    def __exit__(self, *unused):
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return False
