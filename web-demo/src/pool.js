// The CPU path's thread pool on Web Workers: each worker runs this file, instantiates the
// module on the page's shared memory and becomes one rayon thread (pool.rs). The module's
// glue imports this file too, where it only listens for its own message type.

const INIT = "fornax_pool_init";
const READY = "fornax_pool_ready";

// Resolves with the first message of `type`; rejects if `target` (a worker) fails first.
function message(target, type) {
  return new Promise((resolve, reject) => {
    target.addEventListener("message", function on({ data }) {
      if (data?.type !== type) return;
      target.removeEventListener("message", on);
      resolve(data);
    });
    target.addEventListener("error", (e) => reject(new Error(`a pool worker failed: ${e.message ?? e}`)));
  });
}

if (typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope) {
  message(self, INIT).then(async ({ mainJS, module, memory, receiver }) => {
    try {
      const glue = await import(mainJS);
      await glue.default({ module_or_path: module, memory });
      postMessage({ type: READY });
      // Runs rayon's worker loop: never returns.
      glue.fornaxPoolThread(receiver);
    } catch (e) {
      postMessage({ type: READY, error: String(e?.stack ?? e) });
    }
  });
}

// Kept so that no browser collects a worker that shares the module's memory.
let workers = [];

/** Starts `threads` workers on `module` and `memory`, each taking a rayon thread from `receiver`. */
export async function startWorkers(mainJS, module, memory, threads, receiver) {
  workers = await Promise.all(
    Array.from({ length: threads }, async () => {
      const worker = new Worker(new URL(import.meta.url), { type: "module" });
      worker.postMessage({ type: INIT, mainJS, module, memory, receiver });
      const { error } = await message(worker, READY);
      if (error) throw new Error(`a pool worker failed: ${error}`);
      return worker;
    }),
  );
}
