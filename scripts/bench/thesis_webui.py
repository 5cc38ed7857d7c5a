"""How the thesis's React web UI (ErsjanKeri/BSC, `tensor-tracing/webui`) copes
with ttrace's `tokens-json` export of a real trace, to set beside `ttrace view`.

    thesis_webui.py --webui DIST --trace FILE [--ttrace BIN] [--export DIR]
                    [--tokens 1,10,100,...] [--keep-going] [--switches 8]
                    [--repeat 3] [--timeout 120] [--rss-limit-mb 12000]

DIST is the web UI's build output: in `tensor-tracing/webui`, `npm ci` then
`npx vite build` (`npm run build` runs `tsc -b` first, which fails on the
UI's unused variables; vite, like the UI's own `npm run dev`, does not type
check). The script

1. exports FILE with `ttrace export --format tokens-json` (or reuses --export
   DIR if it already holds an export);
2. serves DIST at `/` and a data directory at `/data/`, where the UI fetches
   `memory-map.json`, `buffer-timeline.json` (optional; ttrace writes none
   and the UI goes on after the 404), `graphs/token-00000.json` and
   `traces/token-00000.json` -- the same as copying the data to the UI's
   `public/data/`, with no change to the UI;
3. drives Debian's Chromium (headless, Playwright with executable_path, a
   fresh browser per page load) and prints one JSON object.

What it measures:

- "stock": the UI as written, on the whole export. The UI only ever opens
  token 0 (`loadTokenData(0)` on mount) and has no token selector, so what it
  loads does not depend on how many tokens were exported. Token switches
  call the store's own `loadTokenData(k)` (found through React's fiber tree)
  and are timed until token k's table is painted.
- "merged": the UI holding N tokens at once, the only way it can: tokens
  0..N-1's entries concatenated into one `traces/token-00000.json` (entry ids
  renumbered, `timestamp_relative_ms` from token 0's start, metadata totals
  summed), with token 0's graph and the memory map. This is the layout the
  thesis's traces had before its per-token split (BSC journal 2026-01-08) and
  what "the browser could not hold about 100 tokens (170k entries)" is about.
  N grows until the first failure (all of --tokens with --keep-going); a run
  that renders within 30 s is repeated (--repeat) and its median reported.

Per page load:
- `rendered_ms`: navigation start to the first frame painted after the trace
  table shows all the rows (its header's "`N entries`", set in the same React
  commit as the rows) beside the memory heatmap: `performance.now()` in a
  task queued from that frame's requestAnimationFrame, i.e. after its style,
  layout and paint.
- `trace_fetched_ms` (the trace file's responseEnd), `index_start_ms` and
  `index_done_ms` (the store's correlation index, built right after the JSON
  is parsed and before React renders; from the UI's own console.log lines).
- `task_s`, `script_s`, `style_s`, `layout_s`: main-thread time by kind up
  to the render (Chromium's Performance.getMetrics); `js_heap_used_mb` /
  `js_heap_total_mb` after a forced GC, `dom_nodes`, `dom_elements`,
  `table_rows`.
- `renderer_peak_rss_mb`: the renderer process's peak RSS (VmHWM from /proc,
  sampled every 200 ms over every Chromium renderer under this process).
- `outcome`: `ok` (rendered within 60 s), `slow` (rendered after > 60 s),
  `unresponsive` (not rendered by --timeout; the renderer is then killed,
  since a page stuck in one long task never lets Playwright's own timeouts
  unwind), `error` (the UI showed its load error, e.g. a trace file longer
  than V8's longest string), `crash` (the renderer died by itself: "Aw,
  Snap!", out of memory) or `rss-limit` (killed past --rss-limit-mb, to keep
  the machine alive).
- `export_bytes`: what N tokens' files (traces + graphs + memory map) take in
  the export; `merged_trace_bytes`: the one trace file the UI loads.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}
SLOW_S = 60

# The UI's state once it has rendered a token: the trace view's header reads
# "<n> entries" (set in the same commit as its rows) and the heatmap is up.
# Also reports the UI's own error screen for a failed token load.
STATE = """(want) => {
  const err = document.querySelector('.text-red-300');
  if (err && err.textContent.includes('Failed to load token data')) return {error: err.textContent};
  const tok = document.querySelector('span.text-white.font-mono');
  if (!tok || (want.token !== null && tok.textContent !== String(want.token))) return false;
  let entries = false, heatmap = false;
  for (const s of document.getElementsByClassName('ml-3')) {
    if (s.textContent === want.entries + ' entries') entries = true;
    if (s.textContent.includes(' tensors, ')) heatmap = true;
  }
  return entries && heatmap ? {ok: true} : false;
}"""

# Marks the frame after the commit: its rAF callbacks, style, layout and
# paint, then a task (returns at once; painted() waits for the mark).
PAINT_MARK = """() => {
  window.__painted = 0;
  requestAnimationFrame(() => setTimeout(() => { window.__painted = performance.now(); }, 0));
}"""

# The zustand store's state (whose actions are closures over the store) from
# the hook list of any component that calls useAppStore().
FIND_STORE = """() => {
  const root = document.getElementById('root');
  const key = Object.keys(root).find(k => k.startsWith('__reactContainer$'));
  const stack = [root[key]];
  while (stack.length) {
    const f = stack.pop();
    for (let h = f.memoizedState; h && typeof h === 'object' && 'next' in h; h = h.next) {
      const s = h.memoizedState;
      if (s && typeof s === 'object' && typeof s.loadTokenData === 'function') {
        window.__thesisStore = s;
        return true;
      }
    }
    if (f.child) stack.push(f.child);
    if (f.sibling) stack.push(f.sibling);
  }
  return false;
}"""

# Records when the UI logs the start and end of its correlation index (the
# store builds it right after parsing the trace, before React renders it).
LOG_TIMES = """(() => {
  window.__log = {};
  const log = console.log;
  console.log = (...a) => {
    const m = String(a[0]);
    if (m.startsWith('Building NAME-BASED')) window.__log.index_start_ms = performance.now();
    if (m.startsWith('\u2713 NAME-BASED')) window.__log.index_done_ms = performance.now();
    return log.apply(console, a);
  };
})()"""

DOM_STATS = """() => {
  const rows = document.querySelectorAll('div[title^="Click to select"]').length;
  return {dom_elements: document.getElementsByTagName('*').length, table_rows: rows};
}"""


# --------------------------------------------------------------------------- serving

class Handler(http.server.SimpleHTTPRequestHandler):
    """DIST at /, the current data directory at /data/."""

    data_root: Path = Path("/nonexistent")

    def translate_path(self, path):
        p = path.split("?", 1)[0].split("#", 1)[0]
        if p.startswith("/data/"):
            rel = Path(p[len("/data/"):])
            if ".." in rel.parts:
                return "/nonexistent"
            return str(Handler.data_root / rel)
        return super().translate_path(path)

    def log_message(self, *args):
        pass


def serve(dist: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(Handler, directory=str(dist))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


# --------------------------------------------------------------------------- processes

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def renderers() -> list[int]:
    """Chromium renderer processes descended from this process."""
    kids, out, stack = _children(), [], [os.getpid()]
    while stack:
        for c in kids.get(stack.pop(), []):
            stack.append(c)
            try:
                with open(f"/proc/{c}/cmdline", "rb") as f:
                    if b"--type=renderer" in f.read():
                        out.append(c)
            except OSError:
                pass
    return out


def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Watchdog:
    """Samples this process's Chromium renderers every 200 ms for their peak
    RSS, and kills them past the RSS limit or once `deadline` (a monotonic
    time, or None) has passed. Playwright's own timeouts need the page's main
    thread to unwind their in-page pollers, which a page stuck in one long
    task never gives them; a killed renderer ends every pending call."""

    def __init__(self, limit_mb: int):
        self.limit_kb = limit_mb * 1024
        self.deadline: float | None = None
        self.peak_kb = 0
        self.killed: str | None = None  # "rss-limit" or "unresponsive"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.2):
            late = self.deadline is not None and time.monotonic() > self.deadline
            for pid in renderers():
                self.peak_kb = max(self.peak_kb, _status_kb(pid, "VmHWM") or 0)
                big = (_status_kb(pid, "VmRSS") or 0) > self.limit_kb
                if big or late:
                    self.killed = self.killed or ("rss-limit" if big else "unresponsive")
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass


# --------------------------------------------------------------------------- measuring

def metrics(cdp) -> dict:
    """Main-thread time since Performance.enable by kind (script, style,
    layout; task = all of it), then the JS heap after a full GC (what the
    page retains) and the number of DOM nodes."""
    get = lambda: {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
    m = get()
    out = {"task_s": m["TaskDuration"], "script_s": m["ScriptDuration"], "style_s": m["RecalcStyleDuration"],
           "layout_s": m["LayoutDuration"]}
    out = {k: round(v, 2) for k, v in out.items()}
    cdp.send("HeapProfiler.collectGarbage")
    m = get()
    mb = lambda v: round(v / 2**20, 1)
    return dict(out, js_heap_used_mb=mb(m["JSHeapUsedSize"]), js_heap_total_mb=mb(m["JSHeapTotalSize"]),
                dom_nodes=int(m["Nodes"]))


def ms_left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic()) * 1000


def painted(page, deadline: float) -> float:
    """performance.now() once the next frame has been laid out and painted."""
    page.evaluate(PAINT_MARK)
    return page.wait_for_function("() => window.__painted", polling=50, timeout=ms_left(deadline)).json_value()


def load(p, url: str, entries: int, timeout_s: float, rss_limit_mb: int, after=None) -> dict:
    """Opens the UI in a fresh browser; waits for token 0's table and heatmap."""
    out: dict = {"outcome": None}
    browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
    crashed = threading.Event()
    try:
        with Watchdog(rss_limit_mb) as dog:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("crash", lambda _: crashed.set())
            page.add_init_script(LOG_TIMES)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            t0 = time.monotonic()
            dog.deadline = deadline = t0 + timeout_s
            try:
                page.goto(url, wait_until="commit", timeout=ms_left(deadline))
                res = page.wait_for_function(STATE, arg={"token": 0, "entries": entries}, polling="raf",
                                             timeout=ms_left(deadline)).json_value()
                if "error" in res:
                    out.update(outcome="error", error=res["error"].strip()[:300],
                               error_ms=round(page.evaluate("performance.now()"), 1))
                else:
                    out["rendered_ms"] = round(painted(page, deadline), 1)
                    dog.deadline = None
                    out["outcome"] = "ok" if out["rendered_ms"] <= SLOW_S * 1000 else "slow"
                    fetched = page.evaluate("""() => performance.getEntriesByType('resource')
                        .filter(e => e.name.endsWith('/traces/token-00000.json')).map(e => e.responseEnd)[0]""")
                    out["trace_fetched_ms"] = round(fetched, 1) if fetched else None
                    out.update({k: round(v, 1) for k, v in page.evaluate("window.__log").items()})
                    out.update(page.evaluate(DOM_STATS))
                    out.update(metrics(cdp))
                    if after:
                        out.update(after(page, cdp, dog))
            except PlaywrightError as e:  # TimeoutError included
                if out["outcome"] is None:
                    out["outcome"] = "unresponsive" if isinstance(e, PlaywrightTimeout) else "error"
                    out["error"] = str(e).splitlines()[0][:300]
            if "rendered_ms" not in out and (dog.killed or crashed.is_set()):
                out["outcome"] = dog.killed or "crash"
                out.pop("error", None)
            out["wall_s"] = round(time.monotonic() - t0, 1)
        out["renderer_peak_rss_mb"] = round(dog.peak_kb / 1024, 1)
    finally:
        browser.close()
    return out


def repeated(p, url: str, entries: int, args) -> dict:
    """load() up to --repeat times while it renders within 30 s; the median run."""
    runs = []
    for _ in range(args.repeat):
        runs.append(load(p, url, entries, args.timeout, args.rss_limit_mb))
        if runs[-1]["outcome"] != "ok" or runs[-1]["rendered_ms"] > 30_000:
            break
    if runs[-1]["outcome"] != "ok":
        best = runs[-1]
    else:
        best = sorted(runs, key=lambda r: r["rendered_ms"])[len(runs) // 2]
    if len(runs) > 1:
        best = dict(best, rendered_ms_runs=[r.get("rendered_ms") for r in runs])
    return best


def switches(export: Path, tokens: list[int], timeout_s: float):
    """A callback for load(): times the store's loadTokenData(k) for each k."""

    def run(page, cdp, dog: Watchdog) -> dict:
        if not page.evaluate(FIND_STORE):
            return {"switch_error": "store not found in the React tree"}
        times = []
        for k in tokens:
            want = {"token": k, "entries": entries_of(export / "traces" / f"token-{k:05d}.json")}
            dog.deadline = deadline = time.monotonic() + timeout_s
            try:
                page.evaluate("(k) => { window.__t0 = performance.now(); window.__thesisStore.loadTokenData(k); }", k)
                page.wait_for_function(STATE, arg=want, polling="raf", timeout=ms_left(deadline))
                t = painted(page, deadline) - page.evaluate("window.__t0")
            except PlaywrightError as e:
                times.append({"token": k, "outcome": dog.killed or ("unresponsive" if isinstance(e, PlaywrightTimeout)
                                                                   else "error")})
                return {"switches": times}
            finally:
                dog.deadline = None
            times.append({"token": k, "ms": round(t, 1)})
        ms = sorted(x["ms"] for x in times)
        return {"switches": times, "switch_ms_median": ms[len(ms) // 2], "switch_ms_max": ms[-1],
                "after_switches": {k: v for k, v in metrics(cdp).items() if not k.endswith("_s")}}

    return run


# --------------------------------------------------------------------------- data

def entries_of(trace_file: Path) -> int:
    with open(trace_file) as f:
        return int(json.load(f)["metadata"]["total_entries"])


def token_count(export: Path) -> int:
    return sum(1 for x in (export / "traces").iterdir() if x.name.startswith("token-"))


def export_bytes(export: Path, n: int) -> int:
    """Bytes of the first n tokens' trace and graph files plus the memory map."""
    total = (export / "memory-map.json").stat().st_size
    for k in range(n):
        for d in ("traces", "graphs"):
            total += (export / d / f"token-{k:05d}.json").stat().st_size
    return total


def merge(export: Path, n: int, out: Path) -> dict:
    """A data dir whose traces/token-00000.json holds tokens 0..n-1's entries."""
    (out / "traces").mkdir(parents=True)
    (out / "graphs").mkdir()
    os.symlink(export / "memory-map.json", out / "memory-map.json")
    os.symlink(export / "graphs" / "token-00000.json", out / "graphs" / "token-00000.json")
    dst = out / "traces" / "token-00000.json"
    entries, start, end_ms = 0, None, 0.0
    with open(dst, "w") as w:
        w.write('{"entries":[')
        for k in range(n):
            with open(export / "traces" / f"token-{k:05d}.json") as f:
                t = json.load(f)
            md = t["metadata"]
            if start is None:
                start, head = md["timestamp_start_ns"], t
            for e in t["entries"]:
                e["entry_id"] = entries
                e["timestamp_relative_ms"] = (e["timestamp_ns"] - start) / 1e6
                w.write("," if entries else "")
                w.write(json.dumps(e, separators=(",", ":")))
                entries += 1
            end_ms = (md["ubatch_start_ns"] - start) / 1e6 + md["duration_ms"]
        meta = dict(head["metadata"], total_entries=entries, duration_ms=end_ms)
        rest = {k: v for k, v in head.items() if k not in ("entries", "metadata")}
        w.write("],")
        w.write(json.dumps({"metadata": meta, **rest}, separators=(",", ":"))[1:])
    return {"entries": entries, "merged_trace_bytes": dst.stat().st_size}


def ensure_export(ttrace: str, trace: str, export: Path) -> dict:
    if (export / "memory-map.json").exists() and (export / "traces" / "token-00000.json").exists():
        return {"reused": True}
    t0 = time.monotonic()
    subprocess.run([ttrace, "export", trace, "--format", "tokens-json", "-o", str(export)], check=True,
                   stdout=subprocess.DEVNULL)
    return {"reused": False, "export_s": round(time.monotonic() - t0, 1)}


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--webui", required=True, type=Path, help="the built web UI (its dist/)")
    ap.add_argument("--ttrace", default="ttrace", help="ttrace binary")
    ap.add_argument("--trace", required=True, help="trace file to export")
    ap.add_argument("--export", type=Path, help="tokens-json directory (reused if present; default: temporary)")
    ap.add_argument("--tokens", default="1,10,50,100,167,200,500,1000",
                    help="N for the merged runs (comma-separated); empty for none")
    ap.add_argument("--switches", type=int, default=8, help="token switches timed in the stock run")
    ap.add_argument("--repeat", type=int, default=3, help="merged runs per N (while each renders in 30 s)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for a render")
    ap.add_argument("--rss-limit-mb", type=int, default=12000, help="kill the renderer past this RSS")
    ap.add_argument("--keep-going", action="store_true", help="merged runs past the first failure")
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()), help="where merged files go")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups below

    tmp = None
    if args.export is None:
        tmp = tempfile.mkdtemp(prefix="tokens-json-", dir=args.scratch)
        args.export = Path(tmp) / "export"
    export = args.export.resolve()
    out: dict = {"trace": args.trace, "export_dir": str(export)}
    srv = None
    try:
        out["export"] = ensure_export(args.ttrace, args.trace, export)
        n_tokens = token_count(export)
        out["export"].update(tokens=n_tokens, bytes=export_bytes(export, n_tokens))
        srv, url = serve(args.webui.resolve())

        with sync_playwright() as p:
            # The UI as written: opens token 0 of the whole export, then switches.
            Handler.data_root = export
            step = max(1, (n_tokens - 1) // max(1, args.switches))
            ks = [k for k in range(1, n_tokens, step)][: args.switches] or [0]
            e0 = entries_of(export / "traces" / "token-00000.json")
            stock = {"tokens_exported": n_tokens, "entries": e0}
            stock.update(load(p, url, e0, args.timeout, args.rss_limit_mb,
                              after=switches(export, ks, args.timeout)))
            out["stock"] = stock
            print(json.dumps(stock), file=sys.stderr, flush=True)

            # The UI holding N tokens in one trace file.
            out["merged"] = []
            for n in [int(x) for x in args.tokens.split(",") if x.strip()]:
                if n > n_tokens:
                    continue
                d = Path(tempfile.mkdtemp(prefix=f"merged-{n}-", dir=args.scratch))
                try:
                    run = {"tokens": n, "export_bytes": export_bytes(export, n)}
                    run.update(merge(export, n, d / "data"))
                    Handler.data_root = d / "data"
                    run.update(repeated(p, url, run["entries"], args))
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                out["merged"].append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
                if run["outcome"] not in ("ok", "slow") and not args.keep_going:
                    break
    finally:
        if srv:
            srv.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
