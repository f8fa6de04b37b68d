// Reference outputs of llama.cpp (the prebuilt CPU binary inside node-llama-cpp) for one
// GGUF: token ids of text cases, greedy continuations with each step's top-1/top-2
// log-probability margin, and the log-probability of every token of a text. Writes JSON
// to stdout. Probabilities are read at temperature 1 with no top-k/top-p/min-p cut.
//
// usage: node llama-reference.mjs MODEL CASES.json > reference.json
//   CASES.json: { "tokenizer": [{name, text, parse_special}], "prompts": [text],
//                 "gen_tokens": N, "text_file": PATH (relative to CASES.json),
//                 "text_tokens": N (BOS included where the file adds it) }
import { readFileSync } from "node:fs";
import { loadCpuModel } from "./llama.mjs";

const [modelPath, casesPath] = process.argv.slice(2);
if (!modelPath || !casesPath) {
    console.error("usage: node llama-reference.mjs MODEL CASES.json");
    process.exit(2);
}
const cases = JSON.parse(readFileSync(casesPath, "utf8"));
if (cases.text_file) {
    cases.text = readFileSync(new URL(cases.text_file, `file://${casesPath}`), "utf8");
}
const { llama, model } = await loadCpuModel(modelPath, 2);
// BOS first where the file asks for it (`tokenizer.ggml.add_bos_token`), as a prompt runs.
const start = model.tokens.bos != null && model.tokens.shouldPrependBosToken ? [model.tokens.bos] : [];

const tokenizer = cases.tokenizer.map((c) => ({
    ...c,
    ids: Array.from(model.tokenize(c.text, c.parse_special)),
}));

const textIds = [...start, ...model.tokenize(cases.text, false)].slice(0, cases.text_tokens);
const context = await model.createContext({
    contextSize: Math.max(2048, textIds.length + 64),
    batchSize: 512,
    threads: 2,
});
const sequence = context.getSequence();
const full = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const next = { generateNext: { probabilities: true, options: full } };

/** Evaluates `tokens`, the distribution after each wanted one; returns them. */
async function evaluate(tokens, wanted) {
    const input = tokens.map((t, i) => (wanted(i) ? [t, next] : t));
    const out = await sequence.controlledEvaluate(input);
    return tokens.map((_, i) => out[i]?.next?.probabilities);
}

/** Top two [id, log-prob] pairs of a distribution (the map is sorted, highest first). */
function topTwo(probabilities) {
    const it = probabilities.entries();
    const [a, b] = [it.next().value, it.next().value];
    return [[a[0], Math.log(a[1])], [b[0], Math.log(b[1])]];
}

const prompts = [];
for (const text of cases.prompts) {
    await sequence.clearHistory();
    const ids = [...start, ...model.tokenize(text, false)];
    let dist = (await evaluate(ids, (i) => i === ids.length - 1)).at(-1);
    const greedy = [];
    const margins = [];
    for (let step = 0; step < cases.gen_tokens; step++) {
        const [[top, lp1], [, lp2]] = topTwo(dist);
        greedy.push(top);
        margins.push(lp1 - lp2);
        dist = (await evaluate([top], () => true))[0];
    }
    prompts.push({ prompt: text, ids, greedy, margins, text: model.detokenize(greedy) });
}

// Every token of the text after the first, scored in pieces to keep memory small.
await sequence.clearHistory();
const logprobs = [];
for (let at = 0; at < textIds.length; at += 64) {
    const piece = textIds.slice(at, at + 64);
    const dists = await evaluate(piece, (i) => at + i + 1 < textIds.length);
    dists.forEach((d, i) => {
        if (d) logprobs.push(Math.log(d.get(textIds[at + i + 1]) ?? 0));
    });
}
const nll = -logprobs.reduce((a, b) => a + b, 0) / logprobs.length;

console.log(JSON.stringify({
    engine: "llama.cpp",
    node_llama_cpp: "3.21.1",
    llama_cpp_release: llama.llamaCppRelease,
    build: llama.buildType,
    model: modelPath.split("/").at(-1),
    tokenizer,
    prompts,
    text: { ids: textIds, logprobs, mean_nll: nll, perplexity: Math.exp(nll) },
}, null, 1));
await context.dispose();
await model.dispose();
await llama.dispose();
