#!/usr/bin/env python3
"""Rebuild a file from its zstd --patch-from delta against a base file (runs on the GPU machine,
which has no zstd binary: python-zstandard travels in the deps set).

    python3 scripts/gpu/zpatch.py BASE PATCH OUT [SHA256]

The deltas are what makes four vLLM releases' 80-110 MB extensions fit the calls' 64 MiB:
0.27.0's _C_stable_libtorch is 5.7 MB as a delta from 0.26.0's (56 MB xz alone). Made here with
`zstd -19 --long=27 --patch-from=BASE NEW -o PATCH`; checked against SHA256 when given.
"""

from __future__ import annotations

import hashlib
import os
import sys


def main(argv: list[str]) -> int:
    base, patch, out = argv[:3]
    want = argv[3] if len(argv) > 3 else ""
    import zstandard

    with open(base, "rb") as handle:
        ref = handle.read()
    raw = zstandard.ZstdCompressionDict(ref, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    decompressor = zstandard.ZstdDecompressor(dict_data=raw, max_window_size=1 << 31)
    digest = hashlib.sha256()
    tmp = out + ".part"
    with open(patch, "rb") as src, open(tmp, "wb") as dst:
        reader = decompressor.stream_reader(src)
        while chunk := reader.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
    if want and digest.hexdigest() != want:
        os.unlink(tmp)
        print(f"zpatch: {out}: sha256 {digest.hexdigest()} != {want}", file=sys.stderr)
        return 1
    os.replace(tmp, out)
    print(f"zpatch: {out} {os.path.getsize(out)} bytes sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
