#!/usr/bin/env python3
"""Checks every relative link of README.md and docs/*.md: the file it names exists in the
repository, and a #fragment names a heading of that page (GitHub's anchor rules). Links that
leave the repository (../shared/..., an absolute path) are errors: a clone must stand alone.
External links (http, https, mailto) are not fetched.

Usage: check_links.py [REPO_ROOT]. Exit status 0 when every link resolves, 1 otherwise (each
broken link is named with its page and line).
"""
import os
import re
import sys

LINK = re.compile(r"(?<!\!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+)\s*\)")
REFDEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def anchor_of(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, counts = set(), {}
    in_fence = False
    with open(path) as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            m = HEADING.match(line) if not in_fence else None
            if m:
                a = anchor_of(m.group(2))
                n = counts.get(a, 0)
                counts[a] = n + 1
                found.add(a if n == 0 else f"{a}-{n}")
    return found


def links(path):
    in_fence = False
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            code_free = re.sub(r"`[^`]*`", "", line)
            for rx in (LINK, IMAGE, REFDEF):
                for m in rx.finditer(code_free):
                    yield no, m.group(1)


def check(root):
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, p) for p in os.listdir(docs) if p.endswith(".md"))
    broken = []
    root_real = os.path.realpath(root)
    for page in pages:
        for no, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            where = f"{os.path.relpath(page, root)}:{no}: {target}"
            path, _, frag = target.partition("#")
            if path.startswith("/"):
                broken.append(f"{where}: an absolute path; link relative to the page")
                continue
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.realpath(dest).startswith(root_real + os.sep) and \
                    os.path.realpath(dest) != root_real:
                broken.append(f"{where}: leaves the repository")
                continue
            if not os.path.exists(dest):
                broken.append(f"{where}: no such file")
                continue
            if frag and dest.endswith(".md") and frag not in anchors(dest):
                broken.append(f"{where}: {os.path.relpath(dest, root)} has no heading #{frag}")
    return pages, broken


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pages, broken = check(root)
    for b in broken:
        print(f"broken link: {b}")
    print(f"check_links: {len(pages)} pages, {len(broken)} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
