//! Fornax in the browser: the engine's model, paged KV cache and generation loop on
//! burn's wgpu backend over WebGPU, or on the CPU backend where WebGPU is missing or
//! computes in software. `www/worker.js` drives a [`Session`] from a Web Worker so the
//! page stays responsive; `scripts/web-demo.sh` builds the two modules (WebGPU with a
//! one-thread CPU path; the CPU path on threads) and serves them.

#[cfg(feature = "webgpu")]
mod check;
mod cpu;
#[cfg(feature = "webgpu")]
mod device;
#[cfg(feature = "threads")]
mod pool;
mod session;

#[cfg(feature = "webgpu")]
pub use check::check_kernels;
pub use cpu::{check_cpu_kernels, cpu_device};
#[cfg(feature = "webgpu")]
pub use device::{webgpu_adapter, Adapter, WebBackend};
#[cfg(feature = "threads")]
pub use pool::{fornax_pool_thread, init_thread_pool};
pub use session::Session;

use wasm_bindgen::prelude::wasm_bindgen;

/// Routes Rust panics and `log` warnings and errors (burn's, cubecl's) to the browser
/// console.
#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
    let _ = console_log::init_with_level(log::Level::Warn);
}
