// The Web Worker that owns the model: picks the path (WebGPU, or the CPU kernels where
// WebGPU is missing or computes in software), loads a GGUF file on it and generates,
// posting progress and tokens back to the page.

// What WebGPU offers here, asked once: no adapter, or one and whether it is a software one.
const gpu = (async () => {
  if (!navigator.gpu) return { adapter: null, why: "this browser has no WebGPU" };
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return { adapter: null, why: "WebGPU has no adapter here" };
  const info = adapter.info ?? {};
  const named = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ");
  const fallback = Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter);
  const software = /swiftshader|llvmpipe|lavapipe|software/i.test(named);
  return { adapter, fallback, software, named: named || "an unnamed adapter" };
})();

// The two modules: WebGPU with a one-thread CPU path (pkg), and the CPU path on a pool of
// Web Workers over shared memory (pkg-threads), which needs a cross-origin isolated page.
const modules = {};
async function module(name) {
  if (!modules[name]) {
    modules[name] = (async () => {
      const m = await import(`./${name}/fornax_web.js`);
      await m.default();
      return m;
    })();
  }
  return modules[name];
}

let session = null;
let loadedFrom = null; // the module the session came from
let stopRequested = false;
let pool = 0; // threads started in pkg-threads (once per worker)

// The path for `compute` ("auto", "webgpu" or "cpu"), and why.
async function choose(compute) {
  const g = await gpu;
  if (compute === "webgpu") {
    if (!g.adapter) throw new Error(`WebGPU was asked for, but ${g.why}`);
    return { path: "webgpu", reason: "asked for" };
  }
  if (compute === "cpu") return { path: "cpu", reason: "asked for" };
  if (!g.adapter) return { path: "cpu", reason: g.why };
  if (g.fallback) return { path: "cpu", reason: `the WebGPU adapter (${g.named}) is a fallback one, computing on the CPU` };
  if (g.software) return { path: "cpu", reason: `the WebGPU adapter (${g.named}) computes in software` };
  return { path: "webgpu", reason: `the WebGPU adapter (${g.named}) is a GPU` };
}

// The module for `path`, set up: WebGPU's device, or the CPU path's threads.
async function ready(path, threads) {
  if (path === "webgpu") {
    const m = await module("pkg");
    const g = await gpu;
    // A fallback adapter computes on the CPU (SwiftShader): the kernels take their CPU shapes.
    return { m, device: await m.webgpuAdapter(g.fallback) };
  }
  if (!self.crossOriginIsolated) {
    const m = await module("pkg");
    return { m, device: `${m.cpuDevice()}: one thread, since the page is not cross-origin isolated` };
  }
  const m = await module("pkg-threads");
  if (!pool) {
    pool = Math.max(1, threads || navigator.hardwareConcurrency || 1);
    // This worker is one of the pool's threads; the others are Web Workers of their own.
    await m.initThreadPool(pool, new URL("./pkg-threads/fornax_web.js", import.meta.url).href);
  }
  return { m, device: m.cpuDevice() };
}

const mib = (n) => `${(n / 2 ** 20).toFixed(1)} MiB`;

async function download(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get("content-length")) || 0;
  const reader = response.body.getReader();
  const bytes = new Uint8Array(total);
  const parts = [];
  let received = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (received + value.length <= total) bytes.set(value, received);
    else parts.push(value);
    received += value.length;
    postMessage({ type: "progress", phase: "download", done: received, total, label: `${mib(received)} of ${mib(total)}` });
  }
  if (received === total && parts.length === 0) return bytes;
  // No or a wrong length header: join what came.
  const joined = new Uint8Array(received);
  let at = 0;
  for (const part of [bytes.subarray(0, Math.min(total, received)), ...parts]) {
    joined.set(part, at);
    at += part.length;
  }
  return joined;
}

async function load({ url, file, compute, threads }) {
  const t0 = performance.now();
  const { path, reason } = await choose(compute ?? "auto");
  const { m, device } = await ready(path, threads);
  postMessage({ type: "path", path, reason, device });
  const name = file ? file.name : url.split("/").pop();
  const bytes = file ? new Uint8Array(await file.arrayBuffer()) : await download(url);
  session?.free();
  session = null;
  session = await m.Session.load(
    bytes,
    (done, total) => postMessage({ type: "progress", phase: "load", done, total, label: `tensor ${done} of ${total}` }),
    path,
  );
  loadedFrom = m;
  postMessage({ type: "loaded", name, path, summary: session.summary(), ms: performance.now() - t0 });
}

async function generate({ prompt, chat, maxTokens, temperature, seed, schema }) {
  if (!session) throw new Error("load a model first");
  stopRequested = false;
  const ids = session.encode(prompt, chat);
  const t0 = performance.now();
  let firstMs = 0;
  let count = 0;
  const out = await session.generate(ids, maxTokens, temperature, seed, schema, (id, text) => {
    const ms = performance.now() - t0;
    if (count++ === 0) firstMs = ms;
    postMessage({ type: "token", id, text, count, ms });
    return !stopRequested;
  });
  postMessage({
    type: "done",
    ids: Array.from(out),
    promptTokens: ids.length,
    ms: performance.now() - t0,
    firstMs,
    stopped: stopRequested,
  });
}

// The kernel checks of the loaded path: burn's operations and our kernels on the adapter,
// or the CPU kernels' SIMD level against the portable one.
async function check() {
  if (!session) throw new Error("load a model first");
  if (session.path === "webgpu") return loadedFrom.checkKernels();
  try {
    return `CPU kernels: ${loadedFrom.checkCpuKernels()}: passed`;
  } catch (e) {
    return `CPU kernels: ${e?.message ?? e}: failed`;
  }
}

self.onmessage = async ({ data: m }) => {
  if (m.type === "stop") {
    stopRequested = true;
    return;
  }
  try {
    if (m.type === "load") await load(m);
    else if (m.type === "generate") await generate(m);
    else if (m.type === "check") postMessage({ type: "check", report: await check() });
  } catch (e) {
    postMessage({ type: "error", message: String(e?.message ?? e) });
  }
};
