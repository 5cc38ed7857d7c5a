"""Shared fixtures for the Python oracle tests.

Everything these tests use comes from the set-up's one source of truth, the
JSON file named by TTRACE_PATHS (written by `cargo xtask test`, or by hand:
`cargo xtask paths > ~/.cache/ttrace/paths.json`). Missing prerequisites are
failures with a message, never skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GEN_MODELS = REPO / "scripts" / "gen_models.py"


def load_gen_models():
    """scripts/gen_models.py as a module: the model specs and generator."""
    name = "ttrace_gen_models"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GEN_MODELS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def ttrace() -> Path:
    """The release binary `cargo xtask test` built; the tests that use it record traces (eBPF), so root."""
    if os.geteuid() != 0:
        pytest.fail("these tests load eBPF programs and need root: run `sudo -E cargo xtask test`", pytrace=False)
    p = Path(os.environ.get("TTRACE_BIN", REPO / "target/release/ttrace"))
    if not os.access(p, os.X_OK):
        pytest.fail(f"no ttrace binary at {p}: run through `cargo xtask test` (it builds it and sets TTRACE_BIN)", pytrace=False)
    return p


@pytest.fixture(scope="session")
def paths() -> dict:
    where = os.environ.get("TTRACE_PATHS")
    if not where:
        pytest.fail(
            "TTRACE_PATHS is not set: run these tests through `cargo xtask test` "
            "(or set TTRACE_PATHS to the output of `cargo xtask paths` saved to a file)",
            pytrace=False,
        )
    try:
        data = json.loads(Path(where).read_text())
    except (OSError, ValueError) as e:
        pytest.fail(f"cannot read TTRACE_PATHS={where}: {e}; run through `cargo xtask test`", pytrace=False)
    for key in ("cache", "venv_python", "llama_completion", "llama_lib_dir", "llama_commit", "models"):
        if key not in data:
            pytest.fail(f"{where} has no `{key}`; regenerate it with `cargo xtask paths`", pytrace=False)
    return data


@pytest.fixture(scope="session")
def gen():
    return load_gen_models()


@pytest.fixture(scope="session")
def models(paths, gen) -> dict[str, Path]:
    """Manifest {name: first file}; every model in the specs must be there."""
    got = {name: Path(p) for name, p in paths["models"].items()}
    missing = sorted((set(gen.SPECS) | {"gemma"}) - set(got))
    if missing:
        pytest.fail(f"models {missing} missing from TTRACE_PATHS; run `cargo xtask setup`", pytrace=False)
    for name, p in got.items():
        if not p.is_file():
            pytest.fail(f"model {name}: {p} does not exist; run `cargo xtask setup`", pytrace=False)
    return got


@pytest.fixture(scope="session")
def llama_completion(paths) -> Path:
    p = Path(paths["llama_completion"])
    if not os.access(p, os.X_OK):
        pytest.fail(f"llama-completion not found at {p}; run `cargo xtask setup`", pytrace=False)
    return p


@pytest.fixture(scope="session")
def llama_tokenize(llama_completion) -> Path:
    p = llama_completion.with_name("llama-tokenize")
    if not os.access(p, os.X_OK):
        pytest.fail(f"llama-tokenize not found next to llama-completion ({p})", pytrace=False)
    return p


# llama.cpp's logger is a worker thread behind a queue, and the logger is
# deliberately leaked (common/log.cpp, common_log_main), so messages queued
# just before exit are lost whenever the worker has not run yet: on this
# 2-core machine llama-completion's final `common_perf_print` lines are
# missing in about half the runs under load. This preload library drains
# the queue at exit (common_log_pause joins the worker after it has written
# everything). It changes nothing else in the process.
FLUSH_LOG_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
__attribute__((destructor)) static void ttrace_flush_common_log(void) {
    void *(*log_main)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*log_pause)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (log_main && log_pause) log_pause(log_main());
}
"""


@pytest.fixture(scope="session")
def flush_log_preload(tmp_path_factory) -> Path:
    """Path of the log-draining LD_PRELOAD library (built with the system cc)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc) to build the log-flush preload; install build-essential", pytrace=False)
    d = tmp_path_factory.mktemp("flushlog")
    (d / "flushlog.c").write_text(FLUSH_LOG_C)
    so = d / "flushlog.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(so), str(d / "flushlog.c"), "-ldl"], check=True)
    return so


# The kernel's default read_ahead_kb (VM_READAHEAD_PAGES): set explicitly, as
# a udev rule or the distribution may give loop devices another one.
DEFAULT_READ_AHEAD_KB = 128
# Room for a copy of Gemma 3 270M (241 MiB) or two of `moe`, and ext4's own
# metadata. Sparse: only what is written takes disk space.
IMAGE_BYTES = 512 << 20
LOOP_TOOLS = {"losetup": "mount (util-linux)", "mount": "mount (util-linux)", "umount": "mount (util-linux)",
              "mkfs.ext4": "e2fsprogs"}


def sh(*argv) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} failed: {proc.stderr}"
    return proc.stdout.strip()


@pytest.fixture
def default_readahead_dir(ttrace, tmp_path) -> Iterator[Path]:
    """A directory on ext4 on a loop device whose read_ahead_kb is the kernel's
    default (so 256 KiB read-around windows after llama.cpp's
    POSIX_FADV_SEQUENTIAL): what NVMe and SSD users have, where this VM's own
    disk has 8192 (16 MiB windows). `--direct-io=on`: the loop device reads
    its image file with O_DIRECT, so what the runs read comes from the
    image's disk, not from a second page cache (the image's) behind the loop
    device. Root (the `ttrace` fixture checks it). Unmounted and detached
    whatever happens."""
    missing = [f"{tool} (Debian package {package})" for tool, package in LOOP_TOOLS.items() if not shutil.which(tool)]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `apt-get install mount e2fsprogs` (cargo xtask setup does)",
                    pytrace=False)
    image = tmp_path / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    sh("mkfs.ext4", "-q", "-F", image)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    device = Path(sh("losetup", "--direct-io=on", "--find", "--show", image))
    try:
        (Path("/sys/block") / device.name / "queue/read_ahead_kb").write_text(str(DEFAULT_READ_AHEAD_KB))
        sh("mount", device, mnt)
        try:
            yield mnt
        finally:
            sh("umount", mnt)
    finally:
        sh("losetup", "--detach", device)
