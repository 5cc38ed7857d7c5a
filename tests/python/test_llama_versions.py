"""`ttrace run` on every llama.cpp of the set-up's version matrix
(`cargo xtask paths` -> `llama_versions`, built by xtask/src/llama_versions.rs
from pinned llama-cpp-python sdists), each judged by that version's own
oracles, never by ttrace's:

- generate ubatches = the eval runs llama.cpp's perf counters report, and the
  prompt ubatch holds as many tokens as its `prompt eval` line says;
- the prompt's token ids = that version's own `llama-tokenize` output;
- every op name in the trace is in that version's `GGML_OP_NAME` table, read
  from its ggml.c (and the table ttrace recorded is that table);
- every weight an op reads that is a GGUF tensor (by the gguf reader's table)
  resolves to that tensor through the file mapping (or to a copy of it, for
  repacked weights), and every generate ubatch reads every layer matrix;
- on MoE models, every layer routes every token to `expert_used_count`
  distinct experts (the first of its ranking of all `expert_count`, where
  the trace has the ranking);
- the trace header names the version's commit.

The models are tiny and moe for every version, and Gemma 3 270M for those
that know its architecture. A version older than the `ggml_tensor` layout
ttrace knows must be refused: one line, exit non-zero, no trace written.
Needs root (the traces are recorded here)."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import gguf
import pytest

from test_exports import jsonl_rows
from test_llama_targets import PROMPT, tokenize
from test_trace_core import LAYER_MATRIX, PERF_EVAL, PERF_PROMPT, gguf_table, report

N_PREDICT = 8


def matrix() -> dict[str, dict] | str:
    """The set-up's versions, or why they cannot be read (then every case fails with it)."""
    where = os.environ.get("TTRACE_PATHS")
    if not where:
        return "TTRACE_PATHS is not set: run through `cargo xtask test` (or save `cargo xtask paths` to a file)"
    try:
        versions = json.loads(Path(where).read_text()).get("llama_versions")
    except (OSError, ValueError) as e:
        return f"cannot read TTRACE_PATHS={where}: {e}"
    if not versions:
        return f"{where} has no `llama_versions`; regenerate it with `cargo xtask paths`"
    return versions


def pytest_generate_tests(metafunc):
    versions = matrix()
    if isinstance(versions, str):
        versions = {}  # each test then fails with matrix()'s message (spec_of)
    if "model_name" in metafunc.fixturenames:
        # Layouts from the tables, and (tiny and moe) from the build's own code with the tables hidden.
        cases = [pytest.param(v, m, how, id=f"{v}-{m}" + ("-code" if how == "code" else ""))
                 for v, spec in versions.items() if spec["expect"] == "trace"
                 for m in ["tiny", "moe"] + (["gemma"] if spec["gemma3"] else [])
                 for how in ["tables"] + (["code"] if m != "gemma" else [])]
        none = pytest.param("none", "none", "tables", id="no-matrix")
        metafunc.parametrize(["version", "model_name", "layouts"], cases or [none])
    elif "version" in metafunc.fixturenames:
        cases = [v for v, spec in versions.items() if spec["expect"] == "refuse"]
        metafunc.parametrize("version", cases or [pytest.param("none", id="no-matrix")])


def spec_of(version: str) -> dict:
    versions = matrix()
    if isinstance(versions, str):
        pytest.fail(versions, pytrace=False)
    if version not in versions:
        pytest.fail(f"the set-up's llama.cpp version matrix has no version to test here ({sorted(versions)}); "
                    "see xtask/src/llama_versions.rs", pytrace=False)
    spec = versions[version]
    for key in ("generate", "tokenize", "ggml_c"):
        p = spec.get(key)
        if p is not None and not Path(p).exists():
            pytest.fail(f"llama.cpp {version}: {key} {p} does not exist; run `cargo xtask setup`", pytrace=False)
    return spec


def op_table(ggml_c: Path) -> list[str]:
    """`GGML_OP_NAME` of a ggml.c, in enum order, checked against its own
    `static_assert(GGML_OP_COUNT == N)`."""
    text = ggml_c.read_text(errors="replace")
    m = re.search(r"GGML_OP_NAME\[GGML_OP_COUNT\]\s*=\s*\{(.*?)\};", text, re.S)
    assert m, f"no GGML_OP_NAME table in {ggml_c}"
    names = re.findall(r'"([A-Z0-9_]+)"', re.sub(r"//[^\n]*", "", m.group(1)))
    count = re.search(r"static_assert\(GGML_OP_COUNT == (\d+)", text)
    assert count and int(count.group(1)) == len(names), f"{ggml_c}: {len(names)} op names, GGML_OP_COUNT {count}"
    return names


def command(spec: dict, model: Path, n: int = N_PREDICT) -> list:
    # -c 512: Gemma's default context (32768) would allocate a large KV cache.
    return [spec["generate"], "-m", model, "-p", PROMPT, "-n", str(n), *spec["generate_flags"], "--ignore-eos",
            "-t", "2", "--seed", "1", "-c", "512"]


#: ttrace's switch that hides its layout tables: every layout is read from the target's code.
HIDE_TABLES = {"TTRACE_LAYOUT_TABLES": "off"}
#: The structs ttrace reads from a build's code, and so the offsets that must equal the tables'
#: (`llama_ubatch` where the build has llama_context::process_ubatch, from Jul 2025).
DERIVED = ("ggml_tensor", "ggml_cgraph", "ggml_backend_buffer", "llama_ubatch")


def run_traced(ttrace, trace: Path, argv: list, preload: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_PRELOAD=str(preload), **(env or {}))
    return subprocess.run([ttrace, "run", "-o", trace, "--", *argv], capture_output=True, text=True, errors="replace",
                          env=env, timeout=600)


def gguf_meta(path: Path) -> tuple[int, int]:
    """(expert_count, expert_used_count) of a model, 0 for dense ones."""
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def field(key):
        f = reader.fields.get(f"{arch}.{key}")
        return int(f.parts[-1][0]) if f else 0
    return field("expert_count"), field("expert_used_count")


def test_version_traced_against_its_own_oracles(ttrace, tmp_path, models, flush_log_preload, version, model_name,
                                                layouts):
    spec = spec_of(version)
    model = models[model_name]
    trace = tmp_path / "t.data"
    hidden = HIDE_TABLES if layouts == "code" else None
    proc = run_traced(ttrace, trace, command(spec, model), flush_log_preload, hidden)
    assert proc.returncode == 0, f"ttrace run on llama.cpp {version} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    prompt, runs = PERF_PROMPT.findall(proc.stderr), PERF_EVAL.findall(proc.stderr)
    assert len(prompt) == 1 and len(runs) == 1, f"llama.cpp {version} printed no perf lines:\n{proc.stderr[-3000:]}"
    a = report(ttrace, trace)
    if hidden:
        # Read from the code: what the tables say, offset for offset, and said so in the header.
        tabled = tmp_path / "tables.data"
        assert run_traced(ttrace, tabled, command(spec, model, 2), flush_log_preload).returncode == 0
        want, got = report(ttrace, tabled)["header"]["build"], a["header"]["build"]
        for struct in DERIVED:
            if struct not in want["layouts"]:
                assert struct not in got["layouts"], (struct, got["layouts"])
                continue
            assert got["layouts"][struct].startswith(f"{struct}/derived"), got["layouts"]
            fields = {k: v for k, v in want["offsets"].items() if k.startswith(struct + ".")}
            assert fields and {k: got["offsets"].get(k) for k in fields} == fields, (struct, got["offsets"])

    # Ubatches as llama.cpp counts them.
    phases = [u["phase"] for u in a["ubatches"]]
    generate = [u for u in a["ubatches"] if u["phase"] == "generate"]
    prompts = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert len(generate) == int(runs[0]) == N_PREDICT - 1, (phases, runs)
    assert a["prompt_tokens"] == int(prompt[0]), (a["prompt_tokens"], prompt)

    # The prompt's ids: the version's own tokenizer's.
    want_ids = tokenize(spec["tokenize"], model)
    assert [t for u in prompts for t in u["token_ids"]] == want_ids
    assert all(len(u["token_ids"]) == 1 for u in generate), [u["token_ids"] for u in generate]

    # Op names: the version's own table.
    table = op_table(Path(spec["ggml_c"]))
    rows = jsonl_rows(ttrace, trace, tmp_path / "rows.jsonl")
    ops = [r for r in rows if r["kind"] == "op"]
    assert ops, "no ops recorded"
    unknown = sorted({r["name"] for r in ops} - set(table))
    assert not unknown, f"op names not in llama.cpp {version}'s GGML_OP_NAME: {unknown}"
    for needed in ("MUL_MAT", "GET_ROWS"):
        assert any(r["name"] == needed for r in ops), f"no {needed} op recorded"

    # Weights: ttrace's model table is the gguf reader's, and every GGUF
    # tensor an op reads resolves to a tensor of it (file-backed, or a copy).
    reference = gguf_table(model)
    (mt,) = a["models"]
    assert {t["name"]: t["file_offset"] for t in mt["tensors"]} == reference
    for r in ops:
        weights = [s for s in (r["srcs"] or "").split(";") if s in reference]
        assert r["weights_file"] + r["weights_copy"] == len(weights), r
    names = [t["name"] for t in mt["tensors"]]
    matrices = {n for n in reference if LAYER_MATRIX.match(n)}
    assert matrices
    repacked = model_name == "gemma"  # Q4_K/Q5_0 go to CPU_REPACK; the F16 models stay in the mapping
    for u in generate:
        read = {names[w["tensor"]]: w for w in u["weights"]}
        assert matrices <= set(read), f"ubatch {u['index']} missed {sorted(matrices - set(read))}"
        if not repacked:
            odd = {n: w for n, w in read.items() if not (w["file_backed"] > 0 and w["copy"] == 0)}
            assert not odd, f"ubatch {u['index']}: weights not read through the file mapping: {odd}"
    assert sum(w["file_backed"] for u in generate for w in u["weights"]) > 0

    # MoE routing: k of n experts per token and layer, every layer.
    n_expert, k = gguf_meta(model)
    n_layers = len({int(n.split(".")[1]) for n in reference if n.startswith("blk.")})
    for u in prompts + generate:
        routing = u["routing"]
        if not k:
            assert not routing, f"dense model routed in ubatch {u['index']}"
            continue
        n_tokens = len(u["token_ids"])
        rows: dict[int, set[int]] = {}
        for r in routing:
            rows.setdefault(r["layer"], set()).add(r["row"])
        assert sorted(rows) == list(range(n_layers)), (u["index"], sorted(rows))
        # Every token through every layer, but the last layer only computes
        # the tokens whose output is kept (llama.cpp's `inp_out_ids`).
        last = rows.pop(n_layers - 1)
        assert all(r == set(range(n_tokens)) for r in rows.values()), (u["index"], rows)
        assert last == set(range(len(last))) and 1 <= len(last) <= n_tokens, (u["index"], last)
        for r in routing:
            # k distinct experts per token; where ttrace has llama.cpp's full
            # ranking (ffn_moe_argsort), they are its first k.
            assert len(set(r["selected"])) == len(r["selected"]) == k, r
            assert set(r["selected"]) <= set(range(n_expert)), r
            if r["ranking"]:
                assert sorted(r["ranking"]) == list(range(n_expert)) and r["selected"] == r["ranking"][:k], r

    # The version is recorded.
    assert a["header"]["llama_commit"] == spec["commit"], {k: v for k, v in a["header"].items() if "llama" in k}


def test_too_old_version_is_refused(ttrace, tmp_path, models, version):
    spec = spec_of(version)
    trace = tmp_path / "t.data"
    proc = subprocess.run([ttrace, "run", "-o", trace, "--", *command(spec, models["tiny"], 4)], capture_output=True,
                          text=True, errors="replace", timeout=300)
    assert proc.returncode != 0, f"ttrace traced llama.cpp {version} ({spec['commit']}), whose layout it does not know"
    assert not trace.exists(), "a refused run must record nothing"
    # ttrace's own lines (`ttrace: ...` or its logger's `[LEVEL ttrace...]`), apart from the target's.
    own = [line for line in proc.stderr.splitlines() if re.match(r"(ttrace\b|\[\w+\s+ttrace)", line)]
    assert len(own) == 1, f"one line from ttrace, got:\n{proc.stderr[-3000:]}"
    line = own[0]
    # Its code does not give a layout either (`grad` sits where the derivation expects `src`).
    hidden = subprocess.run([ttrace, "run", "-o", trace, "--", *command(spec, models["tiny"], 4)], capture_output=True,
                            text=True, errors="replace", timeout=300, env=dict(os.environ, **HIDE_TABLES))
    assert hidden.returncode != 0 and not trace.exists(), hidden.stderr[-3000:]
    assert "could not be read from its code (ggml_tensor.src" in hidden.stderr, hidden.stderr[-3000:]
    # It names the struct, the version found and the versions supported.
    assert "ggml_tensor" in line, line
    assert spec["commit"] in line, line
    assert "supported" in line, line
