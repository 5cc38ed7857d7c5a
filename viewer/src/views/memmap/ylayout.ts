// The memory map's byte axis. Bytes map to pixels linearly inside each
// segment (a tensor band, or the gap between two), but a band keeps a
// minimum height however small it is, so a 1 KiB norm weight next to a
// 170 MiB embedding stays visible and hoverable; the big bands shrink to
// make room. With the minimum off, the axis is plainly linear.

export interface Segment {
  y0: number;
  y1: number;
  /** Index into the bands list, or -1 for a gap. */
  band: number;
  px0: number;
  px1: number;
}

export class YLayout {
  readonly segs: Segment[];

  constructor(
    readonly y0: number,
    readonly y1: number,
    readonly height: number,
    bands: readonly { y0: number; y1: number }[],
    minPx: number,
  ) {
    this.segs = layout(y0, y1, height, bands, minPx);
  }

  /** Pixel of byte `y` (clamped to the view). */
  toPx(y: number): number {
    const segs = this.segs;
    if (!segs.length || y <= this.y0) return 0;
    if (y >= this.y1) return this.height;
    const s = segs[this.segAtByte(y)];
    return s.px0 + ((y - s.y0) / (s.y1 - s.y0)) * (s.px1 - s.px0);
  }

  /** Byte at pixel `px`. */
  toByte(px: number): number {
    const segs = this.segs;
    if (!segs.length || px <= 0) return this.y0;
    if (px >= this.height) return this.y1;
    const s = segs[this.segAtPx(px)];
    const span = s.px1 - s.px0;
    return span <= 0 ? s.y0 : s.y0 + ((px - s.px0) / span) * (s.y1 - s.y0);
  }

  segAtByte(y: number): number {
    return lastAtOrBefore(this.segs, y, (s) => s.y0);
  }

  segAtPx(px: number): number {
    return lastAtOrBefore(this.segs, px, (s) => s.px0);
  }
}

function lastAtOrBefore(segs: Segment[], v: number, key: (s: Segment) => number): number {
  let lo = 0;
  let hi = segs.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (key(segs[mid]) <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

function layout(y0: number, y1: number, height: number, bands: readonly { y0: number; y1: number }[], minPx: number): Segment[] {
  const segs: Segment[] = [];
  let at = y0;
  // Bands are sorted by y0 and do not overlap (tensors of one file).
  let i = firstEnding(bands, y0);
  for (; i < bands.length && bands[i].y0 < y1; i++) {
    const b0 = Math.max(bands[i].y0, y0);
    const b1 = Math.min(bands[i].y1, y1);
    if (b1 <= at) continue;
    if (b0 > at) segs.push({ y0: at, y1: b0, band: -1, px0: 0, px1: 0 });
    segs.push({ y0: Math.max(b0, at), y1: b1, band: i, px0: 0, px1: 0 });
    at = b1;
  }
  if (at < y1) segs.push({ y0: at, y1, band: -1, px0: 0, px1: 0 });

  const nBands = segs.filter((s) => s.band >= 0).length;
  // With more bands than the height holds, the minimum shrinks so that
  // bands take at most half the height: the rest stays proportional.
  const min = nBands ? Math.min(minPx, height / 2 / nBands) : 0;
  const natural = segs.map((s) => ((s.y1 - s.y0) * height) / (y1 - y0));
  const small = segs.map((s, k) => s.band >= 0 && min > 0 && natural[k] < min);
  // Grow the small bands to `min`, scale the others by k to fit; a band that
  // falls below `min` after scaling joins the small ones (a few rounds).
  let k = 1;
  for (let round = 0; round < 8; round++) {
    let fixed = 0;
    let rest = 0;
    segs.forEach((_, j) => (small[j] ? (fixed += min) : (rest += natural[j])));
    k = rest > 0 ? Math.max(0, height - fixed) / rest : 0;
    let grew = false;
    segs.forEach((s, j) => {
      if (!small[j] && s.band >= 0 && min > 0 && natural[j] * k < min) {
        small[j] = true;
        grew = true;
      }
    });
    if (!grew) break;
  }
  let px = 0;
  segs.forEach((s, j) => {
    s.px0 = px;
    px += small[j] ? min : natural[j] * k;
    s.px1 = px;
  });
  // Rounding drift: the last segment ends at the height exactly.
  if (segs.length) segs[segs.length - 1].px1 = height;
  return segs;
}

/** First band whose end is past `y` (bands sorted by y0, disjoint). */
function firstEnding(bands: readonly { y0: number; y1: number }[], y: number): number {
  let lo = 0;
  let hi = bands.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (bands[mid].y1 <= y) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
