#!/usr/bin/python3
"""The doc test: runs the shell commands of README.md and docs/*.md against a real server.

Every fenced block marked ```sh (or bash, shell) in README.md and docs/*.md (not docs/history/,
which keeps past runs as they were) is a command a reader may type. This test runs each one,
in the order of its page, against a gradserve-server it starts on a free 127.0.0.1 port, and
fails naming the page, line and output of the first block that fails. Conventions (written
for authors in docs/design.md, "Documentation"):

- Commands run with bash -e -o pipefail from a scratch directory that holds the repository's
  top-level folders (as links) and build/release (the build tree under test), so they are
  written as from a checkout's root. `gradserve` and `gradserve-server` are on the PATH.
  `127.0.0.1:50051`, the default address, is replaced by the test server's address.
- A ```python block whose first line is `# NAME.py` is written to the scratch directory as
  NAME.py before the page's commands run, so a command may run it.
- `gradserve` (on the PATH and as build/release/client/gradserve) gets --target=ADDRESS of
  the test's server unless the command gives one.
- A block preceded by `<!-- doc-test: exit N REASON -->` must exit with status N (absl's
  `--help` exits 1).
- A block preceded by the line `<!-- doc-test: skip REASON -->` is not run (it needs root,
  Docker, Kubernetes, a GPU, minutes, or a server with other flags). Its commands are still
  checked: a project program (a path in the repository, `gradserve`, `gradserve-server`) must
  exist, and every `--flag` it is given must be one its `--help` lists; other programs
  (kubectl, docker, openssl) are only listed.
- Output shown for comparison goes in a plain ``` block, which is never run.
- Every relative link of a page must lead to a file that exists, and a `#anchor` into a
  Markdown page to one of its headings (as GitHub makes anchors from headings).

Usage: doc_commands_test.py --server PATH --cli PATH --build DIR [--list] [--only FILE]
  --server, --cli  the binaries under test; --build the build tree they come from
  --list           print the blocks and what would be done with each, run nothing
  --only FILE      only this page (e.g. README.md)
Exits 0 when every block runs and every check passes, 1 otherwise.
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from docs_server import DocServer  # noqa: E402

SHELL_LANGS = ("sh", "bash", "shell")
SKIP = re.compile(r"^<!-- doc-test: skip (.+) -->$")
EXIT = re.compile(r"^<!-- doc-test: exit (\d+)\b.* -->$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
BLOCK_TIMEOUT_S = 90
DEFAULT_ADDRESS = "127.0.0.1:50051"


class Block:
    def __init__(self, path, line, lang, text, skip, exit_status):
        self.path, self.line, self.lang, self.text, self.skip = path, line, lang, text, skip
        self.exit_status = exit_status

    def where(self):
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


def pages():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def read_blocks(path):
    """The fenced blocks of one page, in order."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang = match.group(1), match.group(2)
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j])
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = lines[k].strip() if k >= 0 else ""
        skip, exit_status = SKIP.match(marker), EXIT.match(marker)
        blocks.append(Block(path, i + 1, lang, body, skip.group(1) if skip else None,
                            int(exit_status.group(1)) if exit_status else 0))
        i = j + 1
    return blocks


def commands(text):
    """The logical command lines of a block: continuations joined, heredoc bodies dropped."""
    out, current, heredoc_end = [], "", None
    for line in text.split("\n"):
        if heredoc_end is not None:
            if line.strip() == heredoc_end:
                heredoc_end = None
            continue
        current += line
        if current.rstrip().endswith("\\"):
            current = current.rstrip()[:-1] + " "
            continue
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", current)
        if heredoc:
            heredoc_end = heredoc.group(1)
        if current.strip():
            out.append(current.strip())
        current = ""
    return out


def simple_commands(line):
    """Splits a command line into its simple commands' words (pipes, &&, ; apart)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    result, current = [], []
    for word in words:
        if word in ("|", "||", "&&", ";"):
            result.append(current)
            current = []
        else:
            current.append(word)
    result.append(current)
    out = []
    for cmd in result:
        env = {}
        while cmd and (cmd[0] in ("sudo", "exec", "time") or re.match(r"^\w+=", cmd[0])):
            if "=" in cmd[0]:
                name, value = cmd[0].split("=", 1)
                env[name] = value
            cmd = cmd[1:]
        if cmd:
            out.append((env, cmd))
    return out


def flags_of(words):
    """The --flag names given before a bare `--`, normalized to underscores."""
    names = []
    for word in words:
        if word == "--":
            break
        match = re.match(r"^--([A-Za-z][\w-]*)", word)
        if match:
            names.append(match.group(1).replace("-", "_"))
    return names


def help_lists(help_text, names):
    """The names that help_text does not list as --name."""
    text = help_text.replace("-", "_")
    return [n for n in names if not re.search(r"__" + re.escape(n) + r"\b", text)]


class Checker:
    """Checks the commands of a skipped block: programs exist, flags are in their --help."""

    def __init__(self, server, cli, scratch):
        self._server, self._cli, self._scratch = server, cli, scratch
        self._help = {}
        self.external = set()

    def _help_of(self, argv, env=None):
        key = tuple(argv)
        if key not in self._help:
            try:
                r = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30,
                                   cwd=self._scratch, stdin=subprocess.DEVNULL,
                                   env=dict(os.environ, **(env or {})))
                self._help[key] = r.stdout + r.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                self._help[key] = f"<{e}>"
        return self._help[key]

    def check(self, env, words):
        """A list of problems with one simple command (empty if none)."""
        program, args = words[0], words[1:]
        base = os.path.basename(program)
        if base == "gradserve":
            sub = [a for a in args if not a.startswith("-")][:1]
            if not sub:
                return []
            text = self._help_of([self._cli] + sub)
            if "unknown command" in text:
                return [f"gradserve has no command '{sub[0]}'"]
            missing = help_lists(text, flags_of(args))
            return [f"gradserve {sub[0]} --help lists no --{n}" for n in missing]
        if base == "gradserve-server":
            missing = help_lists(self._help_of([self._server, "--helpfull"]), flags_of(args))
            return [f"gradserve-server --helpfull lists no --{n}" for n in missing]
        if base in ("node", "python3", "python") and args and not args[0].startswith("-"):
            program, args = args[0], args[1:]
        if "/" in program and not program.startswith("/") and not program.startswith("$"):
            path = os.path.join(ROOT, program)
            if program.startswith("build/"):
                return []  # a build output: the doc test's own build tree may lack it
            if not os.path.exists(path):
                return [f"{program} does not exist"]
            flags = flags_of(args)
            if not flags or program.endswith(".js"):
                return []
            argv = ["/usr/bin/python3", path] if program.endswith(".py") else [path]
            missing = help_lists(self._help_of(argv, env), flags)
            return [f"{program} --help lists no --{n}" for n in missing]
        self.external.add(base)
        return []


_WRAPPER = """#!/bin/bash
# The doc test's gradserve: the real one, with the test's server as the default --target.
real={real}
case "$1" in
  ping|grad|info|health|load|session)
    for arg in "$@"; do
      case "$arg" in --target|--target=*) exec "$real" "$@" ;; esac
    done
    exec "$real" "$1" --target={address} "${{@:2}}" ;;
esac
exec "$real" "$@"
"""


def link_tree(source, target, skip=()):
    """target/ with a link to each entry of source/ but those in skip."""
    os.makedirs(target, exist_ok=True)
    for entry in os.listdir(source):
        if entry not in skip:
            os.symlink(os.path.join(source, entry), os.path.join(target, entry))


def _anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    found, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(_anchor(line.lstrip("#")))
    return found


def broken_links(page):
    """Problems with the relative links of one page."""
    problems = []
    text = open(page, encoding="utf-8").read()
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        link = match.group(1)
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        where = os.path.relpath(page, ROOT)
        if not os.path.exists(target):
            problems.append(f"{where}: link to {link}: no such file")
        elif anchor and target.endswith(".md") and anchor not in _anchors(target):
            problems.append(f"{where}: link to {link}: no such heading")
    return problems


def scratch_dir(build, cli, server, address):
    """A directory that looks like a checkout whose build/release is the build under test.

    Its build/release/client/gradserve (and the gradserve on the PATH, in .bin/) is a wrapper
    that gives the real one --target=ADDRESS unless the command gives a --target.
    """
    scratch = tempfile.mkdtemp(prefix="gradserve-doctest-")
    link_tree(ROOT, scratch, skip=("build", ".git"))
    release = os.path.join(scratch, "build", "release")
    link_tree(os.path.abspath(build), release, skip=("client",))
    client_dir = os.path.join(os.path.abspath(build), "client")
    if os.path.isdir(client_dir):
        link_tree(client_dir, os.path.join(release, "client"), skip=("gradserve",))
    bindir = os.path.join(scratch, ".bin")
    os.makedirs(bindir)
    wrapper = _WRAPPER.format(real=shlex.quote(os.path.abspath(cli)), address=address)
    for path in (os.path.join(release, "client", "gradserve"), os.path.join(bindir, "gradserve")):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(wrapper)
        os.chmod(path, 0o755)
    os.symlink(os.path.abspath(server), os.path.join(bindir, "gradserve-server"))
    return scratch, bindir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--only")
    args = parser.parse_args()

    selected = [p for p in pages() if not args.only or os.path.relpath(p, ROOT) == args.only]
    by_page = [(p, read_blocks(p)) for p in selected]
    if args.list:
        for page, blocks in by_page:
            for b in blocks:
                if b.lang in SHELL_LANGS:
                    print(f"{b.where()}: {'skip: ' + b.skip if b.skip else 'run'}")
        return 0

    failures, ran, checked = [], 0, 0
    for page, _ in by_page:
        failures += broken_links(page)
    start = time.monotonic()
    scratch = None
    try:
        with DocServer(args.server) as server:
            scratch, bindir = scratch_dir(args.build, args.cli, args.server, server.address)
            checker = Checker(args.server, args.cli, scratch)
            env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                       PYTHONDONTWRITEBYTECODE="1")
            for page, blocks in by_page:
                for b in blocks:
                    first = b.text.split("\n", 1)[0].strip()
                    if b.lang == "python" and re.match(r"^# [\w.-]+\.py$", first):
                        with open(os.path.join(scratch, first[2:]), "w") as f:
                            f.write(b.text.replace(DEFAULT_ADDRESS, server.address) + "\n")
                for b in blocks:
                    if b.lang not in SHELL_LANGS:
                        continue
                    if b.skip:
                        checked += 1
                        for line in commands(b.text):
                            for env_words in simple_commands(line):
                                for problem in checker.check(*env_words):
                                    failures.append(f"{b.where()} (skipped block): {problem}")
                        continue
                    ran += 1
                    script = b.text.replace(DEFAULT_ADDRESS, server.address)
                    try:
                        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script],
                                           cwd=scratch, env=env, capture_output=True, text=True,
                                           timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
                        ok, output = r.returncode == b.exit_status, r.stdout + r.stderr
                        status = f"exit {r.returncode}, expected {b.exit_status}"
                    except subprocess.TimeoutExpired as e:
                        ok, status = False, f"still running after {BLOCK_TIMEOUT_S} s"
                        output = (e.stdout or b"").decode(errors="replace") if isinstance(
                            e.stdout, bytes) else (e.stdout or "")
                    if not ok:
                        tail = "\n".join(output.strip().split("\n")[-20:])
                        failures.append(f"{b.where()}: {status}\n--- block:\n{b.text}\n"
                                        f"--- output (last lines):\n{tail}")
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"doc test: ran {ran} blocks, checked {checked} skipped blocks, in "
          f"{time.monotonic() - start:.1f} s; programs only listed: "
          f"{', '.join(sorted(checker.external)) or 'none'}")
    for failure in failures:
        print("FAIL " + failure)
    if failures:
        print("\nFix the page or the code; a block that cannot run in CI gets the line "
              "<!-- doc-test: skip REASON --> before its fence (docs/design.md, Documentation).")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
