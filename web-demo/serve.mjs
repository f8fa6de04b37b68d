// A static file server for the demo on 127.0.0.1 (a secure context, so WebGPU is allowed).
// As a script: node web-demo/serve.mjs SITE_DIR [PORT]
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
export function serve(root, port = 0) {
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
      });
      createReadStream(file).pipe(res);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  return new Promise((resolve) => server.listen(port, "127.0.0.1", () => resolve(server)));
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [root, port = "8080"] = process.argv.slice(2);
  if (!root) {
    console.error("usage: node web-demo/serve.mjs SITE_DIR [PORT]");
    process.exit(2);
  }
  const server = await serve(root, Number(port));
  console.log(`Fornax web demo on http://127.0.0.1:${server.address().port}/ (Ctrl-C stops)`);
}
