//! Priority policies: which requests a step serves first (and which it preempts last).

use super::Entry;

/// Orders requests: lower keys are served first; ties go to the earlier arrival.
pub trait Policy: Send {
    /// The policy's name, as the `--policy` flag spells it.
    fn name(&self) -> &'static str;
    /// The key of `r` at scheduler step `step`.
    fn key(&self, r: &Entry, step: u64) -> f64;
}

/// First come, first served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fcfs;

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn key(&self, r: &Entry, _step: u64) -> f64 {
        r.arrival as f64
    }
}

/// The seed's score: `0.6 x` request length over the longest possible (`norm_len`) plus
/// `0.4 x` QoS level over 3. Long batch-class requests can wait forever under load.
#[derive(Debug, Clone, Copy)]
pub struct SeedScore {
    pub norm_len: usize,
}

impl Policy for SeedScore {
    fn name(&self) -> &'static str {
        "seed"
    }

    fn key(&self, r: &Entry, _step: u64) -> f64 {
        0.6 * r.max_len() as f64 / self.norm_len.max(1) as f64 + 0.4 * f64::from(r.qos) / 3.0
    }
}

/// The default: QoS class first, then the least remaining work; a request gains one class
/// every `aging_steps` steps since it arrived, so nothing waits forever.
#[derive(Debug, Clone, Copy)]
pub struct QosAging {
    pub aging_steps: u64,
}

impl Default for QosAging {
    fn default() -> Self {
        Self { aging_steps: 64 }
    }
}

impl Policy for QosAging {
    fn name(&self) -> &'static str {
        "qos-aging"
    }

    fn key(&self, r: &Entry, step: u64) -> f64 {
        let age = step.saturating_sub(r.submitted_step) / self.aging_steps.max(1);
        let class = f64::from(r.qos) - age as f64;
        // Remaining work is far below 1e7 tokens, so the class always dominates.
        class * 1e7 + r.remaining_work() as f64
    }
}

/// The policies by name, for flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    Fcfs,
    Seed,
    #[default]
    QosAging,
}

impl PolicyKind {
    /// The flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Seed => "seed",
            Self::QosAging => "qos-aging",
        }
    }

    /// Builds the policy; `norm_len` normalises lengths for [`SeedScore`].
    pub fn build(self, norm_len: usize) -> Box<dyn Policy> {
        match self {
            Self::Fcfs => Box::new(Fcfs),
            Self::Seed => Box::new(SeedScore { norm_len }),
            Self::QosAging => Box::new(QosAging::default()),
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "seed" => Ok(Self::Seed),
            "qos-aging" => Ok(Self::QosAging),
            _ => Err(format!("unknown policy {s:?} (fcfs, seed, qos-aging)")),
        }
    }
}
