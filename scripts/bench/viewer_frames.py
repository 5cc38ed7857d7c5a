"""Front-end timings of `ttrace view` for `cargo xtask bench`: first paint,
and frame times while zooming and panning the memory map and the timeline,
in Debian's headless Chromium driven by Playwright (executable_path: no
browser download).

    viewer_frames.py URL [--steps N]

prints one JSON object:
    {"first_paint_ms": ..., "memmap_zoom": {"frames", "p50_ms", "p95_ms", "fps"},
     "memmap_pan": {...}, "timeline_zoom": {...}}

First paint is from navigation start to the memory map's first drawn answer
(the page's `ttrace:memmap-first-paint` mark). Frame times are the intervals
between animation frames while real wheel and drag input arrives, which
grow past 16.7 ms when a frame's work (events, drawing) overruns."""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# Each recording its own loop: a previous one's last pending frame must not add to it.
RECORD = """() => {
  const id = (window.__recording = (window.__recording || 0) + 1);
  const frames = (window.__frames = []);
  const tick = (t) => { if (window.__recording === id) { frames.push(t); requestAnimationFrame(tick); } };
  requestAnimationFrame(tick);
}"""
STOP = "() => { window.__recording += 1; return window.__frames; }"


def frames(page, act) -> dict:
    page.evaluate(RECORD)
    act()
    page.wait_for_timeout(100)  # the last input's frame
    t = page.evaluate(STOP)
    gaps = sorted(b - a for a, b in zip(t, t[1:]))
    if not gaps:
        raise SystemExit("no animation frame was recorded")
    return {
        "frames": len(gaps),
        "p50_ms": round(statistics.median(gaps), 2),
        "p95_ms": round(gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))], 2),
        "fps": round(1000 / statistics.fmean(gaps), 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--steps", type=int, default=60, help="wheel events and drag moves per gesture")
    args = ap.parse_args()
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                                                   viewport={"width": 1600, "height": 1000})
        page = ctx.new_page()
        page.goto(args.url)
        page.wait_for_selector("#memmap-canvas[data-ready='1']", state="attached", timeout=120_000)
        first = page.evaluate("() => performance.getEntriesByName('ttrace:memmap-first-paint')[0].startTime")
        out = {"first_paint_ms": round(first, 1)}

        mm = page.locator("#memmap-canvas").bounding_box()
        cx, cy = mm["x"] + mm["width"] * 0.6, mm["y"] + mm["height"] * 0.5

        def zoom():
            page.mouse.move(cx, cy)
            for i in range(args.steps):
                page.mouse.wheel(0, -120 if i < args.steps // 2 else 120)

        def pan():
            page.mouse.move(cx, cy)
            page.mouse.down()
            page.mouse.move(cx - 300, cy - 200, steps=args.steps)
            page.mouse.up()

        out["memmap_zoom"] = frames(page, zoom)
        out["memmap_pan"] = frames(page, pan)
        tl = page.locator("#timeline-canvas").bounding_box()

        def timeline_zoom():
            page.mouse.move(tl["x"] + tl["width"] * 0.6, tl["y"] + 30)
            for i in range(args.steps):
                page.mouse.wheel(0, -120 if i < args.steps // 2 else 120)

        out["timeline_zoom"] = frames(page, timeline_zoom)
        ctx.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
