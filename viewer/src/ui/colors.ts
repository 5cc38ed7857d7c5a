// Colours: a perceptual ramp for byte counts (log scale: reads span from a
// 512-byte row to a whole tensor per cell) and stable hues for categories.

// Inferno-like stops, dark (few bytes) to bright (max).
const STOPS: [number, number, number][] = [
  [40, 11, 84],
  [101, 21, 110],
  [159, 42, 99],
  [212, 72, 66],
  [245, 125, 21],
  [250, 193, 39],
  [252, 255, 164],
];

export function ramp(t: number): [number, number, number] {
  const x = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const a = STOPS[i];
  const b = STOPS[i + 1];
  return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
}

/** Position of `v` on a log scale from 1 to `max` (0 for v ≤ 0). */
export function logT(v: number, max: number): number {
  if (v <= 0 || max <= 0) return 0;
  return max <= 1 ? 1 : Math.log1p(v) / Math.log1p(max);
}

export function rgb([r, g, b]: [number, number, number], a = 1): string {
  return a === 1 ? `rgb(${r | 0},${g | 0},${b | 0})` : `rgba(${r | 0},${g | 0},${b | 0},${a})`;
}

/** A stable hue per string (op names, components). */
export function hue(s: string): string {
  let x = 2166136261;
  for (let i = 0; i < s.length; i++) x = Math.imul(x ^ s.charCodeAt(i), 16777619);
  return `hsl(${(x >>> 0) % 360},55%,55%)`;
}

export const PHASE_COLORS: Record<string, string> = {
  warmup: "#6b7280",
  prompt: "#3b82f6",
  generate: "#10b981",
  aux: "#a855f7",
  load: "#f59e0b",
};

/** Overlay metrics: their colour on the memory map and counters. */
export const OVERLAY_COLORS: Record<string, [number, number, number]> = {
  fault_major: [239, 68, 68],
  fault_minor: [251, 146, 60],
  cache_fill: [56, 189, 248],
  block_read: [217, 70, 239],
  unused: [148, 163, 184],
};
