// A static file server for the demo on 127.0.0.1 (a secure context, so WebGPU is allowed),
// cross-origin isolated (COOP and COEP headers), so the CPU path can share its memory with
// its threads; `isolated: false` serves without them (the CPU path then runs on one thread).
// As a script: node web-demo/serve.mjs SITE_DIR [PORT] [--not-isolated]
import { createServer } from "node:http";
import { createReadStream, promises as fs } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".wasm": "application/wasm",
  ".json": "application/json",
  ".png": "image/png",
};

/** Serves `root` on 127.0.0.1:`port` (0: any free port); resolves to the server once listening. */
export function serve(root, port = 0, { isolated = true } = {}) {
  const isolation = isolated
    ? { "cross-origin-opener-policy": "same-origin", "cross-origin-embedder-policy": "require-corp" }
    : {};
  const base = path.resolve(root);
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    const file = path.join(base, decodeURIComponent(url.pathname === "/" ? "/index.html" : url.pathname));
    if (!file.startsWith(base + path.sep)) {
      res.writeHead(403).end("forbidden");
      return;
    }
    try {
      const stat = await fs.stat(file);
      if (!stat.isFile()) throw new Error("not a file");
      res.writeHead(200, {
        "content-type": TYPES[path.extname(file)] ?? "application/octet-stream",
        "content-length": stat.size,
        "cache-control": "no-store",
        ...isolation,
      });
      createReadStream(file).pipe(res);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  return new Promise((resolve) => server.listen(port, "127.0.0.1", () => resolve(server)));
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const args = process.argv.slice(2);
  const isolated = !args.includes("--not-isolated");
  const [root, port = "8080"] = args.filter((a) => a !== "--not-isolated");
  if (!root) {
    console.error("usage: node web-demo/serve.mjs SITE_DIR [PORT] [--not-isolated]");
    process.exit(2);
  }
  const server = await serve(root, Number(port), { isolated });
  console.log(`Fornax web demo on http://127.0.0.1:${server.address().port}/ (Ctrl-C stops)`);
}
