// The Web Worker that owns the model: loads a GGUF file onto WebGPU and generates,
// posting progress and tokens back to the page.
import init, { Session, checkKernels, webgpuAdapter } from "./pkg/fornax_web.js";

// WebGPU first (a Rust panic would take the module down), then the device and its adapter.
const ready = (async () => {
  if (!navigator.gpu) throw new Error("this browser has no WebGPU (in Chromium: --enable-unsafe-webgpu)");
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("WebGPU has no adapter here");
  await init();
  // A fallback adapter computes on the CPU (SwiftShader): the kernels take their CPU shapes.
  const fallback = Boolean(adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter);
  postMessage({ type: "adapter", adapter: await webgpuAdapter(fallback) });
})();
ready.catch((e) => postMessage({ type: "error", message: String(e?.message ?? e) }));
let session = null;
let stopRequested = false;

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

async function load({ url, file }) {
  const t0 = performance.now();
  const name = file ? file.name : url.split("/").pop();
  const bytes = file ? new Uint8Array(await file.arrayBuffer()) : await download(url);
  session?.free();
  session = null;
  session = await Session.load(bytes, (done, total) =>
    postMessage({ type: "progress", phase: "upload", done, total, label: `tensor ${done} of ${total}` }),
  );
  postMessage({ type: "loaded", name, summary: session.summary(), ms: performance.now() - t0 });
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

self.onmessage = async ({ data: m }) => {
  if (m.type === "stop") {
    stopRequested = true;
    return;
  }
  try {
    await ready;
    if (m.type === "load") await load(m);
    else if (m.type === "generate") await generate(m);
    else if (m.type === "check") postMessage({ type: "check", report: await checkKernels() });
  } catch (e) {
    postMessage({ type: "error", message: String(e?.message ?? e) });
  }
};
