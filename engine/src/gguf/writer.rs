//! A small GGUF writer, used to build test files and fixtures.

use super::{GgmlType, Value};

/// Builds a GGUF file in memory.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl GgufWriter {
    /// A writer for the given version (2 or 3), 32-byte alignment.
    pub fn new(version: u32) -> Self {
        Self {
            version,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a metadata entry.
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds an f32 tensor; `shape` is in GGUF order (innermost first).
    pub fn tensor_f32(self, name: &str, shape: &[u64], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, shape, 0, bytes)
    }

    /// Adds a tensor of any type id with its raw bytes.
    pub fn tensor_raw(mut self, name: &str, shape: &[u64], ty: u32, bytes: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), shape.to_vec(), ty, bytes));
        self
    }

    /// Adds a tensor stored as `ty`.
    pub fn tensor(self, name: &str, shape: &[u64], ty: GgmlType, bytes: Vec<u8>) -> Self {
        self.tensor_raw(name, shape, ty.id(), bytes)
    }

    /// Serialises the file.
    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, shape, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            shape.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len() as u64).next_multiple_of(self.alignment);
        }
        let start = (out.len() as u64).next_multiple_of(self.alignment);
        out.resize(start as usize, 0);
        for ((_, _, _, bytes), off) in self.tensors.iter().zip(offsets) {
            out.resize((start + off) as usize, 0);
            out.extend(bytes);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let elem = items.first().map_or(4, type_id);
            out.extend(elem.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}
