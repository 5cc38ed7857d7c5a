// Bundles the app and its layout worker with esbuild into dist/, which
// `ttrace` embeds (tracer-user/build.rs). Type checking is `tsc --noEmit`
// (npm run build runs both). Plain file names: the server serves one build
// at a time, and answers are per trace, so no content hashes are needed.
import { build } from "esbuild";
import { cpSync, mkdirSync, rmSync } from "node:fs";

const out = "dist";
rmSync(out, { recursive: true, force: true });
mkdirSync(`${out}/assets`, { recursive: true });
await build({
  entryPoints: { app: "src/main.ts", "layout-worker": "src/graph/layout.worker.ts" },
  outdir: `${out}/assets`,
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "none",
  logLevel: "warning",
});
cpSync("src/index.html", `${out}/index.html`);
cpSync("src/style.css", `${out}/assets/style.css`);
