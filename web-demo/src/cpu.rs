//! The CPU path: the engine's CPU backend (`fornax-cpu`'s kernels at the `simd128` level
//! this module is built with), on a thread pool of Web Workers in the build with threads.

use wasm_bindgen::prelude::wasm_bindgen;

/// One line for the page: the SIMD level and the threads the kernels run on.
#[wasm_bindgen(js_name = cpuDevice)]
pub fn cpu_device() -> String {
    let threads = fornax_cpu::threads();
    format!(
        "CPU, {} kernels, {threads} thread{}{}",
        fornax_cpu::SimdLevel::best().name(),
        if threads == 1 { "" } else { "s" },
        match cfg!(feature = "threads") {
            true => " (Web Workers over shared memory)",
            false => "",
        }
    )
}

/// Every SIMD level of this module against the portable one on random blocks of each
/// format (`fornax_cpu::check_levels`): a summary, or an error naming what differed.
#[wasm_bindgen(js_name = checkCpuKernels)]
pub fn check_cpu_kernels() -> Result<String, wasm_bindgen::JsError> {
    fornax_cpu::check_levels().map_err(|e| wasm_bindgen::JsError::new(&e))
}
