// Fetching what the memory map draws, at the level of detail the server
// picks, and turning it into images. Requests are aligned to the server's
// power-of-two buckets here too, so a small pan repeats the same URL and the
// client cache answers it before the server's does.

import { getFrame, getJson, type Params } from "../../api/client";
import type { Frame } from "../../api/frame";
import type { CellTensor, GridMeta, GridMetric, OverlayMetric } from "../../api/types";
import { PHASES } from "../../api/types";
import type { MemmapState } from "../../state";
import { logT, OVERLAY_COLORS, ramp } from "../../ui/colors";

export interface Range {
  from: number;
  to: number;
  /** Cells of 2^k units. */
  n: number;
  bin: number;
}

/** The server's bucket for `px` pixels over [from, to), and the range widened to it. */
export function bucket(from: number, to: number, px: number): Range {
  const span = Math.max(1, to - from);
  let bin = 1;
  while (span / bin > px) bin *= 2;
  const f = Math.floor(from / bin) * bin;
  const t = Math.max(f + bin, Math.ceil(to / bin) * bin);
  return { from: f, to: t, n: (t - f) / bin, bin };
}

export interface Grid {
  metric: GridMetric;
  meta: GridMeta;
  v: Float32Array;
  /** nx × ny pixels, one per cell (transparent where 0). */
  image: HTMLCanvasElement;
}

export interface GridQuery {
  track: string;
  x: string;
  xr: Range;
  yr: Range;
  filters: Params;
}

export function gridParams(q: GridQuery, metric: GridMetric): Params {
  return {
    track: q.track,
    x: q.x,
    x_from: q.xr.from,
    x_to: q.xr.to,
    y_from: q.yr.from,
    y_to: q.yr.to,
    w: q.xr.n,
    h: q.yr.n,
    metric,
    ...(metric === "read" ? q.filters : {}),
  };
}

export async function loadGrid(q: GridQuery, metric: GridMetric): Promise<Grid> {
  const f = await getFrame<GridMeta>("memmap/grid", gridParams(q, metric));
  const v = f.col("v") as Float32Array;
  return { metric, meta: f.meta, v, image: paint(f.meta, v, metric) };
}

function paint(m: GridMeta, v: Float32Array, metric: GridMetric): HTMLCanvasElement {
  const c = document.createElement("canvas");
  c.width = Math.max(1, m.nx);
  c.height = Math.max(1, m.ny);
  const ctx = c.getContext("2d");
  if (!ctx || !m.nx || !m.ny) return c;
  const img = ctx.createImageData(m.nx, m.ny);
  const px = img.data;
  const overlay = metric === "read" ? null : OVERLAY_COLORS[metric as OverlayMetric];
  for (let ix = 0; ix < m.nx; ix++) {
    for (let iy = 0; iy < m.ny; iy++) {
      const val = v[ix * m.ny + iy];
      if (!(val > 0)) continue;
      const t = logT(val, m.max);
      const o = (iy * m.nx + ix) * 4;
      if (overlay) {
        px[o] = overlay[0];
        px[o + 1] = overlay[1];
        px[o + 2] = overlay[2];
        px[o + 3] = 90 + 165 * t;
      } else {
        const [r, g, b] = ramp(0.08 + 0.92 * t);
        px[o] = r;
        px[o + 1] = g;
        px[o + 2] = b;
        px[o + 3] = 255;
      }
    }
  }
  ctx.putImageData(img, 0, 0);
  return c;
}

/** Bytes per (x bin, tensor): how small bands are coloured. */
export interface TensorMatrix {
  xFrom: number;
  xBin: number;
  nx: number;
  byTensor: Map<number, Float64Array>;
  max: number;
  /** One row of pixels per tensor (`rowOf`), coloured on the grid's scale by `paintTensors`. */
  rowOf: Map<number, number>;
  image: HTMLCanvasElement | null;
}

export async function loadTensorMatrix(q: GridQuery): Promise<TensorMatrix> {
  const f: Frame<{ x_bin: number; x_from: number; nx: number }> = await getFrame("memmap/tensors", {
    x: q.x,
    x_from: q.xr.from,
    x_to: q.xr.to,
    w: q.xr.n,
    ...q.filters,
  });
  const ix = f.col("ix");
  const tensor = f.col("tensor");
  const bytes = f.col("bytes");
  const nx = f.meta.nx;
  const byTensor = new Map<number, Float64Array>();
  let max = 0;
  for (let i = 0; i < f.rows; i++) {
    let row = byTensor.get(tensor[i]);
    if (!row) byTensor.set(tensor[i], (row = new Float64Array(nx)));
    row[ix[i]] += bytes[i];
    max = Math.max(max, row[ix[i]]);
  }
  return { xFrom: f.meta.x_from, xBin: f.meta.x_bin, nx, byTensor, max, rowOf: new Map(), image: null };
}

/** Draws the matrix as an image, one row per tensor, on the colour scale of a grid whose max is `max`. */
export function paintTensors(m: TensorMatrix, max: number): void {
  const c = document.createElement("canvas");
  c.width = Math.max(1, m.nx);
  c.height = Math.max(1, m.byTensor.size);
  const ctx = c.getContext("2d");
  if (!ctx) return;
  const img = ctx.createImageData(c.width, c.height);
  let row = 0;
  for (const [tensor, values] of m.byTensor) {
    m.rowOf.set(tensor, row);
    for (let ix = 0; ix < m.nx; ix++) {
      const v = values[ix];
      if (!(v > 0)) continue;
      const [r, g, b] = ramp(0.08 + 0.92 * logT(v, Math.max(max, v)));
      const o = (row * c.width + ix) * 4;
      img.data[o] = r;
      img.data[o + 1] = g;
      img.data[o + 2] = b;
      img.data[o + 3] = 255;
    }
    row++;
  }
  ctx.putImageData(img, 0, 0);
  m.image = c;
}

export interface CellBox {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

/** `memmap/cell` parameters for a box, with the read filters the map shows. */
export function cellParams(mm: MemmapState, box: CellBox): Params {
  return {
    track: mm.track,
    x: mm.x,
    x_from: box.x0,
    x_to: box.x1,
    y_from: box.y0,
    y_to: box.y1,
    memory: mm.memory === "all" ? undefined : mm.memory,
    op: mm.ops,
    phase: mm.phases.map((p) => PHASES[p]),
  };
}

/** f32 holds every integer below this exactly. */
const F32_EXACT = 1 << 24;

/**
 * The lit cells of one tensor inside `box`, with its own bytes: a cell that
 * also covers a neighbour (at the tensor's ends), or whose total could be
 * rounded in f32, is asked for exactly (`memmap/cell`, per tensor).
 */
export async function tensorCells(g: Grid, mm: MemmapState, box: CellBox, tensor: number): Promise<(CellBox & { v: number })[]> {
  const cells = litCells(g, box.x0, box.x1, box.y0, box.y1);
  return (
    await Promise.all(
      cells.map(async (c) => {
        if (c.y0 >= box.y0 && c.y1 <= box.y1 && c.v < F32_EXACT) return c;
        const got = await getJson<{ tensors: CellTensor[] }>("memmap/cell", cellParams(mm, c));
        return { ...c, v: got.tensors.find((t) => t.tensor === tensor)?.read_bytes ?? 0 };
      }),
    )
  ).filter((c) => c.v > 0);
}

/** Cells of `g` with a value, inside [y0, y1) and x range [x0, x1) (for tests and the selection). */
export function litCells(g: Grid, x0: number, x1: number, y0: number, y1: number): { x0: number; x1: number; y0: number; y1: number; v: number }[] {
  const m = g.meta;
  const out = [];
  for (let ix = 0; ix < m.nx; ix++) {
    const cx0 = m.x_from + ix * m.x_bin;
    const cx1 = cx0 + m.x_bin;
    if (cx1 <= x0 || cx0 >= x1) continue;
    for (let iy = 0; iy < m.ny; iy++) {
      const cy0 = m.y_from + iy * m.y_bin;
      const cy1 = cy0 + m.y_bin;
      if (cy1 <= y0 || cy0 >= y1) continue;
      const v = g.v[ix * m.ny + iy];
      if (v > 0) out.push({ x0: cx0, x1: cx1, y0: cy0, y1: cy1, v });
    }
  }
  return out;
}
