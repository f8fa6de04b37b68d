//! Tokens chosen where the logits are: greedy decoding takes each row's argmax on the
//! device, so a step reads back one token id per sequence instead of its whole row of
//! logits (49,152 floats for the default model).

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::device_counts::{read_back, read_back_async};

fn ids(data: TensorData) -> Vec<u32> {
    data.convert::<i64>()
        .iter::<i64>()
        .map(|i| i as u32)
        .collect()
}

fn argmax<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    // burn's argmax (cubek's reduction on CubeCL devices) keeps the lowest index on
    // ties, as `super::argmax` does.
    logits.argmax(1)
}

/// The greedy token of each row of `logits` `[rows, vocab]`, chosen on the device: one
/// read-back of `rows` ids.
pub fn argmax_rows<B: Backend>(logits: Tensor<B, 2>) -> Vec<u32> {
    ids(read_back(argmax(logits)))
}

/// [`argmax_rows`] without blocking the thread (in a browser).
pub async fn argmax_rows_async<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<u32>, String> {
    Ok(ids(read_back_async(argmax(logits)).await?))
}
