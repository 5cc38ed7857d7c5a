"""Oracle: `ttrace gguf --format json` must agree with the PyPI gguf reader on
every tensor (name, type, shape, absolute offset, size) and every metadata key,
for our own fixtures (every ggml type, every KV type, both byte orders, custom
alignment, MoE, a 3-way split) and for every model in TTRACE_PATHS (for split
models, file by file)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

import gguf_fixtures as fx

REPO = Path(__file__).resolve().parents[2]


def ttrace_bin() -> str:
    env = os.environ.get("TTRACE_BIN")
    if env:
        return env
    fallback = REPO / "target" / "release" / "ttrace"
    if not fallback.exists():
        pytest.fail(f"no ttrace binary: set TTRACE_BIN or build {fallback} (cargo build --release -p tracer-user)")
    return str(fallback)


@pytest.fixture(scope="module")
def own_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf oracle")  # a space in the path on purpose
    split_dir = d / "split"
    split_dir.mkdir()
    fx.llama_like(split_dir / "tiny.gguf", n_layer=3, split_into=3)
    shards = sorted(split_dir.iterdir())
    assert [p.name for p in shards] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return {
        "all-types": fx.all_types(d / "all-types.gguf"),
        "all-types-align64": fx.all_types(d / "all-types-a64.gguf", alignment=64),
        "all-types-big-endian": fx.all_types(d / "all-types-be.gguf", endian=gguf.GGUFEndian.BIG),
        "llama-f16": fx.llama_like(d / "llama-f16.gguf"),
        "llama-q4k": fx.llama_like(d / "llama-q4k.gguf", n_embd=256, n_ff=512, qtype=fx.Q.Q4_K),
        "moe-q8": fx.llama_like(d / "moe.gguf", qtype=fx.Q.Q8_0, n_expert=4),
        "split-3": shards[1],  # any shard opens the whole model
        "committed-fixture": REPO / "tracer-user" / "tests" / "fixtures" / "tiny-moe.gguf",
    }


def run_ttrace(model: Path) -> dict:
    out = subprocess.run([ttrace_bin(), "gguf", str(model), "--format", "json", "--full"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def flatten(v):
    if isinstance(v, list):
        return [x for item in v for x in flatten(item)]
    return [v]


def same_value(ours, field: gguf.ReaderField) -> bool:
    theirs = field.contents()
    main = field.types[0]
    leaf = field.types[-1]
    if main == gguf.GGUFValueType.ARRAY:
        ours, theirs = flatten(ours), list(theirs)
    else:
        ours, theirs = [ours], [theirs]
    if len(ours) != len(theirs):
        return False
    if leaf in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        dt = np.float32 if leaf == gguf.GGUFValueType.FLOAT32 else np.float64
        return bool(np.array_equal(np.array(ours, dtype=dt), np.array(theirs, dtype=dt), equal_nan=True))
    return ours == theirs


def check_model(model: Path) -> int:
    doc = run_ttrace(model)
    files = doc["files"]
    checked = 0
    for file_idx, f in enumerate(files):
        reader = gguf.GGUFReader(f["path"])
        ours = [t for t in doc["tensors"] if t["file"] == file_idx]
        assert f["n_tensors"] == len(reader.tensors) == len(ours), f["path"]
        assert f["data_offset"] == reader.data_offset, f["path"]
        assert f["alignment"] == reader.alignment, f["path"]
        for t, r in zip(ours, reader.tensors):
            got = (t["name"], t["type"], t["shape"], t["file_offset"], t["size_bytes"])
            want = (r.name, r.tensor_type.name, [int(x) for x in r.shape], int(r.data_offset), int(r.n_bytes))
            assert got == want, f"{f['path']}: {got} != {want}"
            checked += 1
        fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
        meta = {kv["key"]: kv for kv in f["metadata"]}
        assert list(meta) == list(fields), f["path"]
        for key, field in fields.items():
            kv = meta[key]
            assert kv["type"] == field.types[0].name, key
            if len(field.types) > 1:
                assert kv["element_type"] == field.types[1].name, key
            assert same_value(kv["value"], field), f"{key}: {kv['value']!r} != {field.contents()!r}"
    assert doc["summary"]["tensor_count"] == len(doc["tensors"])
    assert doc["summary"]["total_bytes"] == sum(t["size_bytes"] for t in doc["tensors"])
    return checked


@pytest.mark.parametrize("name", ["all-types", "all-types-align64", "all-types-big-endian", "llama-f16",
                                  "llama-q4k", "moe-q8", "split-3", "committed-fixture"])
def test_own_fixture_matches_reference_reader(own_models, name):
    assert check_model(own_models[name]) > 0


def test_fixtures_cover_every_type(own_models):
    doc = run_ttrace(own_models["all-types"])
    assert {t["type"] for t in doc["tensors"]} == {q.name for q in gguf.GGML_QUANT_SIZES}
    kv_types = {kv["type"] for kv in doc["files"][0]["metadata"]}
    assert kv_types == {v.name for v in gguf.GGUFValueType}


def test_split_is_one_model(own_models):
    doc = run_ttrace(own_models["split-3"])
    assert len(doc["files"]) == 3
    assert {t["file"] for t in doc["tensors"]} == {0, 1, 2}


def test_moe_experts(own_models):
    doc = run_ttrace(own_models["moe-q8"])
    exps = [t for t in doc["tensors"] if t["component"].endswith("_exps")]
    assert exps and all(t["n_experts"] == 4 and t["expert_bytes"] * 4 == t["size_bytes"] for t in exps)


def test_large_arrays_are_summarised_without_full(own_models):
    out = subprocess.run([ttrace_bin(), "gguf", str(own_models["llama-f16"]), "--format", "json"],
                         capture_output=True, text=True, check=True)
    tokens = next(kv for kv in json.loads(out.stdout)["files"][0]["metadata"] if kv["key"] == "tokenizer.ggml.tokens")
    assert tokens["summarized"] and tokens["len"] == 300 and "value" not in tokens


def test_generated_models_match_reference_reader(models):
    """Every model of scripts/gen_models.py (the `models` fixture of conftest.py
    fails, never skips, when TTRACE_PATHS or a model is missing)."""
    assert models, "TTRACE_PATHS names no models"
    for name, path in sorted(models.items()):
        assert check_model(path) > 0, name
