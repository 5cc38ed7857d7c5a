"""`ttrace view` in a real browser: Playwright drives Debian's Chromium
(through executable_path: no browser download) against `ttrace view
--no-open --port P` serving real traces of the tiny model, Gemma 3 270M
(with --op-timing) and the two MoE models. What the page shows is checked
against figures the server did not make: the gguf-py tensor table,
`ttrace report --json` and `ttrace export --format jsonl`. Screenshots go
to TTRACE_SCREENSHOT_DIR. Needs root: the traces are recorded here."""
from __future__ import annotations

import collections
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import gguf
import pytest
from playwright.sync_api import sync_playwright
from test_exports import CHROMIUM_FLAGS, export, record, screenshot_path

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1600, "height": 1000}


# ------------------------------------------------------------------ traces


class Traced:
    """A recorded trace and its independent figures."""

    def __init__(self, name: str, path: Path, model: Path, ttrace: Path, tmp: Path):
        self.name, self.path, self.model = name, path, model
        self.report = json.loads(subprocess.run([ttrace, "report", path, "--json"], capture_output=True, text=True,
                                                check=True).stdout)
        assert self.report["lost"] == {k: 0 for k in self.report["lost"]}, "events were lost; the checks would be unfair"
        rows = [json.loads(line) for line in export(ttrace, path, "jsonl", tmp / "e.jsonl").read_text().splitlines()]
        self.ops = [r for r in rows if r["kind"] == "op"]
        self.gguf = {t.name: t for t in gguf.GGUFReader(model).tensors}

    def generate_ubatch(self) -> dict:
        """The report entry of a generated token's ubatch (one token), past the first."""
        gens = [u for u in self.report["ubatches"] if u["phase"] == "generate" and len(u["token_ids"]) == 1]
        assert len(gens) >= 2, "the run generated too few tokens"
        return gens[1]

    def weight_bytes(self, ubatch: dict, name: str) -> int:
        index = self.tensor_index(name)
        return sum(w["bytes"] for w in ubatch["weights"] if w["model"] == 0 and w["tensor"] == index)

    def tensor_index(self, name: str) -> int:
        return next(i for i, t in enumerate(self.report["models"][0]["tensors"]) if t["name"] == name)

    def ops_reading(self, name: str, ubatch: int | None = None) -> int:
        """Op rows of the JSONL export with `name` among their sources (the weight, or a repacked copy of it)."""
        return sum(1 for r in self.ops if name in (r["srcs"] or "").split(";") and (ubatch is None or r["ubatch"] == ubatch))


RECORDINGS = {"tiny": (), "gemma": ("--op-timing",), "moe": (), "qwen3moe": ()}


@pytest.fixture(scope="module")
def traced(ttrace, tmp_path_factory, llama_completion, models, flush_log_preload):
    """Records each model at most once per module, when a test first asks for it."""
    done: dict[str, Traced] = {}

    def get(name: str) -> Traced:
        if name not in done:
            d = tmp_path_factory.mktemp(f"view-{name}")
            path = record(ttrace, d / "t.data", llama_completion, models[name], flush_log_preload, RECORDINGS[name])
            done[name] = Traced(name, path, models[name], ttrace, d)
        return done[name]

    return get


# ------------------------------------------------------------------ server and browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ttrace view TRACE --no-open --port P`, until the test is done."""

    def __init__(self, ttrace: Path, trace: Path, log: Path):
        self.port = free_port()
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen([ttrace, "view", trace, "--no-open", "--port", str(self.port)],
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.base = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + 300  # a hang guard, not a timing check
        while True:
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"ttrace view never answered /api/v1/meta:\n{log.read_text()[-3000:]}", pytrace=False)
            if self.proc.poll() is not None:
                pytest.fail(f"ttrace view exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}", pytrace=False)
            try:
                with urllib.request.urlopen(self.base + "api/v1/meta", timeout=30) as r:
                    self.meta = json.load(r)
                break
            except OSError:
                time.sleep(0.1)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert "panicked" not in self.log.read_text()

    def tensor_id(self, name: str) -> int:
        return next(t["id"] for t in self.meta["tensors"] if t["name"] == name)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Debian's Chromium, a fresh profile; Playwright's own browsers are never downloaded."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (cargo xtask setup does)", pytrace=False)
    flags = [f for f in CHROMIUM_FLAGS if not f.startswith(("--enable-logging", "--v="))]
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(tmp_path_factory.mktemp("chromium-profile"), executable_path=CHROMIUM,
                                                   headless=True, args=flags, viewport=VIEWPORT)
        yield ctx
        ctx.close()


@pytest.fixture
def view(ttrace, browser, tmp_path):
    """Opens the page of a trace; checks at the end that the page logged no error."""
    opened = []

    def open_view(t: Traced, state: str = ""):
        server = Server(ttrace, t.path, tmp_path / f"view-{t.name}.log")
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        opened.append((server, page, errors))
        page.goto(server.base + (f"#{state}" if state else ""))
        page.wait_for_selector("body[data-ready='1']", state="attached")
        settle(page)
        return server, page

    yield open_view
    for server, page, errors in opened:
        page.close()
        server.close()
        assert not errors, f"the page logged errors: {errors}"


def settle(page):
    """Waits for the memory map's newest answer to be drawn."""
    page.wait_for_selector("#memmap-canvas[data-ready='1']", state="attached")


def hook(page, expr: str, *args):
    return page.evaluate(f"(args) => window.__ttraceView.{expr}", list(args))


def shoot(page, tmp_path: Path, name: str):
    shot = screenshot_path(tmp_path, f"view-{name}.png")
    page.screenshot(path=shot)
    assert shot.stat().st_size > 10_000


def lit_cells(page) -> list[tuple[int, int, float]]:
    page.wait_for_function("() => document.getElementById('memmap-canvas').dataset.litCells !== undefined")
    return [tuple(c) for c in json.loads(page.get_attribute("#memmap-canvas", "data-lit-cells"))]


def overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


# ------------------------------------------------------------------ the checks


@pytest.mark.parametrize("name", ["tiny", "gemma", "moe", "qwen3moe"])
def test_memory_map_lights_exactly_the_token_row_of_token_embd(traced, view, tmp_path, name):
    """In a generated token's ubatch, token_embd's lit cells are that token id's
    row (gguf-py's offset + id × row bytes), at the whole tensor's zoom and
    zoomed to a few rows. Gemma's output projection reads all of token_embd
    (tied embeddings), so there the GET_ROWS filter isolates the lookup;
    unfiltered, the cells add up every op's read (the JSONL's weight bytes)."""
    t = traced(name)
    u = t.generate_ubatch()
    token = u["token_ids"][0]
    emb = t.gguf["token_embd.weight"]
    off, size = int(emb.data_offset), int(emb.n_bytes)
    row_bytes = size // int(emb.shape[1])
    row = (off + token * row_bytes, off + (token + 1) * row_bytes)
    server, page = view(t)
    tid = server.tensor_id("token_embd.weight")
    assert next(x for x in server.meta["tensors"] if x["id"] == tid)["y0"] == off, "a single file starts at y 0"

    # Select the token's ubatch and the tensor by clicking them on the map, then zoom to the band.
    at = hook(page, "memmapPoint(args[0], args[1])", u["index"] + 0.5, off + size // 2)
    page.mouse.click(at["x"], at["y"])
    page.wait_for_function(f"() => window.__ttraceView.state().sel.tensor === {tid}")
    assert hook(page, "state().sel.ubatch") == u["index"]
    page.click("#details [data-card='tensor'] a:text('zoom to its band')")
    settle(page)
    if name == "gemma":
        # Every op's read adds up: the output projection's whole tensor and the lookup's row.
        read = sum(r["weight_bytes"] for r in t.ops if r["ubatch"] == u["index"] and "token_embd.weight" in r["srcs"].split(";"))
        assert read == size + row_bytes and t.weight_bytes(u, "token_embd.weight") == size
        assert sum(v for _, _, v in lit_cells(page)) == read
        page.select_option("#mm-op", label="GET_ROWS")
        settle(page)

    def check(cells):
        assert cells, "nothing lit"
        for y0, y1, v in cells:
            assert v == overlap(y0, y1, *row) > 0, (y0, y1, v, row)
        assert sum(v for _, _, v in cells) == row_bytes

    check(lit_cells(page))
    shoot(page, tmp_path, f"{name}-token-embd")
    # Zoomed to the row and two neighbours each side: a few bytes per cell.
    hook(page, "update((s) => { s.mm.y0 = args[0]; s.mm.y1 = args[1]; })", row[0] - 2 * row_bytes, row[1] + 2 * row_bytes)
    settle(page)
    grid = json.loads(page.get_attribute("#memmap-canvas", "data-grid"))
    assert grid["y_bin"] * 8 <= row_bytes
    check(lit_cells(page))
    shoot(page, tmp_path, f"{name}-token-row")


@pytest.mark.parametrize("name", ["tiny", "gemma", "moe", "qwen3moe"])
def test_hovered_cell_tooltip_equals_the_report(traced, view, tmp_path, name):
    """Hovering a small tensor's band in a generated token's column shows the
    report's bytes for it in that ubatch, the JSONL's count of ops reading it
    there, the ubatch's token ids and gguf-py's byte range."""
    t = traced(name)
    u = t.generate_ubatch()
    tensor = "blk.0.attn_norm.weight"
    g = t.gguf[tensor]
    server, page = view(t)
    tid = server.tensor_id(tensor)
    at = hook(page, "memmapPoint(args[0], args[1])", u["index"] + 0.5, int(g.data_offset) + int(g.n_bytes) // 2)
    page.mouse.move(at["x"], at["y"])
    box = page.wait_for_selector(f"#memmap-tooltip:not([hidden]) .tt-tensor[data-tensor='{tid}']")
    tip = page.locator("#memmap-tooltip")
    assert tip.get_attribute("data-x0") == str(u["index"]) and tip.get_attribute("data-x1") == str(u["index"] + 1)

    def field(f):
        return box.query_selector(f"[data-field='{f}']").get_attribute("data-value")

    assert field("name") == tensor
    assert field("range") == f"{int(g.data_offset)}-{int(g.data_offset) + int(g.n_bytes)}"
    want = t.weight_bytes(u, tensor)
    assert want == int(g.n_bytes), "a norm weight is read whole"
    assert int(field("read_bytes")) == want and int(field("report_bytes")) == want
    assert int(field("ops")) == t.ops_reading(tensor, u["index"]) > 0
    assert [int(x) for x in field("tokens").split(",")] == u["token_ids"]
    disk = sum(e["bytes"] for e in t.report["io"]["ubatch_tensor_bytes"]
               if e["ubatch"] == u["index"] and e["model"] == 0 and e["tensor"] == t.tensor_index(tensor))
    assert int(field("disk_bytes")) == disk
    if name == "gemma":
        # 236 tensors on one screen: the norm is a pixel or two tall, and the tooltip magnifies its neighbourhood.
        assert int(page.get_attribute("#memmap-magnifier", "data-rows")) >= 5
    shoot(page, tmp_path, f"{name}-tooltip")


def test_wheel_zooms_and_drag_pans_the_memory_map(traced, view, tmp_path):
    """Real wheel and drag input: the wheel narrows the byte range around the
    cursor and the server's bins with it, a drag moves the range without
    changing its span, shift+wheel narrows the ubatch range; the URL keeps
    each result."""
    t = traced("tiny")
    server, page = view(t)
    grid0 = json.loads(page.get_attribute("#memmap-canvas", "data-grid"))
    bb = page.locator("#memmap-canvas").bounding_box()
    x, y = bb["x"] + bb["width"] * 0.6, bb["y"] + bb["height"] * 0.5
    page.mouse.move(x, y)
    for _ in range(10):
        page.mouse.wheel(0, -200)
    page.wait_for_function("() => window.__ttraceView.state().mm.y0 !== null")
    settle(page)
    mm = hook(page, "state().mm")
    grid = json.loads(page.get_attribute("#memmap-canvas", "data-grid"))
    assert mm["y1"] - mm["y0"] < (grid0["y_to"] - grid0["y_from"]) / 4
    assert grid["y_bin"] < grid0["y_bin"] and mm["x0"] is None
    page.mouse.down()
    page.mouse.move(x, y - 150, steps=10)
    page.mouse.up()
    page.wait_for_function(f"() => window.__ttraceView.state().mm.y0 > {mm['y0']}")
    settle(page)
    moved = hook(page, "state().mm")
    assert abs((moved["y1"] - moved["y0"]) - (mm["y1"] - mm["y0"])) <= 1
    page.keyboard.down("Shift")
    for _ in range(8):
        page.mouse.wheel(0, -200)
    page.keyboard.up("Shift")
    page.wait_for_function("() => window.__ttraceView.state().mm.x0 !== null")
    settle(page)
    mm = hook(page, "state().mm")
    assert 1 <= mm["x1"] - mm["x0"] < len(t.report["ubatches"])
    assert "mm.y0=" in page.evaluate("location.hash") and "mm.x0=" in page.evaluate("location.hash")
    shoot(page, tmp_path, "tiny-zoomed")


@pytest.mark.parametrize("name", ["tiny", "gemma", "moe", "qwen3moe"])
def test_selecting_a_tensor_filters_the_op_table(traced, view, tmp_path, name):
    """A click on a band's label selects the tensor: the op table then holds
    exactly the ops the JSONL export lists as reading it; a click in a
    ubatch's column narrows it to that ubatch."""
    t = traced(name)
    server, page = view(t)
    total = page.locator("#op-total")
    assert int(total.get_attribute("data-total")) == len(t.ops)
    for tensor in ("token_embd.weight", "blk.1.attn_q.weight"):
        g = t.gguf[tensor]
        center = int(g.data_offset) + int(g.n_bytes) // 2
        at = hook(page, "memmapPoint(null, args[0])", center)
        page.mouse.click(at["x"], at["y"])
        want = t.ops_reading(tensor)
        page.wait_for_function(f"() => document.getElementById('op-total').dataset.total === '{want}'")
        assert page.locator("#op-chips [data-chip='tensor']").count() == 1
    u = t.generate_ubatch()
    at = hook(page, "memmapPoint(args[0], args[1])", u["index"] + 0.5, center)
    page.mouse.click(at["x"], at["y"])
    want = t.ops_reading("blk.1.attn_q.weight", u["index"])
    page.wait_for_function(f"() => document.getElementById('op-total').dataset.total === '{want}'")
    rows = page.locator("#op-rows .ops-row[data-op]")
    assert rows.count() == want
    shoot(page, tmp_path, f"{name}-op-table")
    # The URL holds the selection: a reload shows the same table.
    page.wait_for_function("() => location.hash.includes('tensor=')")
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.wait_for_function(f"() => document.getElementById('op-total').dataset.total === '{want}'")
    assert hook(page, "state().sel.ubatch") == u["index"]


@pytest.mark.parametrize("name", ["tiny", "gemma", "moe", "qwen3moe"])
def test_graph_has_the_reports_node_count(traced, view, tmp_path, name):
    """The graph of a generated token's ubatch has the report's op count for
    it, every one drawn once its layers are opened."""
    t = traced(name)
    u = t.generate_ubatch()
    server, page = view(t, f"ubatch={u['index']}")
    page.click("#tab-button-graph")
    page.wait_for_selector(f"#graph[data-ubatch='{u['index']}'][data-drawn]", state="attached")
    assert int(page.get_attribute("#graph", "data-nodes")) == u["ops"]
    page.click("text=open all layers")
    page.wait_for_function(f"() => document.getElementById('graph').dataset.drawn === '{u['ops']}'")
    assert page.locator("#graph .graph-node").count() == u["ops"]
    shoot(page, tmp_path, f"{name}-graph")


@pytest.mark.parametrize("name", ["moe", "qwen3moe"])
def test_expert_grid_equals_the_reports_routing(traced, view, tmp_path, name):
    """The layer × expert grid of the generate phase equals the report's
    activations and the experts its ubatches' routing selected; clicking an
    expert lights its slices of the expert tensors (gguf-py offsets)."""
    t = traced(name)
    server, page = view(t)
    page.click("#tab-button-moe")
    page.wait_for_selector("#moe-grid[data-phase='generate'][data-cells]", state="attached")
    grid = {int(k): v for k, v in json.loads(page.get_attribute("#moe-grid", "data-cells")).items()}
    moe = t.report["stats"]["moe"]["layers"]
    assert grid == {m["layer"]: next(p for p in m["phases"] if p["phase"] == "generate")["activations"] for m in moe}
    routed = collections.defaultdict(collections.Counter)
    for u in t.report["ubatches"]:
        if u["phase"] == "generate":
            for r in u["routing"]:
                routed[r["layer"]].update(r["selected"])
    assert {l: [routed[l][e] for e in range(len(v))] for l, v in grid.items()} == grid

    layer = moe[-1]["layer"]
    expert = max(range(len(grid[layer])), key=lambda e: grid[layer][e])
    geo = json.loads(page.get_attribute("#moe-grid", "data-geometry"))
    bb = page.locator("#moe-grid").bounding_box()
    row = geo["layers"].index(layer)
    page.mouse.click(bb["x"] + geo["left"] + (expert + 0.5) * geo["cw"], bb["y"] + geo["top"] + (row + 0.5) * geo["ch"])
    page.wait_for_function(f"() => JSON.stringify(window.__ttraceView.state().sel.expert) === '[{layer},{expert}]'")
    slices = sorted(tuple(s) for s in json.loads(page.get_attribute("#memmap-canvas", "data-expert-slices")))
    want = []
    for tname, g in t.gguf.items():
        if tname.startswith(f"blk.{layer}.") and "_exps" in tname:
            per = int(g.n_bytes) // int(g.shape[-1])
            want.append((int(g.data_offset) + expert * per, int(g.data_offset) + (expert + 1) * per))
    assert slices == sorted(want) and len(want) == 3
    shoot(page, tmp_path, f"{name}-moe")


def test_summary_shows_the_report(traced, view, tmp_path):
    """The summary tab's figures are the report's."""
    t = traced("gemma")
    server, page = view(t)
    page.click("#tab-button-summary")
    page.wait_for_selector("#summary[data-loaded='1']", state="attached")
    figure = lambda k: page.get_attribute(f"#summary [data-figure='{k}']", "data-value")  # noqa: E731
    assert int(figure("ops")) == t.report["ops"] == len(t.ops)
    assert int(figure("generated tokens")) == t.report["tokens"]["generated"]
    assert int(figure("faults")) == t.report["faults"]
    shoot(page, tmp_path, "gemma-summary")


def simulated(base: str, timeout: float = 600) -> dict:
    """`/api/v1/simulate`, asked again while it answers 202 (computing in the
    background, docs/VIEW_API.md) until its document is in."""
    deadline = time.monotonic() + timeout  # a hang guard, not a timing check
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "api/v1/simulate", timeout=30) as r:
            body = json.load(r)
            if r.status == 200:
                return body
            assert r.status == 202 and body["state"] == "computing" and 0 <= body["progress"] < 1, (r.status, body)
        time.sleep(0.2)
    pytest.fail(f"/api/v1/simulate still computing after {timeout} s")


def test_memory_tab_draws_simulates_curve(ttrace, traced, view, tmp_path):
    """/api/v1/simulate is `ttrace simulate TRACE --json`'s document, and the
    Memory tab draws each of its (budget, policy) points: the table holds
    the same figures and the canvas has every policy's colour on it."""
    t = traced("moe")
    want = json.loads(subprocess.run([ttrace, "simulate", t.path, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    server, page = view(t)
    assert simulated(server.base) == want
    page.click("#tab-button-simulate")
    page.wait_for_selector("#simulate[data-loaded='1']", state="attached")
    cells = page.eval_on_selector_all(
        "#simulate-table td[data-policy]",
        "tds => tds.map(td => [Number(td.dataset.budget), td.dataset.policy, Number(td.dataset.misses), "
        "Number(td.dataset.diskBytes)])")
    assert sorted(map(tuple, cells)) == sorted((r["budget_bytes"], r["policy"], r["misses"], r["disk_bytes"])
                                               for r in want["rows"])
    assert int(page.get_attribute("#simulate-fit", "data-bytes")) == want["fit_budget_bytes"]
    points = json.loads(page.get_attribute("#simulate-plot", "data-points"))
    assert sorted(p[0] for p in points) == sorted(r["policy"] for r in want["rows"])
    # Every point's marker is drawn where it belongs, in its policy's colour
    # (or in that of a later point's marker covering it).
    colours = {"lru": [0x22, 0xd3, 0xee], "opt": [0x4a, 0xde, 0x80], "2q": [0xf5, 0x9e, 0x0b]}
    shown = page.evaluate("""(points) => {
        const c = document.getElementById('simulate-plot'), g = c.getContext('2d'), dpr = window.devicePixelRatio;
        return points.map(([, x, y]) => Array.from(g.getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data));
    }""", points)
    for (policy, x, y), pixel in zip(points, shown):
        top = [q for q in points if abs(q[1] - x) <= 2 and abs(q[2] - y) <= 2][-1][0]
        assert pixel == colours[top] + [255], (policy, x, y, pixel)
    shoot(page, tmp_path, "moe-simulate")
