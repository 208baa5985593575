"""bench/echo_server, as bench/run uses it: the load tester's echo scenario gets answers, and
--work_us=N makes every call take at least N microseconds (the server busy-waits before it
answers); a negative --work_us, and any bad flag, is refused with exit status 2.

Usage: echo_server_test.py ECHO_SERVER GRADSERVE

Starts each echo server on 127.0.0.1 port 0 and reads the port from its first line
("listening on 127.0.0.1:PORT"); kills it at the end. Exits non-zero with a message on failure.
"""

import json
import re
import subprocess
import sys

WORK_US = 20000  # far above a loopback call's own latency, so the bound cannot pass by chance


def load(gradserve, port, requests):
    out = subprocess.run(
        [gradserve, "load", f"--target=127.0.0.1:{port}", "--scenario=echo",
         f"--requests={requests}", "--warmup=1", "--format=json", "--quiet"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def serve(echo_server, *flags):
    process = subprocess.Popen([echo_server, "--listen=127.0.0.1:0", *flags],
                               stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    match = re.match(r"listening on 127\.0\.0\.1:(\d+)", line)
    if not match:
        process.kill()
        sys.exit(f"echo_server did not report its port: {line!r}")
    return process, int(match.group(1))


def main():
    echo_server, gradserve = sys.argv[1:3]
    # Bad flags are usage errors, exit 2, named (Note [Flags checked first]); names may be
    # written with hyphens (Note [Flag spelling]).
    for flag, named in (("--work_us=-1", "--work_us"), ("--work-us=-1", "--work_us"),
                        ("--work_us=abc", "'work_us'"), ("--no-such-flag", "--no-such-flag")):
        refused = subprocess.run([echo_server, flag], capture_output=True, text=True,
                                 timeout=30)
        if refused.returncode != 2 or named not in refused.stderr:
            sys.exit(f"{flag}: exit {refused.returncode}, stderr {refused.stderr!r}")

    for flags, at_least_us in (((), 0), ((f"--work_us={WORK_US}",), WORK_US)):
        process, port = serve(echo_server, *flags)
        try:
            result = load(gradserve, port, requests=5)
        finally:
            process.kill()
            process.wait()
        if result["count"] != 5 or result["errors"]:
            sys.exit(f"{flags}: {result['count']} calls, errors {result['errors']}")
        fastest = result["latency_us"]["min"]
        if fastest < at_least_us:
            sys.exit(f"{flags}: the fastest call took {fastest} us, under {at_least_us} us")
        print(f"echo_server {' '.join(flags) or '(no flags)'}: 5 calls, fastest {fastest} us")


if __name__ == "__main__":
    main()
