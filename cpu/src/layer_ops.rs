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

/// GeGLU's gate, in place: `gate = gelu(gate) * up`, GELU in its tanh approximation
/// (`0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`) as llama.cpp's CPU backend takes
/// it: looked up for the gate rounded to FP16 in a table of every FP16 input, the result
/// rounded to FP16; 0 below -10 and `x` above 10. Eight at a time with AVX2 and F16C.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C.
        unsafe { geglu_avx2(gate, up, gelu_table()) };
        return;
    }
    geglu_portable(gate, up);
}

/// [`geglu`] in plain Rust on any CPU: the results the SIMD path must match.
pub fn geglu_portable(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up");
    let table = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu_looked_up(*g, table) * u;
    }
}

/// GELU of every FP16 value (by its bits), rounded to FP16.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| half::f16::from_f32(gelu(half::f16::from_bits(bits).to_f32())).to_f32())
            .collect()
    })
}

/// GELU of `x` through the table (see [`geglu`]).
fn gelu_looked_up(x: f32, table: &[f32]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        table[usize::from(half::f16::from_f32(x).to_bits())]
    }
}

/// [`geglu`] eight at a time: F16C rounds to FP16 as `half` does (to nearest, ties to
/// even) and the table is gathered; the last values padded to eight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn geglu_avx2(gate: &mut [f32], up: &[f32], table: &[f32]) {
    use std::arch::x86_64::*;
    by_eights(gate, up, |g, u| {
        // SAFETY: eight values in each array; the gathered indices are FP16 bit patterns,
        // inside the table of 65,536.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr());
            let bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
            let looked_up = _mm256_i32gather_ps(table.as_ptr(), bits, 4);
            let low = _mm256_cmp_ps(x, _mm256_set1_ps(-10.0), _CMP_LE_OQ);
            let high = _mm256_cmp_ps(x, _mm256_set1_ps(10.0), _CMP_GE_OQ);
            let y = _mm256_blendv_ps(looked_up, x, high);
            let y = _mm256_andnot_ps(low, y);
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    });
}

/// `f` over `gate` and `up` eight values at a time, the last ones padded to eight.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn by_eights(gate: &mut [f32], up: &[f32], mut f: impl FnMut(&mut [f32; 8], &[f32; 8])) {
    for (g, u) in gate.chunks_mut(8).zip(up.chunks(8)) {
        let (mut gl, mut ul) = ([0.0f32; 8], [0.0f32; 8]);
        gl[..g.len()].copy_from_slice(g);
        ul[..u.len()].copy_from_slice(u);
        f(&mut gl, &ul);
        g.copy_from_slice(&gl[..g.len()]);
    }
}

/// GELU in its tanh approximation, in FP32.
fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// SwiGLU's gate, in place: `gate = silu(gate) * up` (eight at a time with AVX2).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { swiglu_avx2(gate, up) };
        return;
    }
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// [`swiglu`] with [`crate::exp::avx2::exp8`]; the last values padded to eight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    by_eights(gate, up, |g, u| {
        // SAFETY: eight values in each array.
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr());
            let e = crate::exp::avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    });
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
