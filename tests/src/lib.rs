//! End-to-end tests of Fornax on the real model. They are one test binary,
//! `tests/e2e/main.rs`, with its shared helpers in `tests/e2e/common.rs` (kept out of
//! this library so the engine's generic code is compiled once, for that binary alone).
