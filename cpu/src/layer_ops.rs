//! The element-wise parts of a layer, in place over FP32 rows: what burn would run
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

/// SwiGLU's gate, in place: `gate = silu(gate) * up` (eight at a time with AVX2).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    gated::<false>(gate, up);
}

/// GeGLU's gate, in place: `gate = gelu(gate) * up`, GELU in its tanh approximation
/// (`0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, taken as `x / (1 + e^(-2z))`),
/// eight at a time with AVX2.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    gated::<true>(gate, up);
}

/// `2 sqrt(2 / pi)`.
const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
/// GELU's cubic coefficient.
const GELU_CUBIC: f32 = 0.044_715;

/// `gate = gate / (1 + e^(-a)) * up` with `a = gate` (SiLU) or, with `GELU`,
/// `a = 2 sqrt(2 / pi) (gate + 0.044715 gate^3)` (`0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z))`).
fn gated<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { gated_avx2::<GELU>(gate, up) };
        return;
    }
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let a = match GELU {
            true => TWO_SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x * x),
            false => x,
        };
        *g = x / (1.0 + (-a).exp()) * u;
    }
}

/// [`gated`] with [`crate::exp::avx2::exp8`]; the last values padded to eight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gated_avx2<const GELU: bool>(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    for (g, u) in gate.chunks_mut(8).zip(up.chunks(8)) {
        let (mut gl, mut ul) = ([0.0f32; 8], [0.0f32; 8]);
        gl[..g.len()].copy_from_slice(g);
        ul[..u.len()].copy_from_slice(u);
        // SAFETY: eight values in each array.
        unsafe {
            let x = _mm256_loadu_ps(gl.as_ptr());
            let a = match GELU {
                true => {
                    let x2 = _mm256_mul_ps(x, x);
                    let cubic =
                        _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), x2, _mm256_set1_ps(1.0));
                    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(TWO_SQRT_2_OVER_PI), x), cubic)
                }
                false => x,
            };
            let e = crate::exp::avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
            let act = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                gl.as_mut_ptr(),
                _mm256_mul_ps(act, _mm256_loadu_ps(ul.as_ptr())),
            );
        }
        g.copy_from_slice(&gl[..g.len()]);
    }
}

/// Rotary position embedding, in place over rows of `heads * head_dim` values; row `r`
/// is at position `positions[r]`, and `cos`/`sin` hold `head_dim / 2` angles per position.
/// Angle `i` rotates dimensions `(2i, 2i + 1)` (GGUF's Llama layout), or with `neox`
/// dimensions `(i, i + head_dim / 2)`.
pub fn rope(
    x: &mut [f32],
    heads: usize,
    positions: &[usize],
    cos: &[f32],
    sin: &[f32],
    neox: bool,
) {
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
            if neox {
                let (lo, hi) = head.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (lo[i], hi[i]);
                    lo[i] = a * c[i] - b * s[i];
                    hi[i] = a * s[i] + b * c[i];
                }
            } else {
                for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * c[i] - b * s[i];
                    pair[1] = a * s[i] + b * c[i];
                }
            }
        }
    }
}
