// HTTP client of the view API. Paths are relative, so the app works behind
// an SSH tunnel or a path prefix, and the token cookie the index page set
// goes along. Answers are immutable for one trace, so a small LRU keeps the
// recent ones: a pan back, or a view re-asking what another just drew, costs
// nothing.

import { decodeFrame, Frame } from "./frame";
import type { Computing } from "./types";

export type ParamValue = string | number | boolean | undefined | null | readonly (string | number)[];
export type Params = Record<string, ParamValue>;

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const PREFIX = "api/v1/";
const CACHE_ENTRIES = 256;
const cache = new Map<string, Promise<unknown>>();

/** `path?query`, repeating a parameter for each value of an array; unset values are left out. */
export function url(path: string, params: Params = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) for (const x of v) q.append(k, String(x));
    else q.append(k, typeof v === "boolean" ? (v ? "1" : "0") : String(v));
  }
  const s = q.toString();
  return PREFIX + path + (s ? `?${s}` : "");
}

async function fetchOk(u: string, signal?: AbortSignal): Promise<Response> {
  const r = await fetch(u, { signal });
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try {
      const body = (await r.json()) as { error?: string };
      if (body.error) msg = body.error;
    } catch {
      // not JSON: keep the status line
    }
    throw new ApiError(r.status, `${u}: ${msg}`);
  }
  return r;
}

function cached<T>(key: string, load: () => Promise<T>): Promise<T> {
  const hit = cache.get(key);
  if (hit) {
    cache.delete(key); // re-insert: most recently used last
    cache.set(key, hit);
    return hit as Promise<T>;
  }
  const p = load();
  cache.set(key, p);
  p.catch(() => cache.delete(key)); // failures (and aborts) are not remembered
  while (cache.size > CACHE_ENTRIES) cache.delete(cache.keys().next().value as string);
  return p;
}

export function getJson<T>(path: string, params?: Params): Promise<T> {
  const u = url(path, params);
  return cached(u, async () => (await fetchOk(u)).json() as Promise<T>);
}

/** How often a computation in the background is asked how far it got. */
const POLL_MS = 500;

/**
 * A query the server computes in the background (docs/VIEW_API.md: 202 with
 * `{"state": "computing", "progress": p}` until its answer is in): asks
 * again until it answers, telling `progress` how far it got. Not cached:
 * each call is a new poll, and the server keeps the answer.
 */
export async function pollJson<T>(path: string, progress: (fraction: number) => void, params?: Params): Promise<T> {
  const u = url(path, params);
  for (;;) {
    const r = await fetchOk(u);
    if (r.status !== 202) return (await r.json()) as T;
    progress(((await r.json()) as Computing).progress);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

export function getFrame<M = Record<string, unknown>>(path: string, params?: Params): Promise<Frame<M>> {
  const u = url(path, params);
  return cached(u, async () => decodeFrame<M>(await (await fetchOk(u)).arrayBuffer()));
}

/**
 * Runs only the newest of a view's requests: a view that re-asks while an
 * answer is on its way (a drag, a wheel) drops the stale answer instead of
 * drawing it late over the new one.
 */
export class Latest {
  private generation = 0;

  async run<T>(load: () => Promise<T>, use: (v: T) => void, fail: (e: unknown) => void): Promise<void> {
    const mine = ++this.generation;
    try {
      const v = await load();
      if (mine === this.generation) use(v);
    } catch (e) {
      if (mine === this.generation) fail(e);
    }
  }
}
