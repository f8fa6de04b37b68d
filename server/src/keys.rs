//! API keys: who may use the server, the highest QoS class each may ask for, and its
//! limits. Keys are held only as SHA-256 digests and compared in constant time; only a
//! key's name ever reaches logs, errors or metrics.

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Lowest QoS class (batch); 0 is interactive, served first.
pub const LOWEST_CLASS: u8 = 3;

/// A key's SHA-256 digest.
pub type KeyDigest = [u8; 32];

/// The digest of a key as presented.
pub fn digest(key: &[u8]) -> KeyDigest {
    Sha256::digest(key).into()
}

/// Whether two digests are equal, in time independent of their contents: every byte is
/// compared whatever the first difference (`subtle`), and digests have one length
/// whatever the keys' lengths.
pub fn same_digest(a: &KeyDigest, b: &KeyDigest) -> bool {
    a.ct_eq(b).into()
}

/// Per-window limits of one key (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Requests per window.
    pub requests: Option<u64>,
    /// Prompt plus generated tokens per window.
    pub tokens: Option<u64>,
}

/// One configured key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// What logs and metrics call the key.
    pub name: String,
    /// The highest QoS class (lowest number) the key may use.
    pub class: u8,
    pub quota: Quota,
    digest: KeyDigest,
}

impl fmt::Debug for ApiKey {
    // The digest stays out of debug output too.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("class", &self.class)
            .field("quota", &self.quota)
            .finish()
    }
}

impl ApiKey {
    /// A key with full access and no limits.
    pub fn open(name: impl Into<String>, key: &str) -> Result<Self> {
        check_secret(key)?;
        Ok(Self {
            name: name.into(),
            class: 0,
            quota: Quota::default(),
            digest: digest(key.as_bytes()),
        })
    }
}

/// The keys a server accepts. Empty: the server is open to anyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRing {
    keys: Vec<ApiKey>,
}

impl KeyRing {
    /// `keys`, refusing two keys with one secret or one name.
    pub fn new(keys: Vec<ApiKey>) -> Result<Self> {
        for (i, k) in keys.iter().enumerate() {
            for other in &keys[..i] {
                if other.name == k.name {
                    bail!("two keys are named `{}`", k.name);
                }
                if same_digest(&other.digest, &k.digest) {
                    bail!("keys `{}` and `{}` are the same key", other.name, k.name);
                }
            }
        }
        Ok(Self { keys })
    }

    /// The keys of a keys file followed by `extra` (from flags and the environment).
    pub fn load(file: Option<&Path>, extra: &[ApiKey]) -> Result<Self> {
        let mut keys = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the keys file {}", path.display()))?;
                parse_keys_file(&text)
                    .with_context(|| format!("the keys file {}", path.display()))?
            }
            None => Vec::new(),
        };
        keys.extend(extra.iter().cloned());
        Self::new(keys)
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The key whose secret is `presented`. Every configured key is compared, in constant
    /// time, whichever matches; `compared` (when given) counts the comparisons.
    pub fn identify(&self, presented: &[u8], compared: Option<&mut usize>) -> Option<&ApiKey> {
        let wanted = digest(presented);
        let mut found = 0u32;
        let mut any = subtle::Choice::from(0);
        let mut count = 0;
        for (i, k) in self.keys.iter().enumerate() {
            let hit = k.digest.ct_eq(&wanted);
            found.conditional_assign(&(i as u32), hit);
            any |= hit;
            count += 1;
        }
        if let Some(c) = compared {
            *c = count;
        }
        bool::from(any).then(|| &self.keys[found as usize])
    }
}

/// A secret must be printable ASCII without spaces, at least 8 characters.
fn check_secret(key: &str) -> Result<()> {
    if key.len() < 8 {
        bail!("an API key must have at least 8 characters");
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("an API key must be printable ASCII without spaces");
    }
    Ok(())
}

/// Parses a keys file: one key per line, `KEY NAME CLASS [rpm=N] [tpm=N]`, where CLASS is
/// the highest QoS class the key may use (0 interactive .. 3 batch), `rpm` its requests
/// and `tpm` its prompt plus generated tokens per window (a minute unless the server is
/// told otherwise). Blank lines and lines starting with `#` are skipped. Errors name the
/// line, never the key.
pub fn parse_keys_file(text: &str) -> Result<Vec<ApiKey>> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = parse_line(line).with_context(|| format!("line {}", n + 1))?;
        keys.push(key);
    }
    Ok(keys)
}

fn parse_line(line: &str) -> Result<ApiKey> {
    let mut fields = line.split_whitespace();
    let (Some(secret), Some(name), Some(class)) = (fields.next(), fields.next(), fields.next())
    else {
        bail!("expected `KEY NAME CLASS [rpm=N] [tpm=N]`");
    };
    check_secret(secret)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        bail!("a key's name may hold letters, digits, `-`, `_` and `.` only");
    }
    let class: u8 = match class.parse() {
        Ok(c) if c <= LOWEST_CLASS => c,
        _ => bail!("the class of key `{name}` must be 0 (interactive) .. {LOWEST_CLASS} (batch)"),
    };
    let mut quota = Quota::default();
    for field in fields {
        let (what, value) = field
            .split_once('=')
            .with_context(|| format!("key `{name}`: expected rpm=N or tpm=N, found `{field}`"))?;
        let value: u64 = value
            .parse()
            .ok()
            .filter(|v| *v > 0)
            .with_context(|| format!("key `{name}`: {what} must be a positive integer"))?;
        let slot = match what {
            "rpm" => &mut quota.requests,
            "tpm" => &mut quota.tokens,
            _ => bail!("key `{name}`: unknown limit `{what}` (rpm or tpm)"),
        };
        if slot.replace(value).is_some() {
            bail!("key `{name}`: {what} given twice");
        }
    }
    Ok(ApiKey {
        name: name.to_string(),
        class,
        quota,
        digest: digest(secret.as_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_compare_equal_only_for_the_same_key() {
        let key = b"fx-0123456789abcdef";
        assert!(same_digest(&digest(key), &digest(key)));
        let mut first = *key;
        first[0] ^= 1;
        let mut last = *key;
        last[key.len() - 1] ^= 1;
        for other in [
            &first[..],
            &last[..],
            &key[..key.len() - 1],
            b"",
            b"fx-0123456789abcdefg",
        ] {
            assert!(!same_digest(&digest(key), &digest(other)), "{other:?}");
        }
    }

    /// The constant-time property, checked on what the comparison does rather than by
    /// timing: the compared values have one length whatever the keys' lengths, and a
    /// lookup compares the presented key with every configured key, whether it matches the
    /// first, the last or none.
    #[test]
    fn lookups_compare_every_key_over_fixed_length_digests() {
        for key in [&b"x"[..], &[7u8; 1000][..], b""] {
            assert_eq!(digest(key).len(), 32);
        }
        let ring = KeyRing::new(
            (0..5)
                .map(|i| ApiKey::open(format!("k{i}"), &format!("secret-key-{i}")).unwrap())
                .collect(),
        )
        .unwrap();
        for (presented, want) in [
            ("secret-key-0", Some("k0")),
            ("secret-key-4", Some("k4")),
            ("secret-key-9", None),
            ("", None),
        ] {
            let mut compared = 0;
            let found = ring.identify(presented.as_bytes(), Some(&mut compared));
            assert_eq!(found.map(|k| k.name.as_str()), want, "{presented}");
            assert_eq!(compared, 5, "every key compared for {presented:?}");
        }
    }

    #[test]
    fn keys_files_parse_with_classes_and_limits() {
        let text =
            "# team keys\n\nsk-interactive-1 web 0\n  sk-batch-000002 nightly 2 rpm=30 tpm=5000\n";
        let keys = parse_keys_file(text).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!((keys[0].name.as_str(), keys[0].class), ("web", 0));
        assert_eq!(keys[0].quota, Quota::default());
        assert_eq!((keys[1].name.as_str(), keys[1].class), ("nightly", 2));
        assert_eq!(
            keys[1].quota,
            Quota {
                requests: Some(30),
                tokens: Some(5000)
            }
        );
        let ring = KeyRing::new(keys).unwrap();
        assert_eq!(
            ring.identify(b"sk-batch-000002", None)
                .map(|k| k.name.as_str()),
            Some("nightly")
        );
    }

    #[test]
    fn bad_keys_files_name_the_line_and_never_the_key() {
        for (text, want) in [
            ("sk-secret-value web", "line 1"),
            ("sk-secret-value web 4", "class"),
            ("sk-good-key-1 a 0\nsk-secret-value web 0 rpm=0", "line 2"),
            ("sk-secret-value web 0 rps=3", "unknown limit"),
            ("sk-secret-value web 0 rpm=3 rpm=4", "twice"),
            ("short web 0", "8 characters"),
            ("sk-secret-value w/b 0", "name"),
        ] {
            let e = format!("{:#}", parse_keys_file(text).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains("sk-secret-value"), "the key leaked: {e}");
        }
        let twice = "sk-secret-value a 0\nsk-secret-value b 1";
        let e = format!(
            "{:#}",
            KeyRing::new(parse_keys_file(twice).unwrap()).unwrap_err()
        );
        assert!(e.contains("same key") && !e.contains("sk-secret"), "{e}");
    }
}
