// The browser CPU path against wllama (llama.cpp in WebAssembly) in one headless
// Chromium, alternating the engines (Fornax, wllama, Fornax, wllama, ...) on the same GGUF
// file, thread count, prompt and token count, each run in a fresh page; then Fornax on
// WebGPU (here SwiftShader, a software adapter) once, for the ratio the CPU path gains.
// Prints a Markdown table of medians. Run by scripts/bench-browser.sh.
//
//   node web-demo/bench/bench.mjs --site DIR --model URL [--threads N] [--tokens N]
//     [--rounds N] [--prompt TEXT] [--webgpu-tokens N]
import { createRequire } from "node:module";
import { parseArgs } from "node:util";
import os from "node:os";
import { serve } from "../serve.mjs";

const { chromium } = createRequire(import.meta.url)("playwright-core");
const { values: args } = parseArgs({
  options: {
    site: { type: "string" },
    model: { type: "string" },
    threads: { type: "string", default: String(os.availableParallelism()) },
    tokens: { type: "string", default: "64" },
    rounds: { type: "string", default: "3" },
    prompt: { type: "string", default: "1, 2, 3, 4, 5," },
    "webgpu-tokens": { type: "string", default: "6" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
});
const threads = Number(args.threads);
const log = (...a) => console.error("bench:", ...a);

const server = await serve(args.site);
const origin = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  args: ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

async function page() {
  const p = await browser.newPage();
  p.on("pageerror", (e) => log(`page error: ${e.message}`));
  return p;
}

async function settled(p, states, timeout) {
  const h = await p.waitForFunction((s) => s.includes(document.body.dataset.state) && document.body.dataset.state,
    [...states, "error"], { timeout, polling: 100 });
  if ((await h.jsonValue()) === "error") {
    throw new Error(`page: ${await p.evaluate(() => document.body.dataset.error ?? document.querySelector("#load-status")?.textContent)}`);
  }
}

// Fornax's demo page on `compute`: load, then one greedy generation.
async function fornax(compute, tokens) {
  const p = await page();
  await p.goto(`${origin}/?compute=${compute}&threads=${threads}`);
  await p.fill("#model-url", args.model);
  await p.click("#load");
  await settled(p, ["ready"], 15 * 60_000);
  const loadMs = Number(await p.evaluate(() => document.body.dataset.loadMs));
  const device = await p.textContent("#device");
  await p.fill("#prompt", args.prompt);
  await p.fill("#max-tokens", String(tokens));
  await p.fill("#temperature", "0");
  await p.click("#generate");
  await settled(p, ["done"], 30 * 60_000);
  const r = JSON.parse(await p.evaluate(() => document.body.dataset.result));
  await p.close();
  // The adapter's line is long: its kind is what the table needs.
  const where = compute === "cpu" ? device : `WebGPU, ${device.includes("fallback") ? "a fallback (software) adapter" : "a GPU adapter"}`;
  return { engine: compute === "cpu" ? "Fornax, CPU path" : "Fornax, WebGPU", device: where, loadMs, ...r };
}

async function wllama(tokens) {
  const p = await page();
  const q = new URLSearchParams({ model: `/${args.model}`, threads, tokens, prompt: args.prompt });
  await p.goto(`${origin}/bench/wllama.html?${q}`);
  await settled(p, ["done"], 30 * 60_000);
  const r = JSON.parse(await p.evaluate(() => document.body.dataset.result));
  await p.close();
  return { ...r, engine: "wllama", device: `CPU, ${r.threads} threads${r.isolated ? "" : " (not isolated)"}` };
}

const runs = { fornax: [], wllama: [] };
try {
  log(`Chromium ${browser.version()}, ${threads} threads, ${args.tokens} tokens after ${JSON.stringify(args.prompt)}`);
  for (let round = 1; round <= Number(args.rounds); round++) {
    for (const [name, run] of [["fornax", () => fornax("cpu", Number(args.tokens))], ["wllama", () => wllama(Number(args.tokens))]]) {
      const r = await run();
      runs[name].push(r);
      log(`round ${round}: ${r.engine}: ${r.tokens} tokens, first after ${r.firstMs.toFixed(0)} ms, ` +
        `decoding ${r.decode.toFixed(2)} tokens/s, loaded in ${r.loadMs.toFixed(0)} ms`);
    }
  }
  const gpu = await fornax("webgpu", Number(args["webgpu-tokens"]));
  log(`${gpu.engine}: ${gpu.tokens} tokens, first after ${gpu.firstMs.toFixed(0)} ms, decoding ${gpu.decode.toFixed(3)} tokens/s`);

  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  const row = (rs) => ({
    engine: rs[0].engine,
    device: rs[0].device,
    tokens: rs[0].tokens,
    decode: median(rs.map((r) => r.decode)),
    first: median(rs.map((r) => r.firstMs)) / 1000,
    load: median(rs.map((r) => r.loadMs)) / 1000,
    n: rs.length,
  });
  const rows = [row(runs.fornax), row(runs.wllama), row([gpu])];
  const [f, w, g] = rows;
  console.log(`Chromium ${browser.version()} (headless), ${os.cpus()[0].model.trim()}, ${os.availableParallelism()} cores; ` +
    `model ${args.model.split("/").pop()}; prompt ${JSON.stringify(args.prompt)}, greedy; medians of ${f.n} runs alternated\n`);
  console.log("| engine | computes on | tokens | decode tok/s | first token s | load s |");
  console.log("|---|---|---:|---:|---:|---:|");
  for (const r of rows) {
    console.log(`| ${r.engine} | ${r.device} | ${r.tokens} | ${r.decode.toFixed(r.decode < 1 ? 3 : 1)} | ${r.first.toFixed(2)} | ${r.load.toFixed(1)} |`);
  }
  console.log(`\nFornax CPU path / wllama, decode: **${(f.decode / w.decode).toFixed(2)}x**; ` +
    `first token: ${(f.first).toFixed(2)} s vs ${w.first.toFixed(2)} s; ` +
    `CPU path / WebGPU on this adapter, decode: **${(f.decode / g.decode).toFixed(0)}x**`);
} finally {
  await browser.close();
  server.close();
}
