// Drawing the memory map on a 2-D canvas: the grid images blitted segment by
// segment along the stretched byte axis (one drawImage per band), small
// bands from the token × tensor matrix, then labels and highlights. A
// redraw is cheap, so pans and zooms redraw the last answer at once and
// the sharper one replaces it when it arrives.

import type { Band } from "../../api/types";
import type { Ctx } from "../../context";
import { hue, PHASE_COLORS } from "../../ui/colors";
import { bytes as fmtBytes, hex } from "../../ui/format";
import type { Grid, TensorMatrix } from "./data";
import type { YLayout } from "./ylayout";

export const GUTTER = 200;
export const AXIS_TOP = 30;
export const RIGHT = 64;

export interface Rect {
  l: number;
  t: number;
  w: number;
  h: number;
}

export interface Scene {
  ctx: Ctx;
  plot: Rect;
  xAxis: "ubatch" | "time";
  track: "disk" | "buffer";
  x0: number;
  x1: number;
  ylay: YLayout;
  bands: Band[];
  groups: { layer: number; y0: number; y1: number }[];
  /** MoE expert slices of the expert tensors. */
  experts: { expert: number; y0: number; y1: number }[];
  base: Grid | null;
  overlays: Grid[];
  tensors: TensorMatrix | null;
}

export function xToPx(s: Scene, x: number): number {
  return s.plot.l + ((x - s.x0) / (s.x1 - s.x0)) * s.plot.w;
}

export function pxToX(s: Scene, px: number): number {
  return s.x0 + ((px - s.plot.l) / s.plot.w) * (s.x1 - s.x0);
}

export function yToPx(s: Scene, y: number): number {
  return s.plot.t + s.ylay.toPx(y);
}

export function drawScene(g: CanvasRenderingContext2D, s: Scene, width: number, height: number): void {
  g.imageSmoothingEnabled = false;
  g.fillStyle = "#0b0f17";
  g.fillRect(0, 0, width, height);
  const { l, t, w, h } = s.plot;
  g.save();
  g.beginPath();
  g.rect(l, t, w, h);
  g.clip();
  drawBackground(g, s);
  if (s.base) drawGrid(g, s, s.base, true);
  for (const o of s.overlays) drawGrid(g, s, o, false);
  drawExpertSlices(g, s);
  g.restore();
  drawGutter(g, s);
  drawTopAxis(g, s);
  drawByteTicks(g, s);
}

function drawBackground(g: CanvasRenderingContext2D, s: Scene): void {
  const { l, w } = s.plot;
  for (const seg of s.ylay.segs) {
    const y0 = yToPx(s, seg.y0);
    const y1 = s.plot.t + seg.px1;
    g.fillStyle = seg.band >= 0 ? "#1a2130" : "#0b0f17";
    g.fillRect(l, y0, w, Math.max(0.5, y1 - y0));
  }
  // Thin separators between bands that are tall enough to show them.
  g.fillStyle = "rgba(255,255,255,0.06)";
  for (const seg of s.ylay.segs) if (seg.band >= 0 && seg.px1 - seg.px0 > 6) g.fillRect(l, s.plot.t + seg.px0, w, 1);
}

function drawGrid(g: CanvasRenderingContext2D, s: Scene, grid: Grid, isBase: boolean): void {
  const m = grid.meta;
  if (!m.nx || !m.ny) return;
  const dx0 = xToPx(s, m.x_from);
  const dx1 = xToPx(s, m.x_to);
  for (const seg of s.ylay.segs) {
    const py0 = s.plot.t + seg.px0;
    const py1 = s.plot.t + seg.px1;
    if (py1 - py0 <= 0) continue;
    const lo = Math.max(seg.y0, m.y_from);
    const hi = Math.min(seg.y1, m.y_to);
    if (hi <= lo) continue;
    const band = seg.band >= 0 ? s.bands[seg.band] : null;
    // A band finer than a grid row would show its neighbours' bytes: use its own.
    if (isBase && band && band.tensor !== null && seg.y1 - seg.y0 < m.y_bin && s.tensors) {
      drawTensorRow(g, s, band.tensor, py0, py1);
      continue;
    }
    const sy0 = (lo - m.y_from) / m.y_bin;
    const sy1 = (hi - m.y_from) / m.y_bin;
    const f0 = (lo - seg.y0) / (seg.y1 - seg.y0);
    const f1 = (hi - seg.y0) / (seg.y1 - seg.y0);
    const dy0 = py0 + f0 * (py1 - py0);
    const dy1 = py0 + f1 * (py1 - py0);
    g.drawImage(grid.image, 0, sy0, m.nx, Math.max(sy1 - sy0, 1e-3), dx0, dy0, dx1 - dx0, Math.max(dy1 - dy0, 0.5));
  }
}

/** A small band: its row of the tensor matrix image, one blit. */
function drawTensorRow(g: CanvasRenderingContext2D, s: Scene, tensor: number, py0: number, py1: number): void {
  const m = s.tensors;
  const row = m?.rowOf.get(tensor);
  if (!m || row === undefined || !m.image) return;
  const x0 = xToPx(s, m.xFrom);
  const x1 = xToPx(s, m.xFrom + m.nx * m.xBin);
  g.drawImage(m.image, 0, row, m.nx, 1, x0, py0, x1 - x0, Math.max(0.5, py1 - py0));
}

/** Where one expert's slice ends and the next begins, when there is room to see it. */
function drawExpertSlices(g: CanvasRenderingContext2D, s: Scene): void {
  const { l, w, t, h } = s.plot;
  g.fillStyle = "rgba(148,163,184,0.35)";
  g.font = "9px system-ui, sans-serif";
  g.textBaseline = "middle";
  for (const e of s.experts) {
    if (e.y1 <= s.ylay.y0 || e.y0 >= s.ylay.y1) continue;
    const y0 = yToPx(s, e.y0);
    const y1 = yToPx(s, e.y1);
    if (y1 - y0 < 3 || y0 < t || y0 > t + h) continue;
    g.fillRect(l, y0, w, 0.6);
    if (y1 - y0 >= 11) g.fillText(`e${e.expert}`, l + w - 22, (y0 + y1) / 2);
  }
}

function drawGutter(g: CanvasRenderingContext2D, s: Scene): void {
  const { t, h } = s.plot;
  g.save();
  g.beginPath();
  g.rect(0, t, GUTTER, h);
  g.clip();
  g.font = "11px system-ui, sans-serif";
  g.textBaseline = "middle";
  // Layer groups: alternating shades, the block number where it fits.
  s.groups.forEach((grp, i) => {
    const y0 = yToPx(s, grp.y0);
    const y1 = yToPx(s, grp.y1);
    if (y1 <= t || y0 >= t + h) return;
    g.fillStyle = i % 2 ? "#151b27" : "#1b2332";
    g.fillRect(0, y0, 44, Math.max(1, y1 - y0));
    if (y1 - y0 >= 12) {
      g.fillStyle = "#cbd5e1";
      g.fillText(`blk.${grp.layer}`, 4, (Math.max(y0, t) + Math.min(y1, t + h)) / 2);
    }
  });
  for (const seg of s.ylay.segs) {
    if (seg.band < 0) continue;
    const b = s.bands[seg.band];
    const y0 = t + seg.px0;
    const y1 = t + seg.px1;
    g.fillStyle = hue(b.component ?? b.name);
    g.fillRect(GUTTER - 10, y0, 8, Math.max(1, y1 - y0 - 0.3));
    if (y1 - y0 >= 11) {
      g.fillStyle = "#e2e8f0";
      // Disk bands sit in their layer's group, so the component says enough.
      const label = s.track === "disk" && b.layer !== null ? (b.component ?? b.name) : b.name || b.memory;
      g.fillText(fit(g, label, GUTTER - 62), 48, (y0 + y1) / 2);
    }
  }
  g.restore();
}

function fit(g: CanvasRenderingContext2D, text: string, width: number): string {
  if (g.measureText(text).width <= width) return text;
  let s = text;
  while (s.length > 3 && g.measureText(`${s}…`).width > width) s = s.slice(0, -1);
  return `${s}…`;
}

function drawTopAxis(g: CanvasRenderingContext2D, s: Scene): void {
  const { l, w } = s.plot;
  const ub = s.ctx.ub;
  g.save();
  g.beginPath();
  g.rect(l, 0, w, AXIS_TOP);
  g.clip();
  g.font = "10px system-ui, sans-serif";
  g.textBaseline = "top";
  // Phase strip: where each ubatch runs, in its phase's colour; a run of
  // same-phase ubatches narrower than a pixel each is one rectangle.
  const span = (u: number): [number, number] => (s.xAxis === "ubatch" ? [u, u + 1] : [ub.start[u], ub.end[u]]);
  const first = Math.max(0, s.xAxis === "ubatch" ? Math.floor(s.x0) : s.ctx.ubatchAt(s.x0));
  for (let u = first; u < ub.n; ) {
    const x0 = xToPx(s, span(u)[0]);
    if (x0 > l + w) break;
    let v = u;
    while (v + 1 < ub.n && ub.phase[v + 1] === ub.phase[u] && xToPx(s, span(v + 1)[1]) - xToPx(s, span(v + 1)[0]) < 3) v++;
    const x1 = xToPx(s, span(v)[1]);
    g.fillStyle = PHASE_COLORS[s.ctx.phaseName(ub.phase[u])] ?? "#888";
    g.fillRect(x0, AXIS_TOP - 6, Math.max(1, x1 - x0 - (x1 - x0 > 3 ? 1 : 0)), 5);
    u = v + 1;
  }
  g.fillStyle = "#94a3b8";
  const marks = ticks(s.x0, s.x1, w / 70, s.xAxis === "ubatch");
  for (const tick of marks) {
    const x = xToPx(s, tick);
    g.fillRect(x, AXIS_TOP - 10, 1, 4);
    const label = s.xAxis === "ubatch" ? `u${tick}` : timeLabel(tick, marks);
    g.fillText(label, x + 2, 4);
  }
  g.restore();
}

function drawByteTicks(g: CanvasRenderingContext2D, s: Scene): void {
  const { l, t, w, h } = s.plot;
  g.font = "10px system-ui, sans-serif";
  g.textBaseline = "middle";
  g.fillStyle = "#94a3b8";
  const n = Math.max(2, Math.floor(h / 60));
  for (let i = 0; i <= n; i++) {
    const py = t + (i / n) * h;
    const y = s.ylay.toByte(py - t);
    g.fillRect(l + w, py, 4, 1);
    g.fillText(s.ylay.y1 - s.ylay.y0 > 1 << 20 ? fmtBytes(y) : hex(y), l + w + 6, Math.min(t + h - 6, Math.max(t + 6, py)));
  }
}

/** Seconds with as many decimals as the ticks' spacing needs. */
export function timeLabel(ns: number, marks: number[]): string {
  const step = marks.length > 1 ? marks[1] - marks[0] : ns || 1;
  const decimals = Math.min(9, Math.max(0, Math.ceil(-Math.log10(step / 1e9))));
  return `${(ns / 1e9).toFixed(decimals)}s`;
}

/** Round tick positions, about `count` of them. */
export function ticks(a: number, b: number, count: number, integer: boolean): number[] {
  const span = b - a;
  if (!(span > 0) || count < 1) return [];
  let step = 10 ** Math.floor(Math.log10(span / count));
  for (const f of [1, 2, 5, 10]) if (span / (step * f) <= count) return range(a, b, step * f, integer);
  return range(a, b, step * 10, integer);
}

function range(a: number, b: number, step: number, integer: boolean): number[] {
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let x = Math.ceil(a / step) * step; x <= b && out.length < 200; x += step) out.push(x);
  return out;
}

export interface Box {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

/** What the selection lights on the map. */
export interface Highlights {
  /** Selected ubatch's x range. */
  column: [number, number] | null;
  /** The selected sequence's ubatches. */
  seq: [number, number][];
  /** The selected tensor's band(s). */
  tensor: [number, number][];
  layer: [number, number] | null;
  /** The selected expert's slices, across every x. */
  expert: [number, number][];
  /** The selected op's reads, at its ubatch. */
  op: Box[];
  hover: Box | null;
}

export function drawHighlights(g: CanvasRenderingContext2D, s: Scene, hl: Highlights): void {
  const { l, t, w, h } = s.plot;
  g.save();
  g.beginPath();
  g.rect(l, t, w, h);
  g.clip();
  const band = ([y0, y1]: [number, number]) => {
    const a = yToPx(s, y0);
    const b = yToPx(s, y1);
    return [a, Math.max(b - a, 1.5)] as const;
  };
  if (hl.column) {
    const x0 = xToPx(s, hl.column[0]);
    const x1 = xToPx(s, hl.column[1]);
    g.fillStyle = "rgba(255,255,255,0.07)";
    g.fillRect(x0, t, Math.max(1, x1 - x0), h);
    g.strokeStyle = "rgba(255,255,255,0.75)";
    g.lineWidth = 1;
    g.strokeRect(x0 + 0.5, t + 0.5, Math.max(1, x1 - x0) - 1, h - 1);
  }
  for (const r of hl.expert) {
    const [y, hh] = band(r);
    g.fillStyle = "rgba(236,72,153,0.28)";
    g.fillRect(l, y, w, hh);
    g.strokeStyle = "#ec4899";
    g.strokeRect(l + 0.5, y + 0.5, w - 1, Math.max(hh - 1, 0.5));
  }
  for (const r of hl.tensor) {
    const [y, hh] = band(r);
    g.strokeStyle = "#22d3ee";
    g.lineWidth = 1.5;
    g.strokeRect(l + 0.75, y - 0.75, w - 1.5, hh + 1.5);
  }
  g.lineWidth = 2;
  g.strokeStyle = "#facc15";
  for (const b of hl.op) {
    const x0 = xToPx(s, b.x0);
    const x1 = xToPx(s, b.x1);
    const [y, hh] = band([b.y0, b.y1]);
    g.strokeRect(x0 + 1, y - 1, Math.max(2, x1 - x0 - 2), hh + 2);
  }
  if (hl.hover) {
    const x0 = xToPx(s, hl.hover.x0);
    const x1 = xToPx(s, hl.hover.x1);
    const [y, hh] = band([hl.hover.y0, hl.hover.y1]);
    g.lineWidth = 1;
    g.strokeStyle = "rgba(255,255,255,0.9)";
    g.setLineDash([3, 2]);
    g.strokeRect(x0 + 0.5, y + 0.5, Math.max(1, x1 - x0 - 1), Math.max(1, hh - 1));
    g.setLineDash([]);
  }
  g.restore();
  g.fillStyle = "#22d3ee";
  for (const [a, b] of hl.seq) {
    const x0 = Math.max(l, xToPx(s, a));
    const x1 = Math.min(l + w, xToPx(s, b));
    if (x1 > x0) g.fillRect(x0, t - 3, Math.max(1, x1 - x0), 2);
  }
  if (hl.layer) {
    const [y, hh] = band(hl.layer);
    g.fillStyle = "#22d3ee";
    g.fillRect(0, Math.max(y, t), 3, Math.min(hh, h));
  }
}
