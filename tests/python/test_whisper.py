"""whisper.cpp as pywhispercpp 1.5.1 (PyPI; whisper.cpp 1.8.5, ggml 0.13.1)
runs it, transcribing espeak-ng's reading of a sentence with whisper tiny.en
(converted by tests/programs/whisper/convert.py from a CTranslate2 wheel).

Oracles:
- the converted model is right if whisper.cpp, untraced, hears the words;
- ops per graph: ggml's scheduler prints every graph it splits when
  GGML_SCHED_DEBUG=2 (one line per node that is not a view); whisper.cpp
  logs at debug level only through a logger of the caller's, which
  transcribe.py sets with --ggml-debug;
- encoder and decoder graphs: whisper.cpp's own timings (`encode time = ...
  / N runs`, and the decode, batchd and prompt runs: each decoder pass is
  one of them); each encode computes three graphs (conv, encoder, cross-
  attention), which GGML_SCHED_DEBUG's print shows first;
- the transcript under tracing is the untraced one."""
from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import re
import subprocess
from pathlib import Path

import pytest

TRANSCRIBE = Path(__file__).resolve().parents[1] / "programs/whisper/transcribe.py"
# whisper.cpp reserves its four graphs (conv, encode, cross, decode) at
# start-up, each split and printed without being computed; this line ends that.
RESERVED = "compute buffer (decode)"


@pytest.fixture(scope="module")
def whisper(paths) -> dict:
    w = paths.get("whisper")
    if not w or not Path(w["model"]).is_file() or not Path(w["speech"]).is_file():
        pytest.fail("whisper's model or speech is missing: run `cargo xtask setup`", pytrace=False)
    return w


def transcribe(python, whisper, *extra, env=None) -> subprocess.CompletedProcess:
    p = subprocess.run([python, TRANSCRIBE, whisper["model"], whisper["speech"], *extra], capture_output=True,
                       text=True, errors="replace", timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def untraced(paths, whisper) -> dict:
    """One untraced run with the scheduler's print: transcript and the
    computed graphs' node counts, in order."""
    env = dict(os.environ, GGML_SCHED_DEBUG="2")
    p = transcribe(paths["venv_python"], whisper, "--ggml-debug", env=env)
    log = p.stderr
    assert RESERVED in log, log[-3000:]
    graphs = []
    for line in log[log.index(RESERVED):].splitlines():
        if line.startswith("## SPLIT #0"):
            graphs.append(0)
        elif line.startswith("## SPLIT"):
            pytest.fail(f"a graph split over backends, which this oracle does not count: {line}")
        elif line.startswith("node #"):
            graphs[-1] += 1
    return {"transcript": p.stdout, "graphs": graphs, "runs": timed_runs(log), "log": log}


def timed_runs(log: str) -> dict[str, int]:
    """whisper_print_timings' runs per step. It prints max(1, n) runs, so a
    step that took 0.00 ms ran none."""
    runs = {}
    for step, ms, n in re.findall(r"whisper_print_timings: +(\w+) time = +([\d.]+) ms / +(\d+) runs", log):
        runs[step] = int(n) if float(ms) > 0 else 0
    assert {"encode", "decode", "batchd", "prompt"} <= set(runs), log[-2000:]
    return runs


def test_converted_model_hears_the_words(untraced, whisper):
    heard = words(untraced["transcript"])
    said = words(whisper["text"])
    # tiny.en mishears a robot voice here and there; a wrong conversion
    # (a transposed or unsplit matrix, a wrong mel bank) hears nothing of it.
    common = [w for w in said if w in heard]
    assert len(common) >= len(said) * 2 // 3, (untraced["transcript"], whisper["text"])
    assert "quick brown fox" in " ".join(heard), untraced["transcript"]


@pytest.fixture(scope="module")
def traced(ttrace, paths, whisper, tmp_path_factory) -> dict:
    """One traced run: its stdout, `report --json`, the text summary and the op rows."""
    out = tmp_path_factory.mktemp("whisper") / "t.data"
    argv = [ttrace, "run", "-o", out, "--", paths["venv_python"], TRANSCRIBE, whisper["model"], whisper["speech"]]
    with kept_in_cache(whisper["model"]):
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    text = subprocess.run([ttrace, "report", out], capture_output=True, text=True, check=True).stdout
    rows = out.with_suffix(".jsonl")
    subprocess.run([ttrace, "export", out, "--format", "jsonl", "-o", rows], capture_output=True, check=True)
    ops = [r for r in map(json.loads, rows.read_text().splitlines()) if r["kind"] == "op"]
    return {"stdout": proc.stdout, "report": report, "summary": text.split("\n\n")[0], "ops": ops}


@contextlib.contextmanager
def kept_in_cache(path):
    """Holds `path`'s pages in the page cache: mlock of a read-only shared
    mapping of it (a private writable one would lock copies). ttrace names
    a weight copy by comparing it with the file's bytes where they are
    cached, never reading the file itself; this machine reclaims clean file
    pages within seconds with no memory pressure (pgsteal_file grows,
    kswapd's and direct reclaim's counts do not), so without the lock a few
    tensors were counted unnamed ("evicted")."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) != 0:
                raise OSError(ctypes.get_errno(), f"mlock of {path}")
            yield
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)


def summary_rows(summary: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in summary.splitlines()[1:] if line.strip())


def test_whisper_traced_graph_by_graph(traced, untraced):
    assert traced["stdout"] == untraced["transcript"], (traced["stdout"], untraced["transcript"])
    a = traced["report"]
    assert a["header"]["build"]["ggml_version"] == "0.13.1", a["header"]["build"]
    graphs = [u["ops"] for u in a["ubatches"]]
    assert graphs == untraced["graphs"], (graphs, untraced["graphs"])
    s = a["summary"]
    assert s["ops_outside_graphs"] == 0, s

    runs = untraced["runs"]
    decoder_passes = runs["decode"] + runs["batchd"] + runs["prompt"]
    stages = [u.get("stage") for u in a["ubatches"]]
    assert stages == ["encoder"] * (3 * runs["encode"]) + ["decoder"] * decoder_passes, (stages, runs)
    assert (s["program"], s["encoder_graphs"], s["decoder_graphs"]) == ("whisper.cpp", 3 * runs["encode"],
                                                                      decoder_passes), s

    # In whisper's words: no llama.cpp rows or warnings about llama.cpp's structs.
    summary = traced["summary"]
    rows = summary_rows(summary)
    assert "ubatches" not in rows and "llama.cpp" not in rows, summary
    assert "ggml 0.13.1" in rows["whisper.cpp"], summary
    assert rows["graphs"].startswith(f"{3 * runs['encode']} encoder "), summary
    assert f" {decoder_passes} decoder" in rows["graphs"], summary
    assert "WARNING" not in rows and "per generated token" not in summary, summary


def stage_of(name: str) -> str:
    """The graph of whisper.cpp's that reads a weight (whisper_build_graph_conv,
    _encoder, _cross and _decoder): the cross-attention's keys and values are
    computed once per encode, from the encoder's output."""
    if name.startswith("encoder.conv"):
        return "conv"
    if name.startswith("encoder."):
        return "encoder"
    if ".cross_attn.key." in name or ".cross_attn.value." in name:
        return "cross"
    return "decoder"


def test_whisper_weights_resolve_to_the_model_files_tensors(traced, whisper):
    """whisper.cpp reads its weights into memory and names none of them
    (`leaf_N`); ttrace learns the file at whisper_init and matches each
    weight to the file's tensor by its bytes. Oracles: whisper.cpp's graph
    builders (which graph reads which tensor, layers in order, each bias
    added to its own matrix's product), the file's own table."""
    a, summary = traced["report"], traced["summary"]
    (model,) = a["models"]
    assert model["files"] == [str(Path(whisper["model"]).resolve())], model["files"]
    tensors = model["tensors"]
    assert summary_rows(summary)["weights"] == (
        f"{len(tensors)} of the {len(tensors)} tensors of {model['files'][0]} touched: "
        "read into memory, matched to the file by their bytes"), summary
    # Each weight compared once, each named: none left to identical tensors or changed bytes.
    assert a["summary"]["copies"] == {"matched": len(tensors), "ambiguous": 0, "unmatched": 0}, a["summary"]["copies"]

    # Each graph reads the tensors its builder names, and nothing else.
    kinds = ["conv", "encoder", "cross"] + ["decoder"] * (len(a["ubatches"]) - 3)
    for u, kind in zip(a["ubatches"], kinds):
        read = {tensors[w["tensor"]]["name"] for w in u["weights"]}
        assert all(w["copy"] and not w["file_backed"] for w in u["weights"]), u["weights"][:3]
        assert read == {t["name"] for t in tensors if stage_of(t["name"]) == kind}, (u["index"], kind, sorted(read))

    ops = traced["ops"]
    by_graph = [[op for op in ops if op["ubatch"] == u["index"]] for u in a["ubatches"]]
    # Layers in order: six weight products per encoder block (query, key,
    # value, out, two MLP), two per cross block, eight per decoder block and
    # the logits' product with the (tied) token embedding.
    n_audio = 1 + max(t["layer"] for t in tensors if t["name"].startswith("encoder.blocks."))
    n_text = 1 + max(t["layer"] for t in tensors if t["name"].startswith("decoder.blocks."))
    for graph, per_block, blocks, tail in ((1, 6, n_audio, []), (2, 2, n_text, []), (3, 8, n_text, [None])):
        layers = [op["layer"] for op in by_graph[graph] if op["name"] == "MUL_MAT" and op["weights_copy"]]
        assert layers == [b for b in range(blocks) for _ in range(per_block)] + tail, (graph, layers)

    # Each bias is added to the product of its own matrix: two independent
    # matches (a 384×384 matrix among 48 of that shape, a 384-float bias
    # among dozens) that must agree.
    pairs = 0
    for graph in by_graph:
        products = {op["dst"]: op["srcs"].split(";")[0] for op in graph if op["name"] == "MUL_MAT"}
        for op in graph:
            srcs = op["srcs"].split(";")
            if op["name"] == "ADD" and len(srcs) == 2 and srcs[0] in products and srcs[1].endswith(".bias"):
                weight = products[srcs[0]]
                if weight.endswith(".weight"):
                    assert srcs[1] == weight.removesuffix(".weight") + ".bias", (op, weight)
                    pairs += 1
    # encoder: query, value, out, MLP×2 per block; decoder: query, value,
    # out, cross query and out, MLP×2; cross: value (key has no bias).
    assert pairs == 5 * n_audio + n_text + 7 * n_text * (len(by_graph) - 3), pairs


def whisper_tensor_count(hp: dict[str, int]) -> int:
    """The tensors whisper_model_load creates (and then requires the file to
    hold, each once): the encoder's positional embedding, two convolutions
    and final norm (7), 15 per encoder block (attention with a bias-less
    key, MLP, two norms), the decoder's two embeddings and final norm (4),
    and 24 per decoder block (its cross-attention and norm besides)."""
    return 7 + 15 * hp["n_audio_layer"] + 4 + 24 * hp["n_text_layer"]


def test_model_file_read_as_whisper_cpp_reads_it(ttrace, whisper, untraced):
    doc = json.loads(subprocess.run([ttrace, "gguf", whisper["model"], "--format", "json"], capture_output=True,
                                    text=True, check=True).stdout)
    (f,) = doc["files"]
    hp = {kv["key"].removeprefix("whisper."): kv["value"] for kv in f["metadata"]}
    # whisper.cpp's loader logs each hyper-parameter it read, and the sum of its tensors' bytes.
    logged = dict(re.findall(r"whisper_model_load: (n_\w+|ftype) += +(\d+)", untraced["log"]))
    del logged["n_langs"]  # derived from n_vocab, not read
    assert hp == {k: int(v) for k, v in logged.items()}, (hp, logged)
    size_mb = re.search(r"whisper_model_load: model size += +([\d.]+) MB", untraced["log"]).group(1)
    assert f"{doc['summary']['total_bytes'] / 1e6:.2f}" == size_mb, (doc["summary"], size_mb)
    tensors = doc["tensors"]
    assert len(tensors) == len({t["name"] for t in tensors}) == whisper_tensor_count(hp), len(tensors)
    # Back to back, the last ending at the end of the file.
    ends = [t["file_offset"] + t["size_bytes"] for t in tensors]
    assert all(end < nxt["file_offset"] for end, nxt in zip(ends, tensors[1:])), tensors[:3]
    assert ends[-1] == f["size"] == Path(whisper["model"]).stat().st_size
    by_name = {t["name"]: t for t in tensors}
    emb = by_name["decoder.token_embedding.weight"]
    assert (emb["type"], emb["shape"]) == ("F16", [hp["n_text_state"], hp["n_vocab"]]), emb
