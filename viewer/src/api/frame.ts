// Decoder of the binary column frames (docs/VIEW_API.md, "Binary columns"):
// "TTC1", u32 LE header length, JSON header, then each column 8-byte aligned.
// Columns are viewed in place; u64 columns are widened to f64 (exact below
// 2^53, which covers every op seq, time and byte count of a trace) so views
// do plain arithmetic, with the NONE sentinel mapped to NaN.

export type ColumnType = "u8" | "u32" | "i32" | "u64" | "f32" | "f64";
export type Column = Uint8Array | Uint32Array | Int32Array | Float32Array | Float64Array;

export interface FrameHeader<M> {
  rows: number;
  columns: { name: string; type: ColumnType }[];
  meta: M;
}

export class Frame<M = Record<string, unknown>> {
  constructor(
    readonly rows: number,
    readonly meta: M,
    private readonly cols: Map<string, Column>,
  ) {}

  col(name: string): Column {
    const c = this.cols.get(name);
    if (!c) throw new FrameError(`answer has no column \`${name}\``);
    return c;
  }

  has(name: string): boolean {
    return this.cols.has(name);
  }
}

export class FrameError extends Error {}

/** `0xFFFFFFFF`: no value, in u32 columns. */
export const NONE_U32 = 0xffffffff;

const SIZE: Record<ColumnType, number> = { u8: 1, u32: 4, i32: 4, u64: 8, f32: 4, f64: 8 };
const NONE_U64 = 0xffffffffffffffffn;

export function decodeFrame<M>(buf: ArrayBuffer): Frame<M> {
  const dv = new DataView(buf);
  if (buf.byteLength < 8 || new TextDecoder().decode(new Uint8Array(buf, 0, 4)) !== "TTC1") {
    throw new FrameError("not a TTC1 column frame");
  }
  const headerLen = dv.getUint32(4, true);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, headerLen))) as FrameHeader<M>;
  let at = align8(8 + headerLen);
  const cols = new Map<string, Column>();
  for (const { name, type } of header.columns) {
    const bytes = header.rows * SIZE[type];
    if (at + bytes > buf.byteLength) throw new FrameError(`column \`${name}\` runs past the end of the frame`);
    cols.set(name, view(buf, at, header.rows, type));
    at = align8(at + bytes);
  }
  return new Frame<M>(header.rows, header.meta, cols);
}

function view(buf: ArrayBuffer, at: number, n: number, type: ColumnType): Column {
  switch (type) {
    case "u8":
      return new Uint8Array(buf, at, n);
    case "u32":
      return new Uint32Array(buf, at, n);
    case "i32":
      return new Int32Array(buf, at, n);
    case "f32":
      return new Float32Array(buf, at, n);
    case "f64":
      return new Float64Array(buf, at, n);
    case "u64": {
      const raw = new BigUint64Array(buf, at, n);
      const out = new Float64Array(n);
      for (let i = 0; i < n; i++) out[i] = raw[i] === NONE_U64 ? NaN : Number(raw[i]);
      return out;
    }
  }
}

function align8(n: number): number {
  return (n + 7) & ~7;
}
