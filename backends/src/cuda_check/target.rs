//! The GPUs the CUDA kernel check compiles for, and the properties CubeCL's CUDA runtime
//! would read from their driver.

use cubecl::ir::{
    features::{AtomicUsage, Plane, Tma, TypeUsage},
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, OpaqueType, SemanticType, StorageType, Type, VectorSize,
};
use cubecl_common::profile::TimingMethod;
use cubecl_cpp::{
    cuda::{arch::CudaArchitecture, mma::CudaWmmaCompiler},
    register_supported_types,
    shared::{
        register_mma_features, register_scaled_mma_features, register_wmma_features,
        CompilationOptions, CppSupportedFeatures, DialectWmmaCompiler,
    },
};

/// A GPU architecture the kernels are compiled for, with the limits of its data-centre part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Compute capability times ten: 80 (A100), 90 (H100).
    pub arch: u32,
    /// The part whose limits are used.
    pub part: &'static str,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Shared memory one block may opt in to, in bytes.
    pub shared_per_block: usize,
    /// Shared memory of one multiprocessor, in bytes.
    pub shared_per_sm: usize,
}

impl Target {
    /// A100 (sm_80) and H100 SXM (sm_90), the production targets.
    pub const ALL: [Target; 2] = [
        Target {
            arch: 80,
            part: "A100",
            sms: 108,
            shared_per_block: 166_912,
            shared_per_sm: 167_936,
        },
        Target {
            arch: 90,
            part: "H100 SXM",
            sms: 132,
            shared_per_block: 232_448,
            shared_per_sm: 233_472,
        },
    ];

    /// Registers of one multiprocessor.
    pub const REGISTERS_PER_SM: u32 = 65_536;
    /// Resident warps of one multiprocessor.
    pub const WARPS_PER_SM: u32 = 64;
    /// Resident blocks of one multiprocessor.
    pub const BLOCKS_PER_SM: u32 = 32;
    /// Shared memory the hardware reserves per block, in bytes.
    pub const RESERVED_SHARED_PER_BLOCK: usize = 1024;

    /// The target named `sm_80` or `sm_90` (or `80`, `90`).
    pub fn named(name: &str) -> Option<Target> {
        Self::with_arch(name.trim_start_matches("sm_").parse().ok()?)
    }

    /// The target of compute capability `arch` (times ten).
    pub fn with_arch(arch: u32) -> Option<Target> {
        Self::ALL.into_iter().find(|t| t.arch == arch)
    }

    /// The architecture flag NVRTC and ptxas take: `sm_90a` on Hopper (its TMA and
    /// cluster instructions), as CubeCL's CUDA runtime asks for.
    pub fn gpu_architecture(&self) -> String {
        if self.arch >= 90 {
            format!("sm_{}a", self.arch)
        } else {
            format!("sm_{}", self.arch)
        }
    }

    /// The device properties and compilation options CubeCL's CUDA runtime derives from a
    /// device of this architecture (cubecl-cuda's `DeviceService::init`, for the
    /// architectures listed here).
    pub(super) fn properties(&self) -> (DeviceProperties, CompilationOptions) {
        let arch = CudaArchitecture { version: self.arch };
        let wmma = CudaWmmaCompiler::supported_wmma_combinations(&arch);
        let mma = CudaWmmaCompiler::supported_mma_combinations(&arch);
        let scaled_mma = CudaWmmaCompiler::supported_scaled_mma_combinations(&arch);
        let memory = MemoryDeviceProperties {
            max_page_size: 80 << 30 >> 2,
            alignment: 512,
        };
        let hardware = HardwareProperties {
            load_width: 128,
            plane_size_min: 32,
            plane_size_max: 32,
            max_bindings: 1024,
            max_shared_memory_size: self.shared_per_block,
            max_cube_count: (i32::MAX as u32, 65_535, 65_535),
            max_units_per_cube: 1024,
            max_cube_dim: (1024, 1024, 64),
            num_streaming_multiprocessors: Some(self.sms),
            num_tensor_cores: Some(4),
            min_tensor_cores_dim: if wmma.is_empty() { None } else { Some(8) },
            num_cpu_cores: None,
            max_vector_size: VectorSize::MAX,
        };
        let mut options = CompilationOptions {
            supports_features: CppSupportedFeatures {
                fast_math: true,
                grid_constants: true,
                fast_tanh: true,
                clusters: self.arch >= 90,
                elect_sync: self.arch >= 90,
            },
            ..Default::default()
        };
        options.warp_size = 32;

        let mut props =
            DeviceProperties::new(Default::default(), memory, hardware, TimingMethod::System);
        register_supported_types(&mut props);
        props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
        let atomic = |kind| Type::new(StorageType::Atomic(ElemType::Float(kind)));
        let add_store = AtomicUsage::Add | AtomicUsage::LoadStore;
        props.register_atomic_type_usage(atomic(FloatKind::F64), add_store);
        props.register_atomic_type_usage(atomic(FloatKind::F16), add_store);
        props.register_atomic_type_usage(atomic(FloatKind::F16).with_vector_size(2), add_store);
        props.register_semantic_type(SemanticType::Pipeline);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
        props.features.plane.insert(Plane::Sync);
        for kind in [FloatKind::F16, FloatKind::BF16] {
            props
                .features
                .matmul
                .ldmatrix
                .insert(ElemType::Float(kind).into());
        }
        props.features.copy_async = true;
        if self.arch >= 89 {
            for kind in [FloatKind::E4M3, FloatKind::E5M2] {
                props.register_type_usage(
                    ElemType::Float(kind),
                    TypeUsage::Conversion | TypeUsage::Buffer,
                );
            }
        }
        if self.arch >= 90 {
            props.features.tma.insert(Tma::Base);
            props.register_semantic_type(SemanticType::TensorMap);
            props.features.cube_cluster = true;
            for kind in [FloatKind::F16, FloatKind::BF16] {
                props
                    .features
                    .matmul
                    .stmatrix
                    .insert(ElemType::Float(kind).into());
            }
            for width in [2, 4] {
                props.register_atomic_type_usage(
                    atomic(FloatKind::F32).with_vector_size(width),
                    add_store,
                );
            }
        }
        props.features.memory_reinterpret = true;
        props.features.alignment = true;
        props.features.plane.insert(Plane::Ops);
        props.features.plane.insert(Plane::NonUniformControlFlow);
        register_wmma_features(wmma, &mut props);
        register_mma_features(mma, &mut props);
        register_scaled_mma_features(scaled_mma, &mut props);
        (props, options)
    }
}
