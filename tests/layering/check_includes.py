#!/usr/bin/env python3
"""Checks the folder layering docs/design.md describes: each folder's sources include only the
folders below it. A project header included from a folder the table does not allow is named
with its file and line.

Usage: check_includes.py [REPO_ROOT]. Exit status 0 when every include is allowed, 1 otherwise.
"""
import os
import re
import sys

# Folder -> the folders (or single headers) its sources may include, besides itself and
# include/zinf/ (the public API, which everything may use). Keep in step with docs/design.md.
ALLOWED = {
    "tools": None,  # the top: anything
    "src/train": ["src/model", "src/runtime", "offload", "io", "kernels/cpu", "kernels/cuda",
                  "src/comm",
                  "src/ckpt", "src/config", "src/base"],
    "src/capi": ["src/runtime", "offload", "io", "kernels/cpu", "src/config", "src/base"],
    "src/runtime": ["offload", "io", "src/config", "src/base"],
    "src/model": ["kernels/cpu/llama_ops.h", "kernels/cpu/op_options.h", "src/base"],
    # offload/ knows nothing of what the model computes: grad_ops, not the layer ops.
    "offload": ["io", "kernels/cpu/adam.h", "kernels/cpu/grad_ops.h", "kernels/cpu/dtype.h",
                "kernels/cpu/cast.h", "kernels/cpu/half_convert.h", "kernels/cpu/kernel_options.h",
                "kernels/cpu/op_options.h", "kernels/cpu/parallel.h", "kernels/cpu/variant.h",
                "src/base"],
    "io": ["src/base"],
    "src/config": ["src/base"],
    "src/ckpt": ["src/base"],
    "src/comm": ["src/base", "kernels/cpu/half_convert.h"],
    "kernels/cpu": [],
    "kernels/cuda": [],
    "src/base": [],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh", ".inc")


def folder_of(rel):
    for f in sorted(ALLOWED, key=len, reverse=True):
        if rel == f or rel.startswith(f + "/"):
            return f
    return None


def allowed(src_folder, target):
    rules = ALLOWED[src_folder]
    if rules is None or target.startswith("zinf/") or target.startswith("include/zinf/"):
        return True
    if folder_of(target) == src_folder:
        return True
    return any(target == r or target.startswith(r + "/") for r in rules)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bad, files = [], 0
    for folder in ALLOWED:
        top = os.path.join(root, folder)
        for dirpath, _, names in os.walk(top):
            for name in names:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if folder_of(rel) != folder:
                    continue  # a deeper folder with its own rule
                files += 1
                with open(path, errors="replace") as f:
                    for no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if not os.path.exists(os.path.join(root, target)) and \
                                not target.startswith("zinf/"):
                            continue  # a generated or system-relative header
                        if not allowed(folder, target):
                            bad.append(f"{rel}:{no}: includes {target}, which {folder}/ may not "
                                       "(docs/design.md, Layers)")
    for b in bad:
        print(b)
    print(f"check_includes: {files} files, {len(bad)} includes across the layering")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
