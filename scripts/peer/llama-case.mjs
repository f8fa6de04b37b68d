// One measured case on llama.cpp (the prebuilt CPU binary inside node-llama-cpp), printed
// as a JSON line with the same fields as `fornax bench case`: `sequences` prompts of
// `promptTokens` tokens prefilled one after another, then all sequences decode
// `genTokens` greedy tokens together (node-llama-cpp batches the sequences of one context
// into one llama_decode per step).
//
// usage: node llama-case.mjs MODEL THREADS PROMPT_TOKENS GEN_TOKENS SEQUENCES
import { loadCpuModel } from "./llama.mjs";

const [modelPath, threadsArg, promptArg, genArg, seqArg] = process.argv.slice(2);
const threads = Number(threadsArg);
const promptTokens = Number(promptArg);
const genTokens = Number(genArg);
const sequences = Number(seqArg);
if (!modelPath || !(threads > 0 && promptTokens > 0 && genTokens > 0 && sequences > 0)) {
    console.error("usage: node llama-case.mjs MODEL THREADS PROMPT_TOKENS GEN_TOKENS SEQUENCES");
    process.exit(2);
}

const { llama, model } = await loadCpuModel(modelPath, threads);
const context = await model.createContext({
    sequences,
    contextSize: sequences * (promptTokens + genTokens + 32),
    batchSize: Math.max(512, promptTokens),
    threads,
});
// The same text `fornax bench case` cuts its prompt from, with the same tokenizer.
const text = "The history of computing is a story of abstractions built on abstractions. "
    .repeat(promptTokens);
const prompt = model.tokenize(text).slice(0, promptTokens);

const seqs = Array.from({ length: sequences }, () => context.getSequence());
// Warm-up on a short prompt, then cleared, as fornax's case does.
await seqs[0].evaluateWithoutGeneratingNewTokens(prompt.slice(0, 16));
await seqs[0].clearHistory();

let t = performance.now();
for (const seq of seqs) {
    await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
}
const prefillS = (performance.now() - t) / 1000;

// Each sequence evaluates its last prompt token, then its own greedy tokens.
async function decode(seq) {
    let n = 0;
    for await (const _ of seq.evaluate(prompt.slice(-1), { temperature: 0 })) {
        if (++n >= genTokens) break;
    }
}
t = performance.now();
await Promise.all(seqs.map(decode));
const decodeS = (performance.now() - t) / 1000;

console.log(JSON.stringify({
    engine: "llama.cpp",
    backend: "cpu",
    adapter: `node-llama-cpp (${threads} threads)`,
    prompt_tokens: prompt.length,
    gen_tokens: genTokens,
    sequences,
    prefill_tok_s: (sequences * (prompt.length - 1)) / prefillS,
    decode_tok_s: (sequences * genTokens) / decodeS,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
