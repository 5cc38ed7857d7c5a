// Number formatting shared by the views.

export function bytes(n: number): string {
  if (!Number.isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(Math.abs(v) < 10 ? 2 : 1)} ${units[i]}`;
}

/** Exact integer with thin separators (tooltips show exact figures). */
export function int(n: number): string {
  return Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "–";
}

export function ns(n: number): string {
  if (!Number.isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a < 1e3) return `${n} ns`;
  if (a < 1e6) return `${(n / 1e3).toFixed(1)} µs`;
  if (a < 1e9) return `${(n / 1e6).toFixed(a < 1e7 ? 2 : 1)} ms`;
  return `${(n / 1e9).toFixed(3)} s`;
}

export function hex(n: number): string {
  return `0x${Math.round(n).toString(16)}`;
}
