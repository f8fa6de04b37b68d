//! Fornax in the browser: the engine's model, paged KV cache and generation loop on
//! burn's wgpu backend over WebGPU. `www/worker.js` drives a [`Session`] from a Web
//! Worker so the page stays responsive; `scripts/web-demo.sh` builds and serves it.

mod check;
mod device;
mod session;

pub use check::check_kernels;
pub use device::{webgpu_adapter, Adapter, WebBackend};
pub use session::Session;

use wasm_bindgen::prelude::wasm_bindgen;

/// Routes Rust panics and `log` warnings and errors (burn's, cubecl's) to the browser
/// console.
#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
    let _ = console_log::init_with_level(log::Level::Warn);
}
