// The memory map: x = ubatch (token) or time, y = bytes of the disk track
// (the GGUF files end to end) or of the buffer track (copies and anonymous
// regions); colour = bytes ops read, with fault, page-cache, block-read and
// loaded-but-unused overlays. Wheel zooms (y; shift: x; ctrl: both), drag
// pans both axes, click selects the tensor and ubatch under the cursor,
// double-click zooms to a band.

import { getJson, Latest } from "../../api/client";
import type { Band, Bands, GridMetric, Track } from "../../api/types";
import { PHASES } from "../../api/types";
import type { Ctx } from "../../context";
import { changed, type State } from "../../state";
import { ramp as rampColor, rgb } from "../../ui/colors";
import { capture, clear, clearError, fitCanvas, h, showError } from "../../ui/dom";
import { bytes as fmtBytes, ns as fmtNs } from "../../ui/format";
import { bucket, type Grid, type GridQuery, litCells, loadGrid, loadTensorMatrix, type TensorMatrix, paintTensors, tensorCells } from "./data";
import { AXIS_TOP, type Box, drawHighlights, drawScene, GUTTER, type Highlights, pxToX, RIGHT, type Scene, xToPx, yToPx } from "./draw";
import { toolbar } from "./toolbar";
import { CellTooltip } from "./tooltip";
import { YLayout } from "./ylayout";

const MIN_BAND_PX = 4;
export const FIRST_PAINT = "ttrace:memmap-first-paint";
const MIN_Y_SPAN = 64;

interface View {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

interface OpReads {
  op: number;
  ubatch: number | null;
  reads: { tensor: number; y0: number; y1: number }[];
}

export class MemmapView {
  private readonly canvas = h("canvas", { id: "memmap-canvas", "data-ready": "0" });
  private readonly tooltip: CellTooltip;
  private readonly legend = h("span", { class: "legend", id: "memmap-legend" });
  private bands = new Map<Track, Bands>();
  private view: View = { x0: 0, x1: 1, y0: 0, y1: 1 };
  private base: Grid | null = null;
  private overlays: Grid[] = [];
  private tensors: TensorMatrix | null = null;
  private scene: Scene | null = null;
  private opReads: OpReads | null = null;
  private hover: Box | null = null;
  /** What `data-lit-cells` was computed for. */
  private litKey = "";
  private frame = 0;
  private readonly latest = new Latest();
  private fetchTimer = 0;
  private commitTimer = 0;
  private drag: { px: number; py: number; view: View; bpp: number; moved: boolean } | null = null;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    const plot = h("div", { class: "memmap-plot" }, this.canvas);
    this.tooltip = new CellTooltip(ctx, plot);
    const bar = toolbar(ctx);
    bar.append(this.legend);
    root.append(bar, plot);
    new ResizeObserver(() => this.refresh()).observe(plot);
    this.bindEvents();
    ctx.store.subscribe((s, prev) => this.onState(s, prev));
    this.viewFromState(ctx.store.state);
    void this.loadBands(ctx.store.state.mm.track).then(() => this.refresh());
  }

  // ------------------------------------------------------------ state

  private onState(s: State, prev: State): void {
    const mm = s.mm;
    const pm = prev.mm;
    if (mm.track !== pm.track || mm.x !== pm.x) {
      this.base = null;
      this.overlays = [];
      this.tensors = null;
    }
    if (mm.x0 !== pm.x0 || mm.x1 !== pm.x1 || mm.y0 !== pm.y0 || mm.y1 !== pm.y1 || mm.x !== pm.x || mm.track !== pm.track) {
      this.viewFromState(s);
    }
    if (s.sel.op !== prev.sel.op) void this.loadOp(s.sel.op);
    if (changed(mm, pm)) {
      void this.loadBands(mm.track).then(() => this.refresh());
    } else if (changed(s.sel, prev.sel)) {
      this.draw();
    }
  }

  private viewFromState(s: State): void {
    const mm = s.mm;
    const xMax = mm.x === "ubatch" ? Math.max(1, this.ctx.ub.n) : this.ctx.duration();
    const yMax = this.trackSize(mm.track);
    const x0 = clamp(mm.x0 ?? 0, 0, xMax);
    const x1 = clamp(mm.x1 ?? xMax, 0, xMax);
    const y0 = clamp(mm.y0 ?? 0, 0, yMax);
    const y1 = clamp(mm.y1 ?? yMax, 0, yMax);
    this.view = { x0, x1: x1 > x0 ? x1 : xMax, y0, y1: y1 > y0 ? y1 : yMax };
  }

  private trackSize(t: Track): number {
    return Math.max(1, this.bands.get(t)?.size ?? this.ctx.meta.tracks[t]?.size ?? 1);
  }

  private async loadBands(track: Track): Promise<void> {
    if (this.bands.has(track)) return;
    try {
      const b = await getJson<Bands>("memmap/bands", { track });
      b.bands.sort((p, q) => p.y0 - q.y0);
      b.groups.sort((p, q) => p.y0 - q.y0);
      this.bands.set(track, b);
      this.viewFromState(this.ctx.store.state);
    } catch (e) {
      showError(this.root, e);
    }
  }

  /** Writes the live view to the URL once an interaction settles (no replaceState per frame). */
  private commitView(): void {
    clearTimeout(this.commitTimer);
    this.commitTimer = window.setTimeout(() => {
      const v = this.view;
      const whole = this.wholeView();
      this.ctx.store.update((s) => {
        s.mm.x0 = v.x0 === whole.x0 && v.x1 === whole.x1 ? null : round(v.x0);
        s.mm.x1 = v.x0 === whole.x0 && v.x1 === whole.x1 ? null : round(v.x1);
        s.mm.y0 = v.y0 === whole.y0 && v.y1 === whole.y1 ? null : Math.round(v.y0);
        s.mm.y1 = v.y0 === whole.y0 && v.y1 === whole.y1 ? null : Math.round(v.y1);
      });
    }, 250);
  }

  private wholeView(): View {
    const mm = this.ctx.store.state.mm;
    return {
      x0: 0,
      x1: mm.x === "ubatch" ? Math.max(1, this.ctx.ub.n) : this.ctx.duration(),
      y0: 0,
      y1: this.trackSize(mm.track),
    };
  }

  // ------------------------------------------------------------ data

  private refresh(): void {
    // Not ready from the moment the view changes until its answer is drawn.
    this.canvas.dataset.ready = "0";
    this.requestDraw();
    clearTimeout(this.fetchTimer);
    this.fetchTimer = window.setTimeout(() => void this.fetch(), 30);
  }

  private query(): GridQuery | null {
    const sc = this.scene;
    if (!sc || sc.plot.w < 2 || sc.plot.h < 2) return null;
    const mm = this.ctx.store.state.mm;
    const dpr = window.devicePixelRatio || 1;
    const v = this.view;
    // Whole units on the x axis: ubatches and nanoseconds.
    const xr = bucket(Math.floor(v.x0), Math.ceil(v.x1), Math.round(sc.plot.w * dpr));
    const yr = bucket(Math.floor(v.y0), Math.ceil(v.y1), Math.round(sc.plot.h * dpr));
    return {
      track: mm.track,
      x: mm.x,
      xr,
      yr,
      filters: { memory: mm.memory === "all" ? undefined : mm.memory, op: mm.ops, phase: mm.phases.map((p) => PHASES[p]) },
    };
  }

  private async fetch(): Promise<void> {
    if (!this.scene) this.draw();
    const q = this.query();
    if (!q) return;
    const mm = this.ctx.store.state.mm;
    const wantTensors = mm.track === "disk" && mm.minBand;
    await this.latest.run(
      () =>
        Promise.all([
          loadGrid(q, "read"),
          Promise.all(mm.overlays.map((m: GridMetric) => loadGrid(q, m))),
          wantTensors ? loadTensorMatrix(q) : Promise.resolve(null),
        ]),
      ([base, overlays, tensors]) => {
        clearError(this.root);
        this.base = base;
        this.overlays = overlays;
        this.tensors = tensors;
        if (tensors) paintTensors(tensors, base.meta.max);
        this.showLegend(base);
        this.draw();
        this.canvas.dataset.ready = "1";
        // First paint of real data, for `cargo xtask bench` (scripts/bench/viewer_frames.py).
        if (!performance.getEntriesByName(FIRST_PAINT).length) performance.mark(FIRST_PAINT);
      },
      (e) => showError(this.root, e),
    );
  }

  /** The colour scale of this answer: bytes read per cell, and what a cell spans. */
  private showLegend(g: Grid): void {
    const m = g.meta;
    const ramp = h("canvas", { class: "legend-ramp", width: 96, height: 10 });
    const c = ramp.getContext("2d");
    if (c) for (let i = 0; i < 96; i++) (c.fillStyle = rgb(rampColor(0.08 + (0.92 * i) / 95))), c.fillRect(i, 0, 1, 10);
    const xUnit = this.ctx.store.state.mm.x === "ubatch" ? (m.x_bin === 1 ? "1 ubatch" : `${m.x_bin} ubatches`) : fmtNs(m.x_bin);
    clear(this.legend);
    this.legend.append("bytes read: 1 B ", ramp, ` ${fmtBytes(m.max)} per cell (${xUnit} × ${fmtBytes(m.y_bin)}, log)`);
  }

  private async loadOp(op: number | null): Promise<void> {
    if (op === null) {
      this.opReads = null;
      return this.draw();
    }
    try {
      const o = await getJson<OpReads>(`op/${op}`);
      if (this.ctx.store.state.sel.op === op) {
        this.opReads = o;
        this.draw();
      }
    } catch (e) {
      showError(this.root, e);
    }
  }

  // ------------------------------------------------------------ drawing

  /** One draw per frame however many wheel and pointer events arrive. */
  private requestDraw(): void {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  private draw(): void {
    const { ctx: g, w, h: height } = fitCanvas(this.canvas);
    const track = this.ctx.store.state.mm.track;
    const b = this.bands.get(track);
    const plot = { l: GUTTER, t: AXIS_TOP, w: Math.max(1, w - GUTTER - RIGHT), h: Math.max(1, height - AXIS_TOP - 4) };
    const v = this.view;
    const bands: Band[] = b?.bands ?? [];
    const ylay = new YLayout(v.y0, v.y1, plot.h, bands, this.ctx.store.state.mm.minBand ? MIN_BAND_PX : 0);
    this.scene = {
      ctx: this.ctx,
      plot,
      xAxis: this.ctx.store.state.mm.x,
      track,
      x0: v.x0,
      x1: v.x1,
      ylay,
      bands,
      groups: b?.groups ?? [],
      experts: b?.experts ?? [],
      base: this.base,
      overlays: this.overlays,
      tensors: this.tensors,
    };
    drawScene(g, this.scene, w, height);
    const hl = this.highlights(b);
    drawHighlights(g, this.scene, hl);
    this.publish(hl);
  }

  private highlights(b: Bands | undefined): Highlights {
    const s = this.ctx.store.state;
    const sel = s.sel;
    const col = sel.ubatch !== null ? this.ubatchX(sel.ubatch) : null;
    const tensorRanges = (b?.bands ?? []).filter((x) => x.tensor !== null && x.tensor === sel.tensor).map((x): [number, number] => [x.y0, x.y1]);
    const group = sel.layer !== null ? b?.groups.find((g) => g.layer === sel.layer) : undefined;
    const expert =
      sel.expert && b
        ? b.experts
            .filter((x) => x.expert === sel.expert![1] && this.ctx.tensor(x.tensor)?.layer === sel.expert![0])
            .map((x): [number, number] => [x.y0, x.y1])
        : [];
    const op: Box[] = [];
    const o = this.opReads;
    if (o && o.ubatch !== null && s.mm.track === "disk") {
      const [x0, x1] = this.ubatchX(o.ubatch);
      for (const r of o.reads ?? []) op.push({ x0, x1, y0: r.y0, y1: r.y1 });
    }
    const seq: [number, number][] = [];
    if (sel.seq !== null) for (let u = 0; u < this.ctx.ub.n; u++) if (this.ctx.ub.seq[u] === sel.seq) seq.push(this.ubatchX(u));
    return { column: col, seq, tensor: tensorRanges, layer: group ? [group.y0, group.y1] : null, expert, op, hover: this.hover };
  }

  private ubatchX(u: number): [number, number] {
    return this.ctx.store.state.mm.x === "ubatch" ? [u, u + 1] : [this.ctx.ub.start[u], this.ctx.ub.end[u]];
  }

  /** What tests read: the served grid and the lit cells of the selected tensor in the selected ubatch. */
  private publish(hl: Highlights): void {
    const c = this.canvas;
    c.dataset.expertSlices = JSON.stringify(hl.expert);
    c.dataset.tensorBands = JSON.stringify(hl.tensor);
    const base = this.base;
    const sel = this.ctx.store.state.sel;
    c.dataset.view = JSON.stringify(this.view);
    if (!base) return;
    c.dataset.grid = JSON.stringify(base.meta);
    const t = this.ctx.tensor(sel.tensor);
    const mm = this.ctx.store.state.mm;
    if (!t || sel.ubatch === null || mm.track !== "disk") {
      this.litKey = "";
      delete c.dataset.litCells;
      return;
    }
    const [x0, x1] = this.ubatchX(sel.ubatch);
    const key = JSON.stringify([base.meta, t.id, x0, mm.memory, mm.ops, mm.phases]);
    if (key === this.litKey) return;
    this.litKey = key;
    delete c.dataset.litCells;
    void tensorCells(base, mm, { x0, x1, y0: t.y0, y1: t.y0 + t.size }, t.id).then((cells) => {
      if (this.litKey === key) c.dataset.litCells = JSON.stringify(cells.map((k) => [k.y0, k.y1, k.v]));
    });
  }

  /** Test hook: where (client pixels) x and byte y are drawn now; `x` null: the gutter. */
  point(x: number | null, y: number): { x: number; y: number } | null {
    const sc = this.scene;
    if (!sc) return null;
    const r = this.canvas.getBoundingClientRect();
    return { x: r.left + (x === null ? GUTTER / 2 : xToPx(sc, x)), y: r.top + yToPx(sc, y) };
  }

  /** Test hook: lit cells of the current base grid within a box. */
  lit(box: Box) {
    return this.base ? litCells(this.base, box.x0, box.x1, box.y0, box.y1) : [];
  }

  // ------------------------------------------------------------ interaction

  private bindEvents(): void {
    const c = this.canvas;
    c.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    c.addEventListener("pointerdown", (e) => {
      const sc = this.scene;
      if (!sc) return;
      capture(c, e);
      const seg = sc.ylay.segs[sc.ylay.segAtPx(e.offsetY - sc.plot.t)];
      const linear = (this.view.y1 - this.view.y0) / sc.plot.h;
      const bpp = seg && seg.px1 - seg.px0 > 2 ? (seg.y1 - seg.y0) / (seg.px1 - seg.px0) : linear;
      this.drag = { px: e.offsetX, py: e.offsetY, view: { ...this.view }, bpp, moved: false };
    });
    c.addEventListener("pointermove", (e) => this.onMove(e));
    c.addEventListener("pointerup", (e) => {
      const d = this.drag;
      this.drag = null;
      if (d && !d.moved) this.onClick(e);
    });
    c.addEventListener("pointerleave", () => {
      this.hover = null;
      this.tooltip.hide();
      this.requestDraw();
    });
    c.addEventListener("dblclick", (e) => this.onDoubleClick(e));
  }

  private onWheel(e: WheelEvent): void {
    const sc = this.scene;
    if (!sc) return;
    e.preventDefault();
    const delta = e.deltaY || e.deltaX;
    const f = Math.exp(Math.max(-1, Math.min(1, delta * 0.0015)));
    const inAxis = e.offsetY < sc.plot.t;
    const inGutter = e.offsetX < sc.plot.l;
    const zoomX = inAxis || (!inGutter && (e.shiftKey || e.ctrlKey));
    const zoomY = inGutter || (!inAxis && !e.shiftKey);
    const whole = this.wholeView();
    const v = { ...this.view };
    if (zoomX) {
      const xa = pxToX(sc, e.offsetX);
      const minX = this.ctx.store.state.mm.x === "ubatch" ? 1 : 1000;
      [v.x0, v.x1] = zoom(v.x0, v.x1, xa, f, minX, whole.x0, whole.x1);
    }
    if (zoomY) {
      const ya = sc.ylay.toByte(e.offsetY - sc.plot.t);
      [v.y0, v.y1] = zoom(v.y0, v.y1, ya, f, MIN_Y_SPAN, whole.y0, whole.y1);
    }
    this.setView(v);
  }

  private onMove(e: PointerEvent): void {
    const sc = this.scene;
    if (!sc) return;
    const d = this.drag;
    if (d) {
      const dx = e.offsetX - d.px;
      const dy = e.offsetY - d.py;
      if (!d.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
      d.moved = true;
      this.tooltip.hide();
      const whole = this.wholeView();
      const sx = (-dx * (d.view.x1 - d.view.x0)) / sc.plot.w;
      const sy = -dy * d.bpp;
      const [x0, x1] = shift(d.view.x0, d.view.x1, sx, whole.x0, whole.x1);
      const [y0, y1] = shift(d.view.y0, d.view.y1, sy, whole.y0, whole.y1);
      this.setView({ x0, x1, y0, y1 });
      return;
    }
    const cell = this.cellAt(e.offsetX, e.offsetY);
    this.hover = cell?.box ?? null;
    this.requestDraw();
    if (cell) this.tooltip.show(cell.box, cell.band, e.offsetX, e.offsetY, sc, this.tensors);
    else this.tooltip.hide();
  }

  /** The grid cell under a point, narrowed to a small band's own bytes. */
  private cellAt(px: number, py: number): { box: Box; band: Band | null } | null {
    const sc = this.scene;
    const m = this.base?.meta;
    if (!sc || !m || px < sc.plot.l || px > sc.plot.l + sc.plot.w || py < sc.plot.t || py > sc.plot.t + sc.plot.h) return null;
    const x = pxToX(sc, px);
    const ix = Math.floor((x - m.x_from) / m.x_bin);
    const x0 = m.x_from + ix * m.x_bin;
    const seg = sc.ylay.segs[sc.ylay.segAtPx(py - sc.plot.t)];
    if (!seg) return null;
    const band = seg.band >= 0 ? sc.bands[seg.band] : null;
    const y = sc.ylay.toByte(py - sc.plot.t);
    let y0 = m.y_from + Math.floor((y - m.y_from) / m.y_bin) * m.y_bin;
    let y1 = y0 + m.y_bin;
    if (band && band.y1 - band.y0 <= m.y_bin) [y0, y1] = [band.y0, band.y1];
    return { box: { x0, x1: x0 + m.x_bin, y0, y1 }, band };
  }

  private onClick(e: PointerEvent): void {
    const sc = this.scene;
    if (!sc) return;
    if (e.offsetY < sc.plot.t) return;
    const seg = sc.ylay.segs[sc.ylay.segAtPx(e.offsetY - sc.plot.t)];
    const band = seg && seg.band >= 0 ? sc.bands[seg.band] : null;
    if (e.offsetX < sc.plot.l) {
      // Gutter: the layer column selects the layer, the rest the tensor.
      if (e.offsetX < 44 && band?.layer !== null && band?.layer !== undefined) this.ctx.store.select({ layer: band.layer });
      else this.ctx.store.select({ tensor: band?.tensor ?? null });
      return;
    }
    const x = pxToX(sc, e.offsetX);
    const u = this.ctx.store.state.mm.x === "ubatch" ? Math.floor(x) : this.ctx.ubatchAt(x);
    const ub = u >= 0 && u < this.ctx.ub.n ? u : null;
    this.ctx.store.select({
      tensor: band?.tensor ?? null,
      ubatch: ub,
      token: ub !== null && this.ctx.ub.nTokens[ub] > 0 ? this.ctx.ub.firstToken[ub] : null,
    });
  }

  private onDoubleClick(e: MouseEvent): void {
    const sc = this.scene;
    if (!sc) return;
    const seg = sc.ylay.segs[sc.ylay.segAtPx(e.offsetY - sc.plot.t)];
    const band = seg && seg.band >= 0 ? sc.bands[seg.band] : null;
    const whole = this.wholeView();
    if (band && (band.y0 > this.view.y0 || band.y1 < this.view.y1)) {
      const pad = Math.max(16, (band.y1 - band.y0) * 0.02);
      this.setView({ ...this.view, y0: Math.max(whole.y0, band.y0 - pad), y1: Math.min(whole.y1, band.y1 + pad) });
    } else {
      this.setView({ ...this.view, y0: whole.y0, y1: whole.y1 });
    }
  }

  private setView(v: View): void {
    this.view = v;
    this.refresh();
    this.commitView();
  }
}

function clamp(v: number, lo: number, hi: number): number {
  return Math.min(hi, Math.max(lo, v));
}

function round(v: number): number {
  return Math.round(v * 1000) / 1000;
}

/** [a, b) scaled by `f` around `at`, at least `min` wide, inside [lo, hi]. */
function zoom(a: number, b: number, at: number, f: number, min: number, lo: number, hi: number): [number, number] {
  let span = Math.min(hi - lo, Math.max(min, (b - a) * f));
  const frac = b > a ? (at - a) / (b - a) : 0.5;
  let na = at - frac * span;
  if (na < lo) na = lo;
  if (na + span > hi) na = hi - span;
  span = Math.min(span, hi - na);
  return [na, na + span];
}

function shift(a: number, b: number, by: number, lo: number, hi: number): [number, number] {
  const span = b - a;
  const na = clamp(a + by, lo, hi - span);
  return [na, na + span];
}
