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

import json
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


def test_whisper_traced_graph_by_graph(ttrace, paths, whisper, untraced, tmp_path):
    out = tmp_path / "t.data"
    argv = [ttrace, "run", "-o", out, "--", paths["venv_python"], TRANSCRIBE, whisper["model"], whisper["speech"]]
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    assert proc.stdout == untraced["transcript"], (proc.stdout, untraced["transcript"])

    a = json.loads(subprocess.run([ttrace, "report", out, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
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
    text = subprocess.run([ttrace, "report", out], capture_output=True, text=True, check=True).stdout
    summary = text.split("\n\n")[0]
    rows = dict(line.split(None, 1) for line in summary.splitlines()[1:] if line.strip())
    assert "ubatches" not in rows and "llama.cpp" not in rows, summary
    assert "ggml 0.13.1" in rows["whisper.cpp"], summary
    assert rows["graphs"].startswith(f"{3 * runs['encode']} encoder "), summary
    assert f" {decoder_passes} decoder" in rows["graphs"], summary
    assert "WARNING" not in rows and "per generated token" not in summary, summary
    # Not yet: weights are read into memory, not mapped, and not followed.
    assert rows["weights"].startswith("not resolved to the model file's tensors"), summary


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
