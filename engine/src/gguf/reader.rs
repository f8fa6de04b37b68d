//! Parser for GGUF v2 and v3 files held in memory (a byte slice or a memory map).

use std::collections::HashMap;

use super::{GgmlType, GgufError, Value};

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: `shape[0]` is the contiguous (innermost) one.
    pub shape: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
    /// Bytes the tensor occupies.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Dimensions in row-major order (outermost first), as burn and most code expect.
    pub fn dims_row_major(&self) -> Vec<usize> {
        self.shape.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Debug)]
pub struct GgufFile<'a> {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor table in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data section alignment.
    pub alignment: u64,
    data: &'a [u8],
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(GgufError::Truncated {
            what,
            offset: self.pos,
            needed: n,
            len: self.bytes.len(),
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N, what)?.try_into().expect("length checked"))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Reads a count and checks that `count * min_item_bytes` can still fit in the file.
    fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<usize, GgufError> {
        let count = self.u64(what)?;
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|b| b <= self.remaining() as u64);
        if !fits {
            return Err(GgufError::ImplausibleCount {
                what,
                count,
                len: self.bytes.len(),
            });
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.count(what, 1)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8(at))
    }

    fn value(&mut self, ty: u32, key: &str) -> Result<Value, GgufError> {
        const W: &str = "metadata value";
        Ok(match ty {
            0 => Value::U8(self.array::<1>(W)?[0]),
            1 => Value::I8(self.array::<1>(W)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(W)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(W)?)),
            4 => Value::U32(self.u32(W)?),
            5 => Value::I32(i32::from_le_bytes(self.array(W)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(W)?)),
            7 => Value::Bool(self.array::<1>(W)?[0] != 0),
            8 => Value::String(self.string("metadata string")?),
            9 => {
                let elem_ty = self.u32("array element type")?;
                let min = min_value_bytes(elem_ty)
                    .ok_or_else(|| GgufError::UnknownValueType(elem_ty, key.to_string()))?;
                let n = self.count("array length", min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_ty, key)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(W)?),
            11 => Value::I64(i64::from_le_bytes(self.array(W)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(W)?)),
            other => return Err(GgufError::UnknownValueType(other, key.to_string())),
        })
    }
}

/// Smallest encoding of a value of type `ty`, `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

impl<'a> GgufFile<'a> {
    /// Parses the header, metadata and tensor table, and checks every tensor lies in the file.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, GgufError> {
        let mut c = Cursor { bytes, pos: 0 };
        let magic: [u8; 4] = c.array("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        // Smallest tensor info: name length, n_dims, type, offset.
        let n_tensors = c.count("tensor", 24)?;
        // Smallest metadata entry: key length, value type, one byte of value.
        let n_kv = c.count("metadata entry", 13)?;

        let mut metadata = Vec::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32("metadata value type")?;
            let value = c.value(ty, &key)?;
            metadata.push((key, value));
        }
        let meta_index: HashMap<String, usize> = metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();

        let alignment = match meta_index.get("general.alignment") {
            Some(&i) => metadata[i].1.as_u64().unwrap_or(0),
            None => DEFAULT_ALIGNMENT,
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment(alignment));
        }

        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            tensors.push(read_tensor_info(&mut c, alignment)?);
        }

        let data_start = (c.pos as u64).next_multiple_of(alignment);
        let data = bytes.get(data_start as usize..).unwrap_or(&[]);
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let end = t.offset.saturating_add(t.size);
            if end > data.len() as u64 {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start: t.offset,
                    end,
                    len: data.len() as u64,
                });
            }
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
        }

        Ok(Self {
            version,
            metadata,
            tensors,
            alignment,
            data,
            meta_index,
            tensor_index,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_name(),
        }
    }

    /// A required unsigned integer.
    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong_type(key, "unsigned integer", v))
    }

    /// A required float.
    pub fn f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| Self::wrong_type(key, "number", v))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// A required array.
    pub fn array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// A tensor's table entry by name.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The raw stored bytes of a tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &'a [u8] {
        // Bounds were checked in `parse`.
        &self.data[info.offset as usize..(info.offset + info.size) as usize]
    }

    /// Dequantizes a tensor to f32, returning the values and the row-major dimensions.
    pub fn dequantize(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), GgufError> {
        let info = self.tensor(name)?;
        let mut out = vec![0.0f32; info.elements() as usize];
        info.ggml_type.dequantize(self.tensor_bytes(info), &mut out);
        Ok((out, info.dims_row_major()))
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(c.u64("tensor dimension")?);
    }
    let ty_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let ggml_type = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        ggml_type: ty_id,
    })?;
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n > 0 && n <= usize::MAX as u64 / 4);
    let Some(elements) = elements else {
        return Err(GgufError::BadShape { name, shape });
    };
    let size = ggml_type
        .bytes_for(elements)
        .ok_or_else(|| GgufError::PartialBlock {
            name: name.clone(),
            elements,
            block: ggml_type.block_elements(),
        })?;
    if offset % alignment != 0 {
        return Err(GgufError::Misaligned {
            name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        shape,
        ggml_type,
        offset,
        size,
    })
}
