// Replays a workload written by `fornax bench table` on llama.cpp (the prebuilt CPU binary
// inside node-llama-cpp) in real time, and prints the figures as one JSON line.
//
// The workload file holds each request's arrival time (seconds from the start), prompt
// token ids (the same GGUF, so the same ids) and output length, the number of sequences
// to serve at once and the client timeout. Requests wait in arrival order for a free
// sequence of one context; node-llama-cpp batches the pending tokens of all sequences of
// a context into one llama_decode per step. As llama-server does with its slots, a
// request takes the free sequence whose cached tokens share the longest prefix with its
// prompt and keeps that prefix. Every request generates exactly its output length
// (greedy, end-of-generation tokens included), as Fornax does in the table.
//
// usage: node llama-replay.mjs MODEL THREADS WORKLOAD.json
import { readFileSync } from "node:fs";
import { loadCpuModel } from "./llama.mjs";

const [modelPath, threadsArg, workloadPath] = process.argv.slice(2);
const threads = Number(threadsArg);
if (!modelPath || !(threads > 0) || !workloadPath) {
    console.error("usage: node llama-replay.mjs MODEL THREADS WORKLOAD.json");
    process.exit(2);
}
const workload = JSON.parse(readFileSync(workloadPath, "utf8"));
const { parallel, timeout_s: timeoutS, batch_tokens: batchTokens, requests } = workload;

const { llama, model } = await loadCpuModel(modelPath, threads);
const longest = Math.max(...requests.map((r) => r.prompt.length + r.max_tokens));
const context = await model.createContext({
    sequences: parallel,
    contextSize: parallel * (longest + 16),
    batchSize: batchTokens,
    threads,
});
const free = Array.from({ length: parallel }, () => context.getSequence());

// Warm-up outside the clock, as Fornax's runs load and warm before theirs.
await free[0].evaluateWithoutGeneratingNewTokens(requests[0].prompt.slice(0, 16));
await free[0].clearHistory();

const results = requests.map(() => ({ ttft_s: null, e2e_s: null, tokens: 0, completed: false }));
const queue = [];
let inFlight = 0;
let ended = 0;
let busyS = 0;
let busySince = 0;
let allEnded;
const finished = new Promise((resolve) => (allEnded = resolve));
const t0 = performance.now();
const now = () => (performance.now() - t0) / 1000;

function commonPrefix(a, b) {
    let n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    return n;
}

function end() {
    if (++ended === requests.length) allEnded();
}

async function serve(index, seq) {
    const req = requests[index];
    const result = results[index];
    if (inFlight++ === 0) busySince = now();
    try {
        // Keep the longest cached prefix, but evaluate at least the prompt's last token.
        const keep = Math.min(commonPrefix(seq.contextTokens, req.prompt), req.prompt.length - 1);
        if (seq.nextTokenIndex > keep) {
            await seq.eraseContextTokenRanges([{ start: keep, end: seq.nextTokenIndex }]);
        }
        const options = { temperature: 0, yieldEogToken: true };
        for await (const _ of seq.evaluate(req.prompt.slice(keep), options)) {
            const t = now();
            if (result.tokens++ === 0) result.ttft_s = t - req.arrival;
            if (result.tokens >= req.max_tokens) {
                result.completed = true;
                result.e2e_s = t - req.arrival;
                break;
            }
            // The client hangs up.
            if (t - req.arrival > timeoutS) break;
        }
    } catch (e) {
        console.error(`request ${index} failed: ${e}`);
    }
    if (!result.completed) result.tokens = 0;
    if (--inFlight === 0) busyS += now() - busySince;
    free.push(seq);
    end();
    dispatch();
}

function dispatch() {
    while (queue.length > 0 && free.length > 0) {
        const index = queue.shift();
        if (now() - requests[index].arrival > timeoutS) {
            end();
            continue;
        }
        // The free sequence sharing the longest prefix with this prompt.
        const prompt = requests[index].prompt;
        const shared = free.map((seq) => commonPrefix(seq.contextTokens, prompt));
        const best = shared.indexOf(Math.max(...shared));
        const [seq] = free.splice(best, 1);
        serve(index, seq);
    }
}

requests.forEach((req, index) => {
    setTimeout(() => {
        queue.push(index);
        dispatch();
    }, Math.max(0, req.arrival * 1000 - (performance.now() - t0)));
});
await finished;
const makespan = now();

console.log(JSON.stringify({
    engine: "llama.cpp",
    adapter: `node-llama-cpp 3.21.1 (${threads} threads, ${parallel} sequences)`,
    kv_bytes: context.stateSize,
    makespan_s: makespan,
    busy_s: busyS,
    requests: results,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
