// What the llama.cpp drivers share: the prebuilt CPU binary of node-llama-cpp (never
// built, nothing downloaded) with `threads` threads and the model on the CPU.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

/** Loads `modelPath` on llama.cpp's CPU backend; returns `{ llama, model }`. */
export async function loadCpuModel(modelPath, threads) {
    const llama = await getLlama({
        gpu: false,
        build: "never",
        skipDownload: true,
        maxThreads: threads,
        logLevel: LlamaLogLevel.error,
    });
    const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
    return { llama, model };
}
