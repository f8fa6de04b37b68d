//! SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`: Gemma, Llama 2),
//! encoded as llama.cpp encodes them, so that both engines see the same ids: special
//! tokens split out first (longest first), spaces written `▁`, then each piece of text
//! starts as one symbol per character and the adjacent pair whose join is the
//! highest-scoring vocabulary entry merges until none is left; symbols that are not
//! entries fall back to byte tokens `<0xXX>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ahash::AHashMap;

/// GGUF token types (`tokenizer.ggml.token_type`).
pub(super) mod types {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const BYTE: i64 = 6;
}

/// SentencePiece's space.
const SPACE: &str = "\u{2581}";

/// A special token matched in raw text before the merges.
#[derive(Debug)]
struct Special {
    text: String,
    id: u32,
    /// Control and unknown tokens are matched only when special tokens are parsed;
    /// user-defined ones always.
    needs_parse: bool,
}

/// The vocabulary and scores of a SentencePiece-style tokenizer.
#[derive(Debug)]
pub struct Spm {
    ids: AHashMap<String, u32>,
    scores: Vec<f32>,
    /// `<0xXX>` of each byte value.
    byte_ids: Vec<Option<u32>>,
    unknown: Option<u32>,
    /// Longest first.
    specials: Vec<Special>,
    /// A space before text at the start and after each special token
    /// (`tokenizer.ggml.add_space_prefix`, SentencePiece's dummy prefix).
    space_prefix: bool,
}

/// A run of text or an already-known token.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Spm {
    /// The tokenizer of `tokens` with their `scores` and GGUF `types`.
    pub fn new(
        tokens: &[&str],
        scores: &[f32],
        types: &[i64],
        unknown: Option<u32>,
        space_prefix: bool,
    ) -> Self {
        let mut ids = AHashMap::with_capacity(tokens.len());
        // The first of duplicate texts wins, as in llama.cpp's map.
        for (i, t) in tokens.iter().enumerate() {
            ids.entry(t.to_string()).or_insert(i as u32);
        }
        let byte_ids = (0..=255u8)
            .map(|b| ids.get(&format!("<0x{b:02X}>")).copied())
            .collect();
        let mut specials: Vec<Special> = tokens
            .iter()
            .zip(types)
            .enumerate()
            .filter(|(_, (t, &ty))| {
                !t.is_empty() && matches!(ty, types::CONTROL | types::USER_DEFINED | types::UNKNOWN)
            })
            .map(|(i, (t, &ty))| Special {
                text: t.to_string(),
                id: i as u32,
                needs_parse: ty != types::USER_DEFINED,
            })
            .collect();
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        Self {
            ids,
            scores: scores.to_vec(),
            byte_ids,
            unknown,
            specials,
            space_prefix,
        }
    }

    /// The id of the token whose vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Encodes `text`; with `parse_special`, control-token text such as `<start_of_turn>`
    /// becomes its token.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let mut after_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    let prefix = if self.space_prefix && after_special {
                        SPACE
                    } else {
                        ""
                    };
                    self.merge(&format!("{prefix}{}", t.replace(' ', SPACE)), &mut out);
                    after_special = false;
                }
            }
        }
        out
    }

    /// `text` split around the special tokens it contains, longest tokens first.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut present = [false; 256];
        text.bytes().for_each(|b| present[b as usize] = true);
        let mut fragments = vec![Fragment::Text(text)];
        for special in &self.specials {
            if (special.needs_parse && !parse_special)
                || !present[special.text.as_bytes()[0] as usize]
            {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len());
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(&special.text) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(special.id));
                    rest = &rest[at + special.text.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    /// The merges over one piece of text, appending its tokens to `out`.
    fn merge(&self, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            })
            .collect();
        let Some(last) = symbols.last_mut() else {
            return;
        };
        last.next = None;
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_pair(text, &symbols, i - 1, i, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (pair.left, pair.right);
            if symbols[l].len == 0
                || symbols[r].len == 0
                || symbols[l].len + symbols[r].len != pair.len
            {
                continue;
            }
            symbols[l].len += symbols[r].len;
            symbols[r].len = 0;
            symbols[l].next = symbols[r].next;
            if let Some(n) = symbols[l].next {
                symbols[n].prev = Some(l);
            }
            if let Some(p) = symbols[l].prev {
                self.push_pair(text, &symbols, p, l, &mut queue);
            }
            if let Some(n) = symbols[l].next {
                self.push_pair(text, &symbols, l, n, &mut queue);
            }
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(
                    piece
                        .bytes()
                        .filter_map(|b| self.byte_ids[b as usize].or(self.unknown)),
                ),
            }
            at = s.next;
        }
    }

    /// Queues the join of symbols `left` and `right` if it is a vocabulary entry.
    fn push_pair(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let (l, r) = (&symbols[left], &symbols[right]);
        let len = l.len + r.len;
        if let Some(&id) = self.ids.get(&text[l.start..l.start + len]) {
            queue.push(Pair {
                score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                left,
                right,
                len,
            });
        }
    }
}

/// A run of characters during the merges; merged-away symbols have length zero.
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: the higher score first, then the leftmost.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// The bytes token `text` of type `ty` stands for: `▁` as a space, `<0xXX>` as its byte.
pub(super) fn token_bytes(text: &str, ty: i64) -> Vec<u8> {
    if ty == types::BYTE {
        let hex = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'));
        if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            return vec![b];
        }
    }
    match ty {
        types::NORMAL => text.replace(SPACE, " ").into_bytes(),
        _ => text.as_bytes().to_vec(),
    }
}
