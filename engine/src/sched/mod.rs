//! Continuous (iteration-level) batching: requests, priority policies and the batch each
//! step runs. Model-free: [`crate::engine::Engine`] runs the plans on the model.
//!
//! One rule drives it: a request has the tokens computed so far (their KV is cached) and
//! the tokens it needs (prompt plus what it generated); every step lets requests catch up,
//! in policy order, as far as the token budget allows. A long prompt is thus prefilled in
//! chunks beside running decodes, and a preempted request simply has nothing computed.

mod blocks;
mod policy;
mod request;
mod scheduler;
#[cfg(test)]
mod tests;
mod window;

pub use blocks::KvBlocks;
pub use policy::{Fcfs, Policy, PolicyKind, QosAging, SeedScore};
pub use request::{Entry, FinishReason, RequestId, SubmitError};
pub use scheduler::{Scheduled, Scheduler, SchedulerConfig, StepPlan};
pub use window::ElasticWindow;
