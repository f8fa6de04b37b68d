// End-to-end test of the browser demo: serves the built site on 127.0.0.1 (cross-origin
// isolated), drives headless Chromium through playwright-core and runs the same checks on
// each path given an `--expect-PATH`: WebGPU (asked for: its adapter here is SwiftShader)
// and the CPU path (chosen automatically, since that adapter computes in software, on the
// threaded module). Each loads the real model by URL, runs the path's kernel check,
// generates greedily and checks the token ids against the native engine's on the same
// backend (`ids`); generates greedily under a JSON schema (`--schema`) and checks the ids
// against the native engine's under it (`schema`) and the text against the schema; checks
// that Stop ends a long generation early; then picks a second model (`--picked`) in the
// page's model picker, loads it and checks its first greedy tokens (`picked`). Run by
// `scripts/web-demo.sh test`, which passes the native ids.
//
//   node web-demo/tests/e2e.mjs --site DIR --model URL --prompt TEXT --out DIR
//     [--schema JSON] [--picked URL]
//     [--expect-webgpu '{"ids": [..], "schema": [..], "picked": [..]}'] [--expect-cpu '{...}']
import { createRequire } from "node:module";
import { parseArgs } from "node:util";
import { join } from "node:path";
import { serve } from "../serve.mjs";

// playwright-core lives in the test's node cache (NODE_PATH), not in the repository.
const { chromium } = createRequire(import.meta.url)("playwright-core");

const { values: args } = parseArgs({
  options: {
    site: { type: "string" },
    model: { type: "string" },
    prompt: { type: "string" },
    out: { type: "string" },
    schema: { type: "string" },
    picked: { type: "string" },
    "expect-webgpu": { type: "string" },
    "expect-cpu": { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
  },
});
const CHECKED = 8;
const paths = ["webgpu", "cpu"].filter((p) => args[`expect-${p}`]);
if (!paths.length) throw new Error("nothing to check: give --expect-webgpu and/or --expect-cpu");

const log = (...a) => console.error("e2e:", ...a);
const failures = [];
const check = (ok, what) => {
  log(`${ok ? "ok" : "FAIL"}: ${what}`);
  if (!ok) failures.push(what);
};

const server = await serve(args.site);
const origin = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  args: [
    "--enable-unsafe-webgpu",
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

// Waits until the page reaches one of `states` (or "error", which fails the test).
async function until(page, states, timeout) {
  const handle = await page.waitForFunction(
    (wanted) => [...wanted, "error"].includes(document.body.dataset.state) && document.body.dataset.state,
    states,
    { timeout, polling: 250 },
  );
  const state = await handle.jsonValue();
  if (state === "error") throw new Error(`page: ${await page.textContent("#load-status")}`);
}

// Generates `n` tokens greedily from `prompt` and returns their ids.
async function greedy(page, prompt, n) {
  await page.fill("#prompt", prompt);
  await page.fill("#max-tokens", String(n));
  await page.fill("#temperature", "0");
  await page.click("#generate");
  await until(page, ["done"], 15 * 60_000);
  return JSON.parse(await page.textContent("#ids"));
}

// Every check on one path, in a page of its own.
async function drive(path, expected) {
  log(`== the ${path} path`);
  if (expected.ids.length < CHECKED) throw new Error(`need ${CHECKED} native ids, got ${expected.ids.length}`);
  const page = await browser.newPage({ viewport: { width: 1000, height: 1000 } });
  page.on("console", (m) => log(`console.${m.type()}: ${m.text()}`));
  page.on("worker", (w) => w.on("console", (m) => log(`worker console.${m.type()}: ${m.text()}`)));
  page.on("pageerror", (e) => log(`page error: ${e.message}`));
  // WebGPU is asked for; the CPU path is what the page picks by itself here.
  await page.goto(`${origin}/?compute=${path === "webgpu" ? "webgpu" : "auto"}`);

  await page.fill("#model-url", args.model);
  const t0 = Date.now();
  await page.click("#load");
  await until(page, ["ready"], 15 * 60_000);
  log(`loaded in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  const shown = await page.textContent("#path");
  const device = await page.textContent("#device");
  log(`path: ${shown}; device: ${device}`);
  log(`model: ${await page.textContent("#model")}`);
  check((await page.evaluate(() => document.body.dataset.path)) === path, `the model runs on the ${path} path`);
  if (path === "webgpu") {
    check(/storage bindings up to \d+ MiB/.test(device), "the page shows the WebGPU adapter and its binding limit");
  } else {
    check(/software|fallback/.test(shown), "the page says it chose the CPU path for the software adapter");
    check(/simd128 kernels, \d+ threads \(Web Workers/.test(device), "the CPU path runs SIMD kernels on Web Workers");
  }

  // The path's self-check: burn's operations and our kernels on the adapter against the
  // host, or each SIMD level of the CPU kernels against plain code.
  await page.click("#check");
  await page.waitForFunction(() => document.body.dataset.check, null, { timeout: 10 * 60_000, polling: 250 });
  log(`kernel check:\n${await page.textContent("#check-report")}`);
  check((await page.evaluate(() => document.body.dataset.check)) === "passed", `the ${path} kernel check passes`);

  // Greedy tokens against the native engine's.
  const ids = await greedy(page, args.prompt, CHECKED);
  rates[path] = await page.textContent("#stats");
  const text = await page.textContent("#output");
  log(`browser ids ${JSON.stringify(ids)}, text ${JSON.stringify(text)}`);
  log(`native  ids ${JSON.stringify(expected.ids.slice(0, CHECKED))}`);
  log(`stats: ${rates[path]}`);
  check(
    JSON.stringify(ids.slice(0, CHECKED)) === JSON.stringify(expected.ids.slice(0, CHECKED)),
    `${path}: the first ${CHECKED} greedy token ids equal the native engine's`,
  );
  check(text.length > 0, "the generated text is shown");
  const shot = join(args.out, `web-demo-${path}.png`);
  await page.screenshot({ path: shot, fullPage: true });
  log(`screenshot: ${shot}`);

  // Under a JSON schema: the native engine's ids, and a value valid for the schema (one
  // string property, `capital`).
  if (args.schema) {
    await page.fill("#schema", args.schema);
    const want = expected.schema;
    const t0 = Date.now();
    // Room past the native output: the grammar, not max_tokens, ends it.
    const got = await greedy(page, args.prompt, want.length + 8);
    const text = await page.textContent("#output");
    log(`under the schema: browser ids ${JSON.stringify(got)}, text ${JSON.stringify(text)}, ` +
      `${((Date.now() - t0) / 1000).toFixed(1)} s; ${await page.textContent("#stats")}`);
    log(`native  ids ${JSON.stringify(want)}`);
    check(JSON.stringify(got) === JSON.stringify(want), `${path}: under a JSON schema the greedy ids equal the native engine's`);
    let value = null;
    try {
      value = JSON.parse(text);
    } catch (e) {
      log(`does not parse: ${e}`);
    }
    const keys = value && typeof value === "object" ? Object.keys(value) : [];
    check(keys.length === 1 && typeof value.capital === "string" && value.capital.length <= 16,
      "the output under the schema is a value valid for it");
    await page.screenshot({ path: join(args.out, `web-demo-${path}-schema.png`), fullPage: true });
    await page.fill("#schema", "");
  }

  // Stop: a long generation (a count, which runs on without an end-of-turn token),
  // stopped once a token has arrived, ends early.
  const long = 256;
  await page.fill("#prompt", "1, 2, 3, 4, 5,");
  await page.fill("#max-tokens", String(long));
  await page.click("#generate");
  await page.waitForFunction(() => document.querySelector("#output").textContent.length > 0, null, {
    timeout: 10 * 60_000,
    polling: 100,
  });
  await page.click("#stop");
  await until(page, ["done"], 10 * 60_000);
  const stopped = JSON.parse(await page.textContent("#ids"));
  const stats = await page.textContent("#stats");
  log(`after Stop: ${stopped.length} tokens; ${stats}`);
  check(stopped.length < long && stats.includes("stopped"), `${path}: Stop ends a ${long}-token generation early`);
  await page.screenshot({ path: join(args.out, `web-demo-${path}-stopped.png`), fullPage: true });

  // The model picker: the second model by its entry, loaded and generating its first token.
  if (args.picked) {
    await page.selectOption("#model-pick", args.picked);
    check((await page.inputValue("#model-url")) === args.picked, "the picker sets the model URL");
    const t1 = Date.now();
    await page.click("#load");
    await until(page, ["ready"], 15 * 60_000);
    const model = await page.textContent("#model");
    log(`picked model loaded in ${((Date.now() - t1) / 1000).toFixed(1)} s: ${model}`);
    check(model.startsWith(args.picked.split("/").pop()), "the picked model is the one loaded");
    const want = expected.picked;
    const got = await greedy(page, args.prompt, want.length);
    log(`picked model: browser ids ${JSON.stringify(got)}, native ${JSON.stringify(want)}; ${await page.textContent("#stats")}`);
    check(JSON.stringify(got) === JSON.stringify(want), `${path}: the picked model's first greedy tokens equal the native engine's`);
  }
  await page.close();
}

const rates = {};
try {
  for (const p of paths) await drive(p, JSON.parse(args[`expect-${p}`]));
  // One line a path for CI's table: decode speed and first token.
  for (const p of paths) log(`stats ${p}: ${rates[p]}`);
} finally {
  await browser.close();
  server.close();
}

if (failures.length) {
  log(`${failures.length} failed`);
  process.exit(1);
}
log("all passed");
