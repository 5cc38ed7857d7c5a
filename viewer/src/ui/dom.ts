// Tiny DOM helpers: no framework, the views draw on canvases and build few
// elements.

type Attrs = Record<string, string | number | boolean | null | undefined | ((e: Event) => void)>;
type Child = Node | string | number | null | undefined | false;

/** `h("div", {class: "x", onclick: f}, child, ...)` */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v as EventListener);
    else if (k === "class") el.className = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined && c !== false) el.append(typeof c === "number" ? String(c) : c);
  return el;
}

export function clear(el: Element): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function byId<T extends HTMLElement = HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`no element #${id}`);
  return el as T;
}

/** A canvas sized to its box in device pixels; returns the 2-D context scaled to CSS pixels. */
export function fitCanvas(c: HTMLCanvasElement): { ctx: CanvasRenderingContext2D; w: number; h: number; dpr: number } {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, c.clientWidth);
  const hgt = Math.max(1, c.clientHeight);
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(hgt * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(hgt * dpr);
  }
  const ctx = c.getContext("2d");
  if (!ctx) throw new Error("no 2-D canvas context");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return { ctx, w, h: hgt, dpr };
}

/** Shows an error in a view's own box instead of failing silently. */
export function showError(box: HTMLElement, e: unknown): void {
  const msg = e instanceof Error ? e.message : String(e);
  let el = box.querySelector<HTMLElement>(":scope > .view-error");
  if (!el) {
    el = h("div", { class: "view-error", role: "alert" });
    box.append(el);
  }
  el.textContent = msg;
  console.warn(msg);
}

export function clearError(box: HTMLElement): void {
  box.querySelector(":scope > .view-error")?.remove();
}

/** Keeps a drag's moves coming when the pointer leaves the canvas (synthetic events have nothing to capture). */
export function capture(el: Element, e: PointerEvent): void {
  try {
    el.setPointerCapture(e.pointerId);
  } catch {
    // not an active pointer
  }
}
