"""Build demollm's compiled extension in place: `python3 setup.py build_ext --inplace`.

Reads the sources and flags from CMakeLists.txt and runs the system C compiler, writing
demollm/_kernels.so. Stdlib only, so it runs in any checkout of any commit.
"""

import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join("demollm", "_kernels.so")


def cmake_list(text, name):
    match = re.search(r"set\(\s*" + name + r"\s+(.*?)\)", text, re.S)
    if match is None:
        sys.exit("setup.py: CMakeLists.txt does not set " + name)
    return [item.strip('"') for item in shlex.split(match.group(1), comments=True)]


def main(argv):
    if argv[1:2] != ["build_ext"]:
        sys.exit("usage: python3 setup.py build_ext --inplace")
    with open(os.path.join(ROOT, "CMakeLists.txt")) as handle:
        text = handle.read()
    sources = cmake_list(text, "DEMOLLM_EXT_SRC")
    flags = cmake_list(text, "DEMOLLM_C_FLAGS")
    missing = [s for s in sources if not os.path.exists(os.path.join(ROOT, s))]
    if missing:
        sys.exit("setup.py: source listed in CMakeLists.txt not found: " + ", ".join(missing))
    compiler = os.environ.get("CC", "cc")
    tmp = OUTPUT + ".tmp"
    command = [compiler, *flags, "-shared", "-fPIC", "-Icsrc", "-o", tmp, *sources, "-lm"]
    print(" ".join(command), flush=True)
    result = subprocess.run(command, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"setup.py: compiler failed with exit status {result.returncode}")
    os.replace(os.path.join(ROOT, tmp), os.path.join(ROOT, OUTPUT))


if __name__ == "__main__":
    main(sys.argv)
