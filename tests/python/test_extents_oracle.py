"""Oracle: `ttrace gguf --extents` must place every byte of every tensor where
e2fsprogs' `filefrag -v` (an independent FIEMAP client) says it is on disk,
name the right block device (st_dev, sysfs) and count fragments correctly.
Run on every generated model: `bench` (~1 GB) spans several extents."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_gguf_oracle import ttrace_bin

SECTOR = 512
EXTENT_LINE = re.compile(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):")


def filefrag_runs(path: Path) -> list[tuple[int, int, int]]:
    """(logical byte, physical byte, length) runs, physically contiguous
    extents merged, so the comparison does not depend on how either side
    splits a contiguous range."""
    exe = shutil.which("filefrag") or "/usr/sbin/filefrag"
    if not os.access(exe, os.X_OK):
        pytest.fail("filefrag not found: apt-get install e2fsprogs", pytrace=False)
    out = subprocess.run([exe, "-v", "-b4096", str(path)], capture_output=True, text=True, check=True).stdout
    runs: list[tuple[int, int, int]] = []
    for line in out.splitlines():
        m = EXTENT_LINE.match(line)
        if not m:
            continue
        lstart, _, pstart, _, length = map(int, m.groups())
        lo, po, n = lstart * 4096, pstart * 4096, length * 4096
        if runs and runs[-1][0] + runs[-1][2] == lo and runs[-1][1] + runs[-1][2] == po:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + n)
        else:
            runs.append((lo, po, n))
    assert runs, f"filefrag found no extents for {path}:\n{out}"
    return runs


def expected_pieces(runs, offset: int, size: int) -> list[tuple[int, int, int]]:
    """The tensor's bytes [offset, offset+size) cut by the oracle's runs."""
    pieces = []
    for lo, po, n in runs:
        a, b = max(lo, offset), min(lo + n, offset + size)
        if a < b:
            pieces.append((a, po + (a - lo), b - a))
    return pieces


def merged(pieces):
    out = []
    for lo, po, n in pieces:
        if out and out[-1][0] + out[-1][2] == lo and out[-1][1] + out[-1][2] == po:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((lo, po, n))
    return out


@pytest.mark.parametrize("name", ["tiny", "moe", "bench"])
def test_extents_match_filefrag(models, name):
    path = models[name]
    # Extents are only final once the file's delayed allocation is written.
    os.sync()
    got = json.loads(subprocess.run(
        [ttrace_bin(), "gguf", str(path), "--extents", "--format", "json"],
        capture_output=True, text=True, check=True).stdout)
    f = got["files"][0]
    st = os.stat(path)
    dev = f["device"]
    assert (dev["major"], dev["minor"]) == (os.major(st.st_dev), os.minor(st.st_dev))
    sysfs = Path(f"/sys/dev/block/{dev['major']}:{dev['minor']}")
    assert sysfs.resolve().name == dev["name"]
    start_file = sysfs / "start"
    part_start = int(start_file.read_text()) if start_file.exists() else 0
    assert dev["partition_start_sector"] == part_start

    runs = filefrag_runs(path)
    assert f["n_extents"] >= len(runs)
    multi = 0
    for t in got["tensors"]:
        want = expected_pieces(runs, t["file_offset"], t["size_bytes"])
        have = [(e["file_offset"], e["physical"], e["length"]) for e in t["extents"]]
        assert t["fragments"] == len(t["extents"]), t["name"]
        assert sum(n for _, _, n in have) == t["size_bytes"], t["name"]
        assert merged(have) == merged(want), f"{t['name']}: ttrace {have} vs filefrag {want}"
        for e in t["extents"]:
            # Tracepoint sectors are device-relative: partition start + byte / 512.
            assert e["disk_sector"] == part_start + e["physical"] // SECTOR, t["name"]
        multi += len(merged(want)) > 1
    print(f"{name}: {len(got['tensors'])} tensors, {len(runs)} physical runs, {multi} tensors span several")
