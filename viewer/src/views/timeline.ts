// The timeline: a track per phase, ubatch and sequence, layer tracks and op
// slices (traces with --op-timing), and faults, page-cache fills and block
// reads as counters. Each track asks the server for at most ~2 rows per
// pixel; short slices come merged (count > 1). Wheel zooms time, drag pans,
// click selects what the slice is (ubatch, sequence, layer, op).

import { getFrame, getJson, Latest } from "../api/client";
import type { Frame } from "../api/frame";
import type { TimelineTrack } from "../api/types";
import type { Ctx } from "../context";
import type { State } from "../state";
import { hue, OVERLAY_COLORS, PHASE_COLORS, rgb } from "../ui/colors";
import { capture, clearError, fitCanvas, h, showError } from "../ui/dom";
import { bytes, int, ns } from "../ui/format";
import { bucket } from "./memmap/data";
import { ticks, timeLabel } from "./memmap/draw";

const LABEL_W = 118;
const AXIS_H = 18;

type Kind = "phase" | "ubatch" | "seq" | "layer" | "ops" | "counter";

interface Row {
  id: string;
  kind: Kind;
  label: string;
  h: number;
  y: number;
  data: Frame | null;
}

export class Timeline {
  private readonly canvas = h("canvas", { id: "timeline-canvas" });
  private readonly box = h("div", { class: "timeline-box" }, this.canvas);
  private readonly info = h("span", { class: "hint", id: "timeline-info" });
  private rows: Row[] = [];
  private t0 = 0;
  private t1 = 1;
  private layersOpen = false;
  private readonly latest = new Latest();
  private timer = 0;
  private commitTimer = 0;
  private frame = 0;
  private drag: { x: number; y: number; t0: number; t1: number; top: number; moved: boolean } | null = null;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    const toggle = h("button", { id: "timeline-layers", onclick: () => this.toggleLayers(toggle) }, "show layer tracks");
    root.append(h("div", { class: "toolbar" }, h("strong", {}, "Timeline"), toggle, this.info), this.box);
    this.viewFromState(ctx.store.state);
    new ResizeObserver(() => this.refresh()).observe(this.box);
    this.bind();
    ctx.store.subscribe((s, prev) => {
      if (s.tl.t0 !== prev.tl.t0 || s.tl.t1 !== prev.tl.t1) {
        this.viewFromState(s);
        this.refresh();
      } else if (s.sel !== prev.sel) this.draw();
    });
    void getJson<TimelineTrack[]>("timeline/tracks").then(
      (tracks) => {
        this.rows = tracks.map((t) => row(t.id));
        this.layout();
        this.refresh();
      },
      (e) => showError(root, e),
    );
  }

  private toggleLayers(btn: HTMLButtonElement): void {
    this.layersOpen = !this.layersOpen;
    btn.textContent = this.layersOpen ? "hide layer tracks" : "show layer tracks";
    this.layout();
    this.refresh();
  }

  private visibleRows(): Row[] {
    return this.rows.filter((r) => r.kind !== "layer" || this.layersOpen);
  }

  private layout(): void {
    let y = AXIS_H;
    for (const r of this.visibleRows()) {
      r.y = y;
      y += r.h;
    }
    this.canvas.style.height = `${y + 4}px`;
    this.canvas.dataset.tracks = String(this.visibleRows().length);
  }

  private viewFromState(s: State): void {
    const d = this.ctx.duration();
    this.t0 = Math.max(0, s.tl.t0 ?? 0);
    this.t1 = Math.min(d, s.tl.t1 ?? d);
    if (!(this.t1 > this.t0)) [this.t0, this.t1] = [0, d];
  }

  private refresh(): void {
    this.requestDraw();
    clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.fetch(), 30);
  }

  private async fetch(): Promise<void> {
    const w = Math.max(1, this.canvas.clientWidth - LABEL_W);
    const rows = this.visibleRows();
    // 1-D level of detail: at most ~2 rows per pixel, power-of-two buckets.
    const tr = bucket(Math.floor(this.t0), Math.ceil(this.t1), 2 * w);
    const params = (id: string) => ({ track: id, t_from: tr.from, t_to: tr.to, w: Math.max(1, Math.ceil(tr.n / 2)) });
    await this.latest.run(
      () => Promise.all(rows.map((r) => getFrame(r.kind === "counter" ? "timeline/counter" : "timeline/slices", params(r.id)))),
      (frames) => {
        clearError(this.root);
        rows.forEach((r, i) => (r.data = frames[i]));
        this.draw();
      },
      (e) => showError(this.root, e),
    );
  }

  /** One draw per frame however many wheel and pointer events arrive. */
  private requestDraw(): void {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  private x(t: number, w: number): number {
    return LABEL_W + ((t - this.t0) / (this.t1 - this.t0)) * w;
  }

  private draw(): void {
    const { ctx: g, w: width, h: height } = fitCanvas(this.canvas);
    const w = Math.max(1, width - LABEL_W);
    g.fillStyle = "#0b0f17";
    g.fillRect(0, 0, width, height);
    g.font = "10px system-ui, sans-serif";
    g.textBaseline = "middle";
    g.fillStyle = "#94a3b8";
    const marks = ticks(this.t0, this.t1, w / 90, false);
    for (const t of marks) {
      const x = this.x(t, w);
      g.fillRect(x, AXIS_H - 5, 1, 5);
      g.fillText(timeLabel(t, marks), x + 2, 8);
    }
    const sel = this.ctx.store.state.sel;
    if (sel.ubatch !== null && sel.ubatch < this.ctx.ub.n) {
      const x0 = this.x(this.ctx.ub.start[sel.ubatch], w);
      const x1 = this.x(this.ctx.ub.end[sel.ubatch], w);
      g.fillStyle = "rgba(255,255,255,0.08)";
      g.fillRect(x0, AXIS_H, Math.max(1, x1 - x0), height - AXIS_H);
    }
    this.visibleRows().forEach((r, i) => {
      g.fillStyle = i % 2 ? "#0f1520" : "#111a28";
      g.fillRect(0, r.y, width, r.h);
      const selected = (r.kind === "layer" && sel.layer !== null && r.id === `layer:${sel.layer}`) || (r.kind === "seq" && sel.seq !== null && r.id === `seq:${sel.seq}`);
      g.fillStyle = selected ? "#22d3ee" : "#cbd5e1";
      g.fillText(r.label, 6, r.y + r.h / 2);
      if (!r.data) return;
      g.save();
      g.beginPath();
      g.rect(LABEL_W, r.y, w, r.h);
      g.clip();
      if (r.kind === "counter") this.drawCounter(g, r, w);
      else this.drawSlices(g, r, w);
      g.restore();
    });
  }

  private drawSlices(g: CanvasRenderingContext2D, r: Row, w: number): void {
    const f = r.data!;
    const start = f.col("start_ns");
    const end = f.col("end_ns");
    const id = f.col("id");
    const name = f.col("name");
    const count = f.col("count");
    const selOp = this.ctx.store.state.sel.op;
    for (let i = 0; i < f.rows; i++) {
      const x0 = this.x(start[i], w);
      const x1 = Math.max(x0 + 1, this.x(end[i], w));
      const label = this.sliceLabel(r.kind, id[i], name[i], count[i]);
      g.fillStyle = this.sliceColor(r.kind, id[i], name[i]);
      g.globalAlpha = count[i] > 1 ? 0.6 : 1;
      g.fillRect(x0, r.y + 2, Math.max(1, x1 - x0 - 0.5), r.h - 4);
      g.globalAlpha = 1;
      if (r.kind === "ops" && count[i] === 1 && id[i] === selOp) {
        g.strokeStyle = "#facc15";
        g.lineWidth = 2;
        g.strokeRect(x0, r.y + 1, Math.max(2, x1 - x0), r.h - 2);
      }
      if (x1 - x0 > 40 && r.h >= 12) {
        g.fillStyle = "#0b0f17";
        g.fillText(label.length * 6 > x1 - x0 ? label.slice(0, Math.floor((x1 - x0) / 6)) : label, x0 + 3, r.y + r.h / 2);
      }
    }
  }

  private drawCounter(g: CanvasRenderingContext2D, r: Row, w: number): void {
    const f = r.data!;
    const t = f.col("t_ns");
    const v = f.col("value");
    let max = 0;
    for (let i = 0; i < f.rows; i++) max = Math.max(max, v[i]);
    const metric = r.id.replace("counter:", "");
    const color = OVERLAY_COLORS[metric] ?? [148, 163, 184];
    const bin = (f.meta as { t_bin?: number }).t_bin ?? 1;
    g.fillStyle = rgb(color);
    for (let i = 0; i < f.rows; i++) {
      if (!(v[i] > 0)) continue;
      const x0 = this.x(t[i], w);
      const x1 = this.x(t[i] + bin, w);
      const hh = Math.max(1, (v[i] / max) * (r.h - 4));
      g.fillRect(x0, r.y + r.h - 2 - hh, Math.max(1, x1 - x0), hh);
    }
    g.fillStyle = "#94a3b8";
    const isBytes = metric === "cache_fill" || metric === "block_read";
    g.fillText(max ? `max ${isBytes ? bytes(max) : int(max)}` : "none", LABEL_W + w - 80, r.y + 8);
  }

  private sliceLabel(kind: Kind, id: number, name: number, count: number): string {
    if (count > 1) return `${count} slices`;
    switch (kind) {
      case "phase":
        return this.ctx.phaseName(name);
      case "ubatch":
        return `u${id}`;
      case "seq":
        return `seq ${id}`;
      case "layer":
        return `layer ${id}`;
      case "ops":
        return this.ctx.opName(name);
      case "counter":
        return "";
    }
  }

  private sliceColor(kind: Kind, id: number, name: number): string {
    switch (kind) {
      case "phase":
        return PHASE_COLORS[this.ctx.phaseName(name)] ?? "#888";
      case "ubatch":
        return PHASE_COLORS[this.ctx.phaseName(this.ctx.ub.phase[id] ?? 0)] ?? "#888";
      case "ops":
        return hue(this.ctx.opName(name));
      default:
        return hue(`${kind}${id}`);
    }
  }

  private hit(px: number, py: number): { r: Row; i: number } | null {
    const w = Math.max(1, this.canvas.clientWidth - LABEL_W);
    const r = this.visibleRows().find((x) => py >= x.y && py < x.y + x.h);
    if (!r?.data || r.kind === "counter" || px < LABEL_W) return r ? { r, i: -1 } : null;
    const start = r.data.col("start_ns");
    const end = r.data.col("end_ns");
    for (let i = 0; i < r.data.rows; i++) {
      const x0 = this.x(start[i], w);
      const x1 = Math.max(x0 + 2, this.x(end[i], w));
      if (px >= x0 && px <= x1) return { r, i };
    }
    return { r, i: -1 };
  }

  private onClick(px: number, py: number): void {
    const hit = this.hit(px, py);
    if (!hit) return;
    const { r, i } = hit;
    const store = this.ctx.store;
    if (i < 0) {
      if (r.kind === "layer") store.select({ layer: Number(r.id.split(":")[1]) });
      if (r.kind === "seq") store.select({ seq: Number(r.id.split(":")[1]) });
      return;
    }
    const f = r.data!;
    const id = f.col("id")[i];
    const single = f.col("count")[i] === 1;
    if (r.kind === "ubatch" && single) store.select({ ubatch: id, token: this.ctx.ub.nTokens[id] ? this.ctx.ub.firstToken[id] : null });
    else if (r.kind === "seq") store.select({ seq: id });
    else if (r.kind === "layer") store.select({ layer: id });
    else if (r.kind === "ops" && single) store.select({ op: id });
    else {
      // A merged row or a phase: zoom to it.
      this.setRange(f.col("start_ns")[i], f.col("end_ns")[i]);
    }
  }

  private describe(px: number, py: number): string {
    const hit = this.hit(px, py);
    if (!hit || hit.i < 0) return "";
    const f = hit.r.data!;
    const i = hit.i;
    const start = f.col("start_ns")[i];
    const end = f.col("end_ns")[i];
    const label = this.sliceLabel(hit.r.kind, f.col("id")[i], f.col("name")[i], f.col("count")[i]);
    return `${hit.r.label}: ${label} · ${ns(end - start)} at ${(start / 1e9).toFixed(6)} s`;
  }

  private setRange(a: number, b: number): void {
    const d = this.ctx.duration();
    const span = Math.max(1000, b - a);
    this.t0 = Math.max(0, Math.min(a, d - span));
    this.t1 = Math.min(d, this.t0 + span);
    this.refresh();
    clearTimeout(this.commitTimer);
    this.commitTimer = window.setTimeout(() => {
      const whole = this.t0 <= 0 && this.t1 >= d;
      this.ctx.store.update((s) => {
        s.tl.t0 = whole ? null : Math.round(this.t0);
        s.tl.t1 = whole ? null : Math.round(this.t1);
      });
    }, 250);
  }

  private bind(): void {
    const c = this.canvas;
    c.addEventListener(
      "wheel",
      (e) => {
        if (e.shiftKey) return; // scroll the tracks
        e.preventDefault();
        const w = Math.max(1, c.clientWidth - LABEL_W);
        const at = this.t0 + ((e.offsetX - LABEL_W) / w) * (this.t1 - this.t0);
        const f = Math.exp(Math.max(-1, Math.min(1, (e.deltaY || e.deltaX) * 0.0015)));
        const span = (this.t1 - this.t0) * f;
        const frac = (at - this.t0) / (this.t1 - this.t0);
        this.setRange(at - frac * span, at - frac * span + span);
      },
      { passive: false },
    );
    c.addEventListener("pointerdown", (e) => {
      capture(c, e);
      this.drag = { x: e.clientX, y: e.clientY, t0: this.t0, t1: this.t1, top: this.box.scrollTop, moved: false };
    });
    c.addEventListener("pointermove", (e) => {
      const d = this.drag;
      if (!d) {
        this.info.textContent = this.describe(e.offsetX, e.offsetY);
        return;
      }
      const dx = e.clientX - d.x;
      const dy = e.clientY - d.y;
      if (!d.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
      d.moved = true;
      const w = Math.max(1, c.clientWidth - LABEL_W);
      const shift = (-dx * (d.t1 - d.t0)) / w;
      this.setRange(d.t0 + shift, d.t1 + shift);
      this.box.scrollTop = d.top - dy;
    });
    c.addEventListener("pointerup", (e) => {
      const d = this.drag;
      this.drag = null;
      if (d && !d.moved) this.onClick(e.offsetX, e.offsetY);
    });
  }
}

function row(id: string): Row {
  const [kind, rest] = id.includes(":") ? (id.split(":", 2) as [string, string]) : [id, ""];
  const k = (["phase", "ubatch", "seq", "layer", "ops", "counter"].includes(kind) ? kind : "counter") as Kind;
  const labels: Record<Kind, string> = {
    phase: "phase",
    ubatch: "ubatch",
    seq: `sequence ${rest}`,
    layer: `layer ${rest}`,
    ops: `ops (tid ${rest})`,
    counter: rest.replace("_", " "),
  };
  const heights: Record<Kind, number> = { phase: 16, ubatch: 16, seq: 14, layer: 11, ops: 16, counter: 26 };
  return { id, kind: k, label: labels[k], h: heights[k], y: 0, data: null };
}
