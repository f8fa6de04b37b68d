// The page: hands work to the worker (worker.js) and shows what comes back.
const $ = (id) => document.getElementById(id);
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });

function setState(state, message) {
  document.body.dataset.state = state;
  if (message !== undefined) $("load-status").textContent = message;
  const busy = state === "loading" || state === "generating";
  $("load").disabled = busy;
  $("model-pick").disabled = busy;
  $("compute").disabled = busy;
  $("model-file").disabled = busy;
  $("generate").disabled = busy || !document.body.dataset.model;
  $("stop").disabled = state !== "generating";
}

setState("idle", `no model loaded (WebGPU ${navigator.gpu ? "available" : "not available"} in this browser)`);

// `?compute=cpu|webgpu|auto` picks the path; `?threads=N` sizes the CPU path's pool.
const query = new URLSearchParams(location.search);
if (query.get("compute")) $("compute").value = query.get("compute");

function load(source) {
  setState("loading", "loading…");
  $("progress").value = 0;
  const threads = Number(query.get("threads")) || 0;
  worker.postMessage({ type: "load", compute: $("compute").value, threads, ...source });
}

$("model-pick").onchange = (e) => {
  $("model-url").value = e.target.value;
};
$("load").onclick = () => load({ url: $("model-url").value });
$("model-file").onchange = (e) => {
  const file = e.target.files[0];
  if (file) load({ file });
};

let started = 0;
$("generate").onclick = () => {
  $("output").textContent = "";
  $("ids").textContent = "[]";
  $("stats").textContent = "";
  started = performance.now();
  setState("generating");
  worker.postMessage({
    type: "generate",
    prompt: $("prompt").value,
    chat: $("chat").checked,
    maxTokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    seed: 7,
    schema: $("schema").value,
  });
};
$("stop").onclick = () => worker.postMessage({ type: "stop" });
$("check").onclick = () => {
  $("check").disabled = true;
  $("check-report").hidden = false;
  $("check-report").textContent = "checking…";
  worker.postMessage({ type: "check" });
};

const rate = (tokens, ms) => (ms > 0 ? ((tokens * 1000) / ms).toFixed(2) : "–");

worker.onmessage = ({ data: m }) => {
  switch (m.type) {
    case "path":
      document.body.dataset.path = m.path;
      $("path").textContent = `${m.path === "cpu" ? "CPU" : "WebGPU"}: ${m.reason}`;
      $("device").textContent = m.device;
      break;
    case "progress":
      $("progress").value = m.total ? m.done / m.total : 0;
      $("load-status").textContent = `${m.phase}: ${m.label}`;
      break;
    case "loaded":
      document.body.dataset.model = m.name;
      $("model").textContent = `${m.name}: ${m.summary}`;
      $("progress").value = 1;
      document.body.dataset.loadMs = m.ms;
      setState("ready", `loaded in ${(m.ms / 1000).toFixed(1)} s`);
      break;
    case "token":
      $("output").textContent += m.text;
      $("stats").textContent = `${m.count} tokens, ${rate(m.count, m.ms)} tokens/s`;
      break;
    case "done": {
      $("ids").textContent = JSON.stringify(m.ids);
      // Tokens after the first, over the time since it came.
      const perSecond = m.ids.length > 1 ? ((m.ids.length - 1) * 1000) / (m.ms - m.firstMs) : 0;
      const decode = m.ids.length > 1 ? `, decoding ${perSecond.toFixed(2)} tokens/s` : "";
      // The figures as numbers, for scripts/bench-browser.sh.
      document.body.dataset.result = JSON.stringify({ tokens: m.ids.length, firstMs: m.firstMs, decode: perSecond });
      $("stats").textContent =
        `${m.ids.length} tokens in ${(m.ms / 1000).toFixed(1)} s: ${rate(m.ids.length, m.ms)} tokens/s` +
        ` (prompt ${m.promptTokens} tokens, first token after ${(m.firstMs / 1000).toFixed(1)} s${decode})` +
        (m.stopped ? ", stopped" : "");
      setState("done");
      break;
    }
    case "check":
      $("check").disabled = false;
      $("check-report").textContent = m.report;
      document.body.dataset.check = m.report.endsWith("failed") ? "failed" : "passed";
      break;
    case "error":
      setState("error", `error: ${m.message}`);
      break;
  }
};
worker.onerror = (e) => setState("error", `worker error: ${e.message}`);
