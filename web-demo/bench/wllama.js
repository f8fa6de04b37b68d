// wllama (llama.cpp compiled to WebAssembly, npm @wllama/wllama) on the CPU, driven the way
// the demo page drives Fornax: load a GGUF file by URL, then one greedy completion of
// `tokens` tokens; the first token's time and the decode rate land in
// `document.body.dataset.result` (JSON) for scripts/bench-browser.sh.
//
//   bench/wllama.html?model=URL&threads=N&tokens=N&prompt=TEXT
import { Wllama } from "./wllama/esm/index.js";

const q = new URLSearchParams(location.search);
const log = (line) => {
  document.getElementById("log").textContent += `${line}\n`;
};

async function run() {
  const threads = Number(q.get("threads")) || navigator.hardwareConcurrency;
  const tokens = Number(q.get("tokens")) || 64;
  const t0 = performance.now();
  const bytes = await (await fetch(q.get("model"))).blob();
  const wllama = new Wllama({ default: "./wllama/esm/wasm/wllama.wasm" }, { suppressNativeLog: true });
  // The CPU only (WebGPU would take every layer by default), the thread count given.
  await wllama.loadModel([bytes], { n_threads: threads, n_gpu_layers: 0, n_ctx: 2048 });
  const loadMs = performance.now() - t0;
  log(`loaded in ${loadMs.toFixed(0)} ms`);
  const start = performance.now();
  let first = 0;
  let last = 0;
  let chunks = 0;
  let timings = null;
  const stream = await wllama.createCompletion({
    prompt: q.get("prompt"),
    max_tokens: tokens,
    temperature: 0,
    stream: true,
  });
  for await (const chunk of stream) {
    const now = performance.now() - start;
    if (chunk.choices?.[0]?.text) {
      if (chunks++ === 0) first = now;
      last = now;
    }
    if (chunk.timings) timings = chunk.timings;
  }
  const generated = timings?.predicted_n ?? chunks;
  const result = {
    engine: "wllama",
    threads,
    loadMs,
    firstMs: first,
    tokens: generated,
    decode: generated > 1 ? ((generated - 1) * 1000) / (last - first) : 0,
    // llama.cpp's own figure, for reference.
    llamaDecode: timings?.predicted_per_second ?? null,
    isolated: self.crossOriginIsolated,
  };
  log(JSON.stringify(result));
  document.body.dataset.result = JSON.stringify(result);
  document.body.dataset.state = "done";
}

run().catch((e) => {
  log(`error: ${e?.message ?? e}`);
  document.body.dataset.state = "error";
  document.body.dataset.error = String(e?.message ?? e);
});
