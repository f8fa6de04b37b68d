//! The device arenas of the KV pool: per layer, keys and values of every tier, allocated
//! once; new tokens are written in place and aged blocks converted between tiers.
//!
//! Free slots are kept all zero, so a write is `select_add` into zeros (burn 0.21 has no
//! assigning scatter), which is exact; a freed slot is cleared by adding its negation.
//!
//! The FP32 arenas and the scales are FP32 whatever the activations' float type
//! (`--dtype`): the tier policy alone decides the cache's precision.

use std::ops::Range;

use burn_tensor::{backend::Backend, DType, IndexingUpdateOp, Int, Tensor, TensorData};

use super::{pack, BlockValues, KvCapacity, KvDims, Move, Tier, BLOCK_TOKENS};

/// A tensor held by exactly one owner, so burn updates it in place (a clone would make
/// every write copy the whole arena).
#[derive(Debug)]
pub struct Owned<T>(Option<T>);

impl<T> Owned<T> {
    fn new(value: T) -> Self {
        Self(Some(value))
    }

    /// The tensor (clone it only for reads that end before the next update).
    pub fn get(&self) -> &T {
        self.0.as_ref().expect("arena present between updates")
    }

    fn update(&mut self, f: impl FnOnce(T) -> T) {
        let value = self.0.take().expect("arena present between updates");
        self.0 = Some(f(value));
    }
}

/// Keys or values of one layer, one arena per tier (layout in `fornax_shaders`).
#[derive(Debug)]
pub struct TierArena<B: Backend> {
    /// `[slots * 32, n_kv * head_dim]` floats.
    pub f32_rows: Owned<Tensor<B, 2>>,
    /// `[slots * 32, n_kv * head_dim / 2]` words of two halves.
    pub f16_rows: Owned<Tensor<B, 2, Int>>,
    /// `[slots, n_kv]`.
    pub f16_scales: Owned<Tensor<B, 2>>,
    /// `[slots * 32, n_kv * head_dim / 4]` words of four signed bytes.
    pub i8_rows: Owned<Tensor<B, 2, Int>>,
    /// `[slots, n_kv]`.
    pub i8_scales: Owned<Tensor<B, 2>>,
}

/// Keys and values of one layer.
#[derive(Debug)]
pub struct LayerKv<B: Backend> {
    pub keys: TierArena<B>,
    pub values: TierArena<B>,
}

/// The arenas of a pool's layers (every layer, or those of one kind of attention).
#[derive(Debug)]
pub struct KvStore<B: Backend> {
    layers: Vec<LayerKv<B>>,
    /// The model layer each of `layers` holds.
    members: Vec<usize>,
    /// Dimensions of `layers` alone.
    dims: KvDims,
    device: B::Device,
}

impl<B: Backend> TierArena<B> {
    fn new(dims: KvDims, capacity: KvCapacity, device: &B::Device) -> Self {
        // A tier without slots keeps one dummy slot so every binding is a real buffer.
        let slots = |t: Tier| capacity.slots[t.index()].max(1);
        let width = |t: Tier| dims.n_kv_heads * t.words(dims.head_dim);
        let rows = |t: Tier| slots(t) * BLOCK_TOKENS;
        let f32s = (device, DType::F32);
        Self {
            f32_rows: Owned::new(Tensor::zeros([rows(Tier::F32), width(Tier::F32)], f32s)),
            f16_rows: Owned::new(Tensor::zeros([rows(Tier::F16), width(Tier::F16)], device)),
            f16_scales: Owned::new(Tensor::zeros([slots(Tier::F16), dims.n_kv_heads], f32s)),
            i8_rows: Owned::new(Tensor::zeros([rows(Tier::I8), width(Tier::I8)], device)),
            i8_scales: Owned::new(Tensor::zeros([slots(Tier::I8), dims.n_kv_heads], f32s)),
        }
    }

    /// Bytes of the five arenas, as the backend stores their elements.
    fn bytes(&self) -> usize {
        let floats = [&self.f32_rows, &self.f16_scales, &self.i8_scales]
            .map(|t| t.get().shape().num_elements() * t.get().dtype().size());
        let words = [&self.f16_rows, &self.i8_rows]
            .map(|t| t.get().shape().num_elements() * t.get().dtype().size());
        floats.iter().chain(&words).sum()
    }

    fn rows(&self, tier: Tier) -> Option<Tensor<B, 2, Int>> {
        match tier {
            Tier::F32 => None,
            Tier::F16 => Some(self.f16_rows.get().clone()),
            Tier::I8 => Some(self.i8_rows.get().clone()),
        }
    }

    fn scales(&self, tier: Tier) -> Tensor<B, 2> {
        match tier {
            Tier::I8 => self.i8_scales.get().clone(),
            _ => self.f16_scales.get().clone(),
        }
    }
}

impl<B: Backend> KvStore<B> {
    /// Zeroed arenas of every layer of `dims` for `capacity` on `device`.
    pub fn new(dims: KvDims, capacity: KvCapacity, device: &B::Device) -> Self {
        Self::for_layers((0..dims.n_layers).collect(), dims, capacity, device)
    }

    /// Zeroed arenas of model layers `members` (each with `dims`' heads) for `capacity`.
    pub fn for_layers(
        members: Vec<usize>,
        dims: KvDims,
        capacity: KvCapacity,
        device: &B::Device,
    ) -> Self {
        let dims = KvDims::dense(members.len(), dims.n_kv_heads, dims.head_dim);
        let layers = members
            .iter()
            .map(|_| LayerKv {
                keys: TierArena::new(dims, capacity, device),
                values: TierArena::new(dims, capacity, device),
            })
            .collect();
        Self {
            layers,
            members,
            dims,
            device: device.clone(),
        }
    }

    /// Where model `layer` sits in `layers`.
    fn local(&self, layer: usize) -> usize {
        self.members
            .iter()
            .position(|&m| m == layer)
            .unwrap_or_else(|| panic!("layer {layer} is not in this pool"))
    }

    /// Bytes the arenas take (every layer's keys and values, all tiers): what
    /// [`KvDims::block_bytes`] budgets per slot, where the backend stores words in 32 bits.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.keys.bytes() + l.values.bytes())
            .sum()
    }

    /// The arenas of model `layer`.
    pub fn layer(&self, layer: usize) -> &LayerKv<B> {
        &self.layers[self.local(layer)]
    }

    /// The device of the arenas.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Writes keys and values `[rows, n_kv * head_dim]` (any float dtype) of `layer` into
    /// FP32 arena `rows`.
    pub fn write(
        &mut self,
        layer: usize,
        rows: Tensor<B, 1, Int>,
        keys: Tensor<B, 2>,
        values: Tensor<B, 2>,
    ) {
        let local = self.local(layer);
        let kv = &mut self.layers[local];
        kv.keys
            .f32_rows
            .update(|t| add_rows(t, &rows, keys.cast(DType::F32)));
        kv.values
            .f32_rows
            .update(|t| add_rows(t, &rows, values.cast(DType::F32)));
    }

    /// The FP32 key and value arenas of `layer`, for kernels that write new rows in place
    /// (free slots are zero, so writing equals the adding [`Self::write`] does).
    pub fn f32_arenas(&self, layer: usize) -> (&Tensor<B, 2>, &Tensor<B, 2>) {
        let kv = self.layer(layer);
        (kv.keys.f32_rows.get(), kv.values.f32_rows.get())
    }

    /// Zeroes freed `slots` in every layer so they can be written again.
    pub fn clear(&mut self, slots: &[(Tier, u32)]) {
        for tier in Tier::ALL {
            let group: Vec<u32> = slots.iter().filter(|s| s.0 == tier).map(|s| s.1).collect();
            if group.is_empty() {
                continue;
            }
            let rows = block_rows::<B>(&group, &self.device);
            let slot_ids = ids::<B>(&group, &self.device);
            let clear = negate_rows::<B>;
            let clear_int = |t: Tensor<B, 2, Int>, idx: &Tensor<B, 1, Int>| {
                let old = t.clone().select(0, idx.clone());
                t.select_assign(0, idx.clone(), old.neg(), IndexingUpdateOp::Add)
            };
            for layer in &mut self.layers {
                for arena in [&mut layer.keys, &mut layer.values] {
                    match tier {
                        Tier::F32 => arena.f32_rows.update(|t| clear(t, &rows)),
                        Tier::F16 => {
                            arena.f16_rows.update(|t| clear_int(t, &rows));
                            arena.f16_scales.update(|t| clear(t, &slot_ids));
                        }
                        Tier::I8 => {
                            arena.i8_rows.update(|t| clear_int(t, &rows));
                            arena.i8_scales.update(|t| clear(t, &slot_ids));
                        }
                    }
                }
            }
        }
    }

    /// Zeroes FP32 arena `rows` (consecutive rows of one block) in every layer: tokens
    /// taken back, see [`BlockPool::truncate`](super::BlockPool::truncate).
    pub fn clear_rows(&mut self, rows: Range<u32>) {
        if rows.is_empty() {
            return;
        }
        let width = self.dims.n_kv_heads * self.dims.head_dim;
        let range = rows.start as usize..rows.end as usize;
        let zeros = Tensor::<B, 2>::zeros([range.len(), width], (&self.device, DType::F32));
        for layer in &mut self.layers {
            for arena in [&mut layer.keys, &mut layer.values] {
                arena
                    .f32_rows
                    .update(|t| t.slice_assign([range.clone(), 0..width], zeros.clone()));
            }
        }
    }

    /// Converts blocks as the pool decided: reads every source block back (for all layers
    /// at once: one read per source tier, plus one of the scales for a scaled tier), clears
    /// the sources, then re-encodes each block on the host and writes it into its new slot. Reading everything first matters: a slot freed
    /// by one move may be the destination of another.
    pub fn apply_moves(&mut self, moves: &[Move]) {
        self.transfer(moves, None);
    }

    /// Copies the first `rows` token rows of blocks into fresh (zeroed) slots, leaving
    /// the sources as they are (copy-on-write).
    pub fn copy_blocks(&mut self, copies: &[(Move, usize)]) {
        let moves: Vec<Move> = copies.iter().map(|c| c.0).collect();
        let keep: Vec<usize> = copies.iter().map(|c| c.1).collect();
        self.transfer(&moves, Some(&keep));
    }

    /// Moves (sources cleared) or, with `keep` rows per move, copies blocks.
    fn transfer(&mut self, moves: &[Move], keep: Option<&[usize]>) {
        let mut read = Vec::new();
        for source in Tier::ALL {
            let group: Vec<Move> = moves
                .iter()
                .copied()
                .filter(|m| m.from.0 == source)
                .collect();
            if !group.is_empty() {
                let slots: Vec<u32> = group.iter().map(|m| m.from.1).collect();
                read.push((self.read_blocks(source, &slots), group));
            }
        }
        if keep.is_none() {
            let freed: Vec<(Tier, u32)> = moves.iter().map(|m| m.from).collect();
            self.clear(&freed);
        }
        for (values, group) in &mut read {
            if let Some(keep) = keep {
                self.zero_tails(values, group, moves, keep);
            }
            for dest in Tier::ALL {
                let picks: Vec<usize> = (0..group.len())
                    .filter(|&i| group[i].to.0 == dest)
                    .collect();
                if !picks.is_empty() {
                    self.write_blocks(dest, group, &picks, values);
                }
            }
        }
    }

    /// The FP32 blocks in `slots`, each `[layer][k or v][token][n_kv * head_dim]`: one
    /// read for all of them.
    pub fn read_f32_blocks(&self, slots: &[u32]) -> Vec<BlockValues> {
        if slots.is_empty() {
            return Vec::new();
        }
        let values = self.read_blocks(Tier::F32, slots);
        let block_len = BLOCK_TOKENS * self.dims.n_kv_heads * self.dims.head_dim;
        let per_arena = slots.len() * block_len;
        (0..slots.len())
            .map(|i| {
                values
                    .chunks(per_arena)
                    .flat_map(|arena| &arena[i * block_len..(i + 1) * block_len])
                    .copied()
                    .collect()
            })
            .collect()
    }

    /// Writes blocks read by [`Self::read_f32_blocks`] into FP32 `slots` (free, so zero).
    pub fn write_f32_blocks(&mut self, blocks: &[(u32, BlockValues)]) {
        if blocks.is_empty() {
            return;
        }
        let block_len = BLOCK_TOKENS * self.dims.n_kv_heads * self.dims.head_dim;
        let arenas = 2 * self.dims.n_layers;
        let mut values = Vec::with_capacity(arenas * blocks.len() * block_len);
        for a in 0..arenas {
            for (_, block) in blocks {
                values.extend_from_slice(&block[a * block_len..(a + 1) * block_len]);
            }
        }
        let group: Vec<Move> = blocks
            .iter()
            .map(|&(slot, _)| Move {
                from: (Tier::F32, slot),
                to: (Tier::F32, slot),
            })
            .collect();
        let picks: Vec<usize> = (0..blocks.len()).collect();
        self.write_blocks(Tier::F32, &group, &picks, &values);
    }

    /// Zeroes the rows past `keep` of each block in `values` (read for `group`, a subset of
    /// `moves` in order), so a copy holds only the tokens of the sequence it is for.
    fn zero_tails(&self, values: &mut [f32], group: &[Move], moves: &[Move], keep: &[usize]) {
        let row_len = self.dims.n_kv_heads * self.dims.head_dim;
        let block_len = BLOCK_TOKENS * row_len;
        let per_arena = group.len() * block_len;
        for (i, m) in group.iter().enumerate() {
            let k = keep[moves.iter().position(|x| x == m).expect("in moves")];
            for arena in 0..values.len() / per_arena {
                let start = arena * per_arena + i * block_len;
                values[start + k * row_len..start + block_len].fill(0.0);
            }
        }
    }

    /// Values of blocks `slots` of `tier` as floats, indexed
    /// `[layer][k or v][block][token][n_kv * head_dim]` and flattened.
    fn read_blocks(&self, tier: Tier, slots: &[u32]) -> Vec<f32> {
        let rows = block_rows::<B>(slots, &self.device);
        let arenas = self.layers.iter().flat_map(|l| [&l.keys, &l.values]);
        let width = self.dims.n_kv_heads * tier.words(self.dims.head_dim);
        match tier {
            Tier::F32 => {
                let parts: Vec<_> = arenas
                    .map(|a| a.f32_rows.get().clone().select(0, rows.clone()))
                    .collect();
                to_f32(Tensor::cat(parts, 0))
            }
            _ => {
                let arenas: Vec<_> = arenas.collect();
                let words: Vec<_> = arenas
                    .iter()
                    .map(|a| a.rows(tier).expect("scaled").select(0, rows.clone()))
                    .collect();
                let slot_ids = ids::<B>(slots, &self.device);
                let scales: Vec<_> = arenas
                    .iter()
                    .map(|a| a.scales(tier).select(0, slot_ids.clone()))
                    .collect();
                let words: Vec<u32> = crate::device_counts::read_back(Tensor::cat(words, 0))
                    .convert::<i64>()
                    .into_vec::<i64>()
                    .expect("int data")
                    .into_iter()
                    .map(|w| w as u32)
                    .collect();
                let scales = to_f32(Tensor::cat(scales, 0));
                let hd_words = tier.words(self.dims.head_dim);
                let mut out = Vec::with_capacity(words.len() * self.dims.head_dim / hd_words);
                for (r, row) in words.chunks(width).enumerate() {
                    let block = r / BLOCK_TOKENS;
                    for (h, head) in row.chunks(hd_words).enumerate() {
                        let scale = scales[block * self.dims.n_kv_heads + h];
                        out.extend(match tier {
                            Tier::F16 => pack::decode_f16(head, scale),
                            _ => pack::decode_i8(head, scale),
                        });
                    }
                }
                out
            }
        }
    }

    /// Encodes blocks `picks` of `group` (values from [`read_blocks`](Self::read_blocks))
    /// into their destination slots of `tier`.
    fn write_blocks(&mut self, tier: Tier, group: &[Move], picks: &[usize], values: &[f32]) {
        let dims = self.dims;
        let hd = dims.head_dim;
        let row_len = dims.n_kv_heads * hd;
        let block_len = BLOCK_TOKENS * row_len;
        let per_arena = group.len() * block_len;
        let dest_slots: Vec<u32> = picks.iter().map(|&i| group[i].to.1).collect();
        let rows = block_rows::<B>(&dest_slots, &self.device);
        let slot_ids = ids::<B>(&dest_slots, &self.device);
        let width = dims.n_kv_heads * tier.words(hd);
        for (a, layer) in self.layers.iter_mut().enumerate() {
            for (which, arena) in [&mut layer.keys, &mut layer.values].into_iter().enumerate() {
                let base = (2 * a + which) * per_arena;
                let blocks: Vec<&[f32]> = picks
                    .iter()
                    .map(|&i| &values[base + i * block_len..base + (i + 1) * block_len])
                    .collect();
                if tier == Tier::F32 {
                    let data: Vec<f32> = blocks.concat();
                    let t = Tensor::from_data(
                        TensorData::new(data, [picks.len() * BLOCK_TOKENS, row_len]),
                        (&self.device, DType::F32),
                    );
                    arena.f32_rows.update(|a| add_rows(a, &rows, t));
                    continue;
                }
                let mut words = vec![0i64; picks.len() * BLOCK_TOKENS * width];
                let mut scales = Vec::with_capacity(picks.len() * dims.n_kv_heads);
                for (b, block) in blocks.iter().enumerate() {
                    for h in 0..dims.n_kv_heads {
                        let head: Vec<f32> = (0..BLOCK_TOKENS)
                            .flat_map(|t| {
                                block[t * row_len + h * hd..t * row_len + (h + 1) * hd]
                                    .iter()
                                    .copied()
                            })
                            .collect();
                        let (scale, packed) = match tier {
                            Tier::F16 => {
                                let s = pack::f16_scale(&head);
                                (s, pack::encode_f16(&head, s))
                            }
                            _ => {
                                let s = pack::i8_scale(&head);
                                (s, pack::encode_i8(&head, s))
                            }
                        };
                        scales.push(scale);
                        let w = tier.words(hd);
                        for t in 0..BLOCK_TOKENS {
                            let dst = (b * BLOCK_TOKENS + t) * width + h * w;
                            for (i, &word) in packed[t * w..(t + 1) * w].iter().enumerate() {
                                // Stored as the signed reading of the bits, which every
                                // integer element type (i32, i64) holds exactly.
                                words[dst + i] = i64::from(word as i32);
                            }
                        }
                    }
                }
                let words = Tensor::<B, 2, Int>::from_data(
                    TensorData::new(words, [picks.len() * BLOCK_TOKENS, width]),
                    &self.device,
                );
                let scales = Tensor::<B, 2>::from_data(
                    TensorData::new(scales, [picks.len(), dims.n_kv_heads]),
                    (&self.device, DType::F32),
                );
                let assign_rows = |t: Tensor<B, 2, Int>| {
                    t.select_assign(0, rows.clone(), words.clone(), IndexingUpdateOp::Add)
                };
                let assign_scales = |t: Tensor<B, 2>| add_rows(t, &slot_ids, scales.clone());
                match tier {
                    Tier::F16 => {
                        arena.f16_rows.update(assign_rows);
                        arena.f16_scales.update(assign_scales);
                    }
                    _ => {
                        arena.i8_rows.update(assign_rows);
                        arena.i8_scales.update(assign_scales);
                    }
                }
            }
        }
    }
}

/// `arena` with `values` added to rows `rows` (a write, as free rows are zero).
fn add_rows<B: Backend>(
    arena: Tensor<B, 2>,
    rows: &Tensor<B, 1, Int>,
    values: Tensor<B, 2>,
) -> Tensor<B, 2> {
    arena.select_assign(0, rows.clone(), values, IndexingUpdateOp::Add)
}

/// Zeroes `rows` of `arena` by adding their negation (exact).
fn negate_rows<B: Backend>(arena: Tensor<B, 2>, rows: &Tensor<B, 1, Int>) -> Tensor<B, 2> {
    let old = arena.clone().select(0, rows.clone());
    add_rows(arena, rows, old.neg())
}

/// Arena rows of every token of blocks `slots`, in order.
pub(crate) fn block_rows<B: Backend>(slots: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let rows: Vec<i64> = slots
        .iter()
        .flat_map(|&s| {
            (0..BLOCK_TOKENS as i64).map(move |t| i64::from(s) * BLOCK_TOKENS as i64 + t)
        })
        .collect();
    let n = rows.len();
    Tensor::from_data(TensorData::new(rows, [n]), device)
}

/// A 1-D index tensor.
pub(crate) fn ids<B: Backend>(values: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = values.iter().map(|&x| i64::from(x)).collect();
    Tensor::from_data(TensorData::new(v, [values.len()]), device)
}

fn to_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    crate::device_counts::read_back(t)
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 data")
}
