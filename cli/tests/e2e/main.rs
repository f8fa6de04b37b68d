//! The `fornax` binary and its server end to end, in one test binary (each file a module).

mod api_keys;
mod bench_table;
mod cli;
mod kv_remote;
mod server;
mod speculation;
