//! The CPU path's threads in the browser: rayon's global pool with the calling worker as
//! one of its threads (as natively, `fornax_cpu::set_threads`), the others on Web Workers
//! over the module's shared memory (`pool.js`). A product started from a thread outside
//! the pool would hand its work over and sleep until it is done: in a browser that wake-up
//! costs more than a decode step's products take.

use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;

use js_sys::Promise;
use rayon::ThreadBuilder;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

#[wasm_bindgen(module = "/src/pool.js")]
extern "C" {
    #[wasm_bindgen(js_name = startWorkers)]
    fn start_workers(
        main_js: &str,
        module: JsValue,
        memory: JsValue,
        threads: usize,
        receiver: usize,
    ) -> Promise;
}

/// Makes the calling worker one of `threads` threads of the kernels' pool and starts the
/// others on Web Workers that load the module at `main_js` (its glue's URL); resolves
/// once they run. Once per module instance; the page must be cross-origin isolated.
#[wasm_bindgen(js_name = initThreadPool)]
pub fn init_thread_pool(threads: usize, main_js: String) -> Promise {
    let threads = threads.max(1);
    let (sender, receiver) = channel::<ThreadBuilder>();
    // The workers share it for the life of the page.
    let receiver: &'static Mutex<Receiver<ThreadBuilder>> =
        Box::leak(Box::new(Mutex::new(receiver)));
    let started = start_workers(
        &main_js,
        wasm_bindgen::module(),
        wasm_bindgen::memory(),
        threads - 1,
        receiver as *const _ as usize,
    );
    future_to_promise(async move {
        // The workers first, waiting for their threads: building the pool waits until
        // every thread runs.
        JsFuture::from(started).await?;
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .spawn_handler(move |thread| {
                sender
                    .send(thread)
                    .map_err(|e| std::io::Error::other(e.to_string()))
            })
            .build_global()
            .map_err(|e| JsError::new(&format!("the thread pool cannot start: {e}")))?;
        Ok(JsValue::UNDEFINED)
    })
}

/// A pool worker's life: takes one of the pool's threads from `receiver` (the address
/// [`init_thread_pool`] passed) and runs it. Called by `pool.js` only.
#[wasm_bindgen(js_name = fornaxPoolThread)]
pub fn fornax_pool_thread(receiver: usize) {
    // SAFETY: the leaked receiver's address, valid for the life of the page.
    let receiver = unsafe { &*(receiver as *const Mutex<Receiver<ThreadBuilder>>) };
    let thread = receiver.lock().expect("the pool's receiver").recv();
    if let Ok(thread) = thread {
        thread.run();
    }
}
