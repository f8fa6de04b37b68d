//! The element-wise parts of a Llama layer, in place over FP32 rows: what burn would run
//! as several separate operations each (RMSNorm alone is six).

/// RMSNorm of each row of `x` (rows of `weight.len()` values), in place:
/// `x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
}

/// SwiGLU's gate, in place: `gate = silu(gate) * up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Rotary position embedding in GGUF's layout (pairs of adjacent dimensions), in place
/// over rows of `heads * head_dim` values; row `r` is at position `positions[r]`, and
/// `cos`/`sin` hold `head_dim / 2` angles per position.
pub fn rope(x: &mut [f32], heads: usize, positions: &[usize], cos: &[f32], sin: &[f32]) {
    let rows = positions.len();
    if rows == 0 {
        return;
    }
    let width = x.len() / rows;
    let half = width / heads / 2;
    for (row, &pos) in x.chunks_exact_mut(width).zip(positions) {
        let (c, s) = (
            &cos[pos * half..(pos + 1) * half],
            &sin[pos * half..(pos + 1) * half],
        );
        for head in row.chunks_exact_mut(2 * half) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c[i] - b * s[i];
                pair[1] = a * s[i] + b * c[i];
            }
        }
    }
}
