// Reading JSON of loose shape (lookups, the report) without `any`.

import type { Json } from "../api/types";

export type Obj = { [k: string]: Json };

export function obj(v: Json | undefined): Obj {
  return v && typeof v === "object" && !Array.isArray(v) ? v : {};
}

export function arr(v: Json | undefined): Json[] {
  return Array.isArray(v) ? v : [];
}

/** An array of objects (non-objects read as empty ones). */
export function objs(v: Json | undefined): Obj[] {
  return arr(v).map(obj);
}

export function num(v: Json | undefined): number {
  return typeof v === "number" ? v : NaN;
}
