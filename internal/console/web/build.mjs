// Bundles src/ into ../dist (app.js, app.css): minified, no source maps,
// for the console's go:embed (the consoleui build tag).
import * as esbuild from "esbuild";

await esbuild.build({
  entryPoints: { app: "src/app.js" },
  bundle: true,
  minify: true,
  format: "esm",
  splitting: true,
  chunkNames: "chunk-[hash]",
  target: ["chrome110", "firefox110", "safari16"],
  outdir: "../dist",
  legalComments: "none",
  logLevel: "warning",
});
