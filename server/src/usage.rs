//! Each key's use over a sliding window: requests admitted and tokens counted, against the
//! key's [`Quota`]. Kept by key name, so a reloaded keys file keeps the counts.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::keys::{ApiKey, Quota};

/// Why a request was refused, and when the key may try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The key's requests per window are used up.
    Requests { retry_after: Duration },
    /// The key's tokens per window are used up.
    Tokens { retry_after: Duration },
}

impl Refusal {
    /// The `reason` label of the refusal metric.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Requests { .. } => "requests",
            Refusal::Tokens { .. } => "tokens",
        }
    }

    pub fn retry_after(&self) -> Duration {
        match self {
            Refusal::Requests { retry_after } | Refusal::Tokens { retry_after } => *retry_after,
        }
    }
}

#[derive(Debug, Default)]
struct Window {
    requests: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
}

impl Window {
    fn forget_before(&mut self, start: Instant) {
        while self.requests.front().is_some_and(|t| *t <= start) {
            self.requests.pop_front();
        }
        while self.tokens.front().is_some_and(|(t, _)| *t <= start) {
            self.tokens.pop_front();
        }
    }
}

/// Every key's window.
#[derive(Debug)]
pub struct Usage {
    length: Duration,
    windows: Mutex<HashMap<String, Window>>,
}

impl Usage {
    /// Windows `length` long.
    pub fn new(length: Duration) -> Self {
        Self {
            length,
            windows: Mutex::new(HashMap::new()),
        }
    }

    pub fn window(&self) -> Duration {
        self.length
    }

    /// Admits one request of `key` at `now` and counts it, or says why not.
    pub fn admit(&self, key: &ApiKey, now: Instant) -> Result<(), Refusal> {
        let Quota { requests, tokens } = key.quota;
        if requests.is_none() && tokens.is_none() {
            return Ok(());
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let w = windows.entry(key.name.clone()).or_default();
        let start = now.checked_sub(self.length).unwrap_or(now);
        w.forget_before(start);
        let until_free = |t: Instant| (t + self.length).saturating_duration_since(now);
        if let Some(limit) = requests {
            if w.requests.len() as u64 >= limit {
                // The oldest of the last `limit` requests leaves the window first.
                let oldest = w.requests[w.requests.len() - limit as usize];
                return Err(Refusal::Requests {
                    retry_after: until_free(oldest),
                });
            }
        }
        if let Some(limit) = tokens {
            let mut used: u64 = w.tokens.iter().map(|(_, n)| n).sum();
            if used >= limit {
                let mut retry_after = self.length;
                for (t, n) in &w.tokens {
                    used -= n;
                    if used < limit {
                        retry_after = until_free(*t);
                        break;
                    }
                }
                return Err(Refusal::Tokens { retry_after });
            }
        }
        w.requests.push_back(now);
        Ok(())
    }

    /// Counts `tokens` used by `key` at `now` (prompt tokens on admission, generated
    /// tokens as a request ends).
    pub fn add_tokens(&self, key: &ApiKey, tokens: u64, now: Instant) {
        if key.quota.tokens.is_none() || tokens == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .entry(key.name.clone())
            .or_default()
            .tokens
            .push_back((now, tokens));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::parse_keys_file;

    fn key(line: &str) -> ApiKey {
        parse_keys_file(line).unwrap().remove(0)
    }

    #[test]
    fn requests_per_window_are_refused_until_the_oldest_leaves() {
        let usage = Usage::new(Duration::from_secs(60));
        let k = key("sk-limited-key limited 1 rpm=2");
        let t0 = Instant::now();
        assert!(usage.admit(&k, t0).is_ok());
        assert!(usage.admit(&k, t0 + Duration::from_secs(10)).is_ok());
        let refused = usage.admit(&k, t0 + Duration::from_secs(20)).unwrap_err();
        assert_eq!(
            refused,
            Refusal::Requests {
                retry_after: Duration::from_secs(40)
            }
        );
        assert!(usage.admit(&k, t0 + Duration::from_secs(61)).is_ok());
        // Refusals are not counted: the next one is due when the second request leaves.
        assert_eq!(
            usage
                .admit(&k, t0 + Duration::from_secs(62))
                .unwrap_err()
                .retry_after(),
            Duration::from_secs(8)
        );
    }

    #[test]
    fn tokens_per_window_count_prompt_and_generated_tokens() {
        let usage = Usage::new(Duration::from_secs(60));
        let k = key("sk-limited-key limited 1 tpm=100");
        let free = key("sk-unlimited-key free 0");
        let t0 = Instant::now();
        assert!(usage.admit(&k, t0).is_ok());
        usage.add_tokens(&k, 30, t0);
        usage.add_tokens(&k, 40, t0 + Duration::from_secs(5));
        assert!(usage.admit(&k, t0 + Duration::from_secs(6)).is_ok());
        usage.add_tokens(&k, 50, t0 + Duration::from_secs(7));
        // 120 used: free again once the first 30 leave (at 60 s).
        let refused = usage.admit(&k, t0 + Duration::from_secs(8)).unwrap_err();
        assert_eq!(refused.label(), "tokens");
        assert_eq!(refused.retry_after(), Duration::from_secs(52));
        assert!(usage.admit(&k, t0 + Duration::from_secs(60)).is_ok());
        for _ in 0..1000 {
            assert!(usage.admit(&free, t0).is_ok(), "a key without limits");
        }
    }
}
