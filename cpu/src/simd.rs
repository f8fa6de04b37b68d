//! The SIMD level of the integer dot products, detected at run time.

/// Instruction sets the kernels are written for, slowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 with FMA and F16C (`vpmaddubsw`).
    Avx2,
    /// x86-64 AVX-512 VNNI on 256-bit vectors (`vpdpbusd`).
    Avx512Vnni,
    /// arm64 NEON (`smull` and pairwise adds).
    Neon,
    /// arm64 NEON with the dot-product extension (`sdot`).
    NeonDotprod,
    /// WebAssembly 128-bit SIMD, where the module is built with it (chosen at build time:
    /// a module with SIMD instructions does not load where they are missing).
    Simd128,
}

impl SimdLevel {
    /// Every level this CPU can run, slowest first.
    pub fn available() -> Vec<Self> {
        #[cfg_attr(
            not(any(
                target_arch = "x86_64",
                target_arch = "aarch64",
                all(target_arch = "wasm32", target_feature = "simd128")
            )),
            allow(unused_mut)
        )]
        let mut levels = vec![Self::Portable];
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            levels.push(Self::Neon);
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                levels.push(Self::NeonDotprod);
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        levels.push(Self::Simd128);
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                levels.push(Self::Avx2);
                if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                    levels.push(Self::Avx512Vnni);
                }
            }
        }
        levels
    }

    /// Whether this CPU can run the level (detected once; cheap enough for every call).
    pub fn is_available(self) -> bool {
        static LEVELS: std::sync::OnceLock<Vec<SimdLevel>> = std::sync::OnceLock::new();
        LEVELS.get_or_init(Self::available).contains(&self)
    }

    /// Its name as users see it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
            Self::Neon => "neon",
            Self::NeonDotprod => "neon-dotprod",
            Self::Simd128 => "simd128",
        }
    }
}
