"""Type-checks the gradserve Python package (client/python/gradserve, declared typed by
py.typed) and a typed use of it (types_usage.py) with mypy, under the package's configuration
(client/python/pyproject.toml's [tool.mypy]: every function annotated). mypy is Debian's
package mypy (scripts/lib/setup.sh installs it); without it the test is SKIPPED (exit 77).

Run: /usr/bin/python3 tests/python/test_types.py
"""

import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
TIMEOUT_S = 240
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.join(HERE, "..", "..", "client", "python")


def mypy_command():
    """The command that runs mypy, or None: mypy on the PATH, else this Python's mypy module."""
    found = shutil.which("mypy")
    if found:
        return [found]
    probe = subprocess.run([sys.executable, "-c", "import mypy"], capture_output=True)
    return [sys.executable, "-m", "mypy"] if probe.returncode == 0 else None


def main():
    command = mypy_command()
    if command is None:
        print("SKIP: mypy not found; apt-get install mypy")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="gradserve-mypy-") as cache:
        args = command + ["--config-file", "pyproject.toml", "--cache-dir", cache,
                          "gradserve", os.path.join(HERE, "types_usage.py")]
        try:
            run = subprocess.run(args, cwd=PACKAGE_ROOT, capture_output=True, text=True,
                                 timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"FAIL: mypy took over {TIMEOUT_S} s", file=sys.stderr)
            return 1
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        print(f"FAIL: {' '.join(args)} exited {run.returncode}", file=sys.stderr)
        return 1
    print("python types: the gradserve package and types_usage.py check with mypy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
