#!/usr/bin/env python3
"""Runs the examples of a docs page and compares their output with the page's.

A runnable example on a page is a marker, a ```sh block of commands and a ```text block of the
output they print:

    <!-- example -->                      (or <!-- example: timeout=60 -->, <!-- example: fails -->)
    ```sh
    $ build/zinf plan --layers 2
    ```
    ```text
    ...what it printed...
    ```

Lines of the sh block that start with "$ " are commands; a line ending in a backslash continues
on the next. The commands run in order, in one bash (`set -e`: the first that fails ends the
example), in a fresh temporary directory holding the symlinks `build` (the build directory) and
`examples` (the repository's examples/), so a page writes commands as a user at the repository
root would. stdout and stderr are captured together. Every command must succeed, except with
`fails`, where the last one must exit non-zero.

The comparison masks numbers (timings vary; the words and the line structure must not), collapses
runs of blanks and ignores blank lines at either end; a line holding only "..." in the page
matches any number of lines of output.

Usage: run_doc_examples.py --build BUILD_DIR PAGE.md [PAGE.md ...]
Exit status: 0 all examples matched, 1 one did not (each mismatch is reported with both texts),
2 bad usage or a malformed example.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MARKER = re.compile(r"^<!--\s*example(?::\s*(?P<opts>[^>]*?))?\s*-->\s*$")
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
BLANKS = re.compile(r"[ \t]+")


class Example:
    def __init__(self, page, line, commands, expected, timeout, fails):
        self.page, self.line = page, line
        self.commands, self.expected = commands, expected
        self.timeout, self.fails = timeout, fails

    def where(self):
        return f"{self.page}:{self.line}"


def fenced_block(lines, i, lang, page):
    """The lines of the fenced block of `lang` opening at lines[i]; and the index after it."""
    if i >= len(lines) or lines[i].strip() != "```" + lang:
        raise ValueError(f"{page}:{i + 1}: expected a ```{lang} block here, after the example "
                         f"marker{' and its ```sh block' if lang == 'text' else ''}")
    body = []
    j = i + 1
    while j < len(lines) and lines[j].strip() != "```":
        body.append(lines[j])
        j += 1
    if j == len(lines):
        raise ValueError(f"{page}:{i + 1}: the ```{lang} block is never closed")
    return body, j + 1


def parse_options(text, page, line):
    timeout, fails = 30, False
    for opt in filter(None, re.split(r"[,\s]+", text or "")):
        if opt == "fails":
            fails = True
        elif opt.startswith("timeout="):
            try:
                timeout = int(opt[len("timeout="):])
            except ValueError:
                raise ValueError(f"{page}:{line}: timeout= takes whole seconds, not {opt!r}")
        else:
            raise ValueError(f"{page}:{line}: unknown example option {opt!r}; "
                             "expected timeout=SECONDS or fails")
    return timeout, fails


def commands_of(sh_lines, page, line):
    commands, current = [], None
    for raw in sh_lines:
        if current is not None:
            current += "\n" + raw
        elif raw.startswith("$ "):
            current = raw[2:]
        elif raw.strip():
            raise ValueError(f"{page}:{line}: a line of the sh block is neither a command "
                             f"(\"$ ...\") nor its continuation: {raw!r}")
        else:
            continue
        if not current.endswith("\\"):
            commands.append(current)
            current = None
    if current is not None:
        raise ValueError(f"{page}:{line}: the last command ends in a backslash")
    if not commands:
        raise ValueError(f"{page}:{line}: the example has no command")
    return commands


def examples_of(page):
    with open(page) as f:
        lines = f.read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        line = i + 1
        timeout, fails = parse_options(m.group("opts"), page, line)
        sh, i = fenced_block(lines, i + 1, "sh", page)
        text, i = fenced_block(lines, i, "text", page)
        found.append(Example(page, line, commands_of(sh, page, line), text, timeout, fails))
    return found


def normalize(line):
    return BLANKS.sub(" ", NUMBER.sub("#", line)).strip()


def trim(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(expected, actual):
    """Whether the output's lines match the page's, "..." matching any run of lines."""
    exp = [normalize(l) for l in trim(expected)]
    act = [normalize(l) for l in trim(actual)]
    memo = {}

    def m(i, j):
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(exp):
            r = j == len(act)
        elif exp[i] == "...":
            r = any(m(i + 1, k) for k in range(j, len(act) + 1))
        else:
            r = j < len(act) and exp[i] == act[j] and m(i + 1, j + 1)
        memo[key] = r
        return r

    sys.setrecursionlimit(max(10000, 4 * (len(exp) + len(act))))
    return m(0, 0)


def run(example, build):
    with tempfile.TemporaryDirectory(prefix="zinf-doc-", dir=os.environ.get("TMPDIR")) as tmp:
        os.symlink(os.path.abspath(build), os.path.join(tmp, "build"))
        os.symlink(os.path.join(ROOT, "examples"), os.path.join(tmp, "examples"))
        script = "set -e\n"
        for i, c in enumerate(example.commands):
            last = i == len(example.commands) - 1
            if last and example.fails:
                script += f"if {c}\nthen echo 'run_doc_examples: the command succeeded'; exit 0; fi\nexit 3\n"
            else:
                script += c + "\n"
        try:
            p = subprocess.run(["bash", "-c", script], cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=example.timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
            return False, f"did not end within {example.timeout} s", out
        out = p.stdout.decode(errors="replace")
        if example.fails and p.returncode != 3:
            return False, "was to fail, and its last command succeeded", out
        if not example.fails and p.returncode != 0:
            return False, f"a command exited {p.returncode}", out
        if not matches(example.expected, out.split("\n")):
            return False, "printed other output than the page shows", out
        return True, "", out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (holds zinf)")
    ap.add_argument("pages", nargs="+")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.build, "zinf")):
        print(f"run_doc_examples: --build {args.build}: no zinf executable there", file=sys.stderr)
        return 2
    failed = 0
    total = 0
    for page in args.pages:
        try:
            examples = examples_of(page)
        except (OSError, ValueError) as e:
            print(f"run_doc_examples: {e}", file=sys.stderr)
            return 2
        for ex in examples:
            total += 1
            ok, why, out = run(ex, args.build)
            if ok:
                print(f"ok   {ex.where()}: {ex.commands[0][:70]}")
                continue
            failed += 1
            print(f"FAIL {ex.where()}: the example {why}.\n--- the page shows:\n"
                  + "\n".join(trim(ex.expected)) + "\n--- the commands printed:\n"
                  + "\n".join(trim(out.split("\n"))) + "\n---")
    print(f"run_doc_examples: {total - failed} of {total} examples matched")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
