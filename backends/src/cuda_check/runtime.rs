//! A CubeCL runtime that compiles every kernel launched on it to CUDA C++ and runs
//! nothing: the engine runs on it as on `burn-cuda`, with no GPU or driver, and each
//! distinct kernel is kept for NVRTC and ptxas ([`super::toolchain`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cubecl::ir::{ContiguousElements, MatrixLayout, MmaProperties, TargetProperties};
use cubecl::prelude::KernelId;
use cubecl::server::{
    Binding, CopyDescriptor, KernelArguments, ProfileError, ProfilingToken, ServerCommunication,
    ServerError, ServerUtilities,
};
use cubecl::zspace::{striding::has_pitched_row_major_strides, Shape, Strides};
use cubecl::{ExecutionMode, Runtime};
use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::Bytes;
use cubecl_common::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl_common::future::DynFut;
use cubecl_common::profile::ProfileDuration;
use cubecl_common::stream_id::StreamId;
use cubecl_cpp::cuda::{mma::contiguous_elements_cuda, mma::CudaWmmaCompiler, CudaDialect};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler};
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::client::ComputeClient;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryAllocationMode, MemoryUsage};
use cubecl_runtime::server::ComputeServer;
use cubecl_runtime::storage::{BytesStorage, ComputeStorage, ManagedResource};

use super::target::Target;
use crate::Dtype;

/// CubeCL's CUDA compiler, as `burn-cuda` uses it.
pub type CudaCompiler = CppCompiler<CudaDialect<CudaWmmaCompiler>>;

/// One distinct kernel as CubeCL's CUDA compiler wrote it.
#[derive(Debug, Clone)]
pub struct CapturedKernel {
    /// CubeCL's identity of the kernel: its type, compile-time arguments and block size
    /// (the source text is not one: CubeCL writes a kernel's declarations in varying order).
    pub id: KernelId,
    /// The entry point, e.g. `paged_decode_f32`.
    pub name: String,
    /// CUDA C++ source, or why CubeCL could not write it.
    pub source: Result<String, String>,
    /// Threads per block (x, y, z).
    pub cube_dim: (u32, u32, u32),
    /// Dynamic shared memory the launch asks for, in bytes.
    pub dynamic_shared: usize,
}

/// The kernels captured per architecture, in launch order, each once.
static CAPTURED: Mutex<BTreeMap<u32, Vec<CapturedKernel>>> = Mutex::new(BTreeMap::new());

/// Takes the kernels captured so far for `target`, leaving none.
pub fn take_captured(target: Target) -> Vec<CapturedKernel> {
    let mut all = CAPTURED.lock().unwrap_or_else(|e| e.into_inner());
    all.remove(&target.arch).unwrap_or_default()
}

/// A device of the compile-only runtime: one per [`Target`] and activations' float type
/// (a device's float type is set once, so each has its own device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CheckDevice {
    /// Compute capability times ten.
    pub arch: u32,
    /// The activations' float type (F32, F16 or Bf16).
    pub dtype: Dtype,
}

impl CheckDevice {
    /// The FP32 device standing for `target`.
    pub fn new(target: Target) -> Self {
        Self::with_dtype(target, Dtype::F32)
    }

    /// The device standing for `target` with activations of `dtype`.
    pub fn with_dtype(target: Target, dtype: Dtype) -> Self {
        Self {
            arch: target.arch,
            dtype,
        }
    }

    fn target(&self) -> Target {
        Target::with_arch(self.arch).unwrap_or(Target::ALL[1])
    }
}

impl Default for CheckDevice {
    fn default() -> Self {
        Self::new(Target::ALL[1])
    }
}

/// Distinct from every burn device type.
const TYPE_ID: u16 = 0xC0DA;
/// A device's index: the arch in the low bits, the float type's place in
/// [`FLOATS`] above this.
const FLOAT_INDEX: u16 = 1 << 12;
const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

impl Device for CheckDevice {
    fn from_id(id: DeviceId) -> Self {
        Self {
            arch: u32::from(id.index_id % FLOAT_INDEX),
            dtype: FLOATS[usize::from(id.index_id / FLOAT_INDEX) % FLOATS.len()],
        }
    }

    fn to_id(&self) -> DeviceId {
        let float = FLOATS.iter().position(|&d| d == self.dtype).unwrap_or(0) as u16;
        DeviceId {
            type_id: TYPE_ID,
            index_id: self.arch as u16 + float * FLOAT_INDEX,
        }
    }
}

impl burn_tensor::backend::DeviceOps for CheckDevice {}

/// The compile-only server: memory is bookkeeping (reads return zeros), launches compile.
#[derive(Debug)]
pub struct CheckServer {
    arch: u32,
    options: CompilationOptions,
    utilities: Arc<ServerUtilities<Self>>,
}

impl DeviceService for CheckServer {
    fn init(id: DeviceId) -> Self {
        let device = CheckDevice::from_id(id);
        let (props, options) = device.target().properties();
        let policy = PitchedMemoryLayoutPolicy::new(props.memory.alignment as usize);
        let utilities = ServerUtilities::new(props, Arc::new(ServerLogger::default()), (), policy);
        Self {
            arch: device.arch,
            options,
            utilities: Arc::new(utilities),
        }
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        self.utilities.clone() as ServerUtilitiesHandle
    }
}

impl ServerCommunication for CheckServer {
    const SERVER_COMM_ENABLED: bool = false;
}

fn unsupported(what: &str) -> ServerError {
    ServerError::Generic {
        reason: format!("the compile-only CUDA runtime cannot {what}"),
        backtrace: BackTrace::capture(),
    }
}

impl ComputeServer for CheckServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = ();
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    type Storage = BytesStorage;

    fn initialize_memory(&mut self, _: ManagedMemoryHandle, _: u64, _: StreamId) {}

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        _: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let zeros = descriptors
            .iter()
            .map(|d| {
                Bytes::from_bytes_vec(vec![0; d.shape.iter().product::<usize>() * d.elem_size])
            })
            .collect();
        Box::pin(async move { Ok(zeros) })
    }

    fn write(&mut self, _: Vec<(CopyDescriptor, Bytes)>, _: StreamId) {}

    fn sync(&mut self, _: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(
        &mut self,
        _: Binding,
        _: StreamId,
    ) -> Result<ManagedResource<<Self::Storage as ComputeStorage>::Resource>, ServerError> {
        Err(unsupported("hand out device memory"))
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        _: cubecl::CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
        _: StreamId,
    ) {
        drop(bindings);
        let id = kernel.id();
        let mut all = CAPTURED.lock().unwrap_or_else(|e| e.into_inner());
        let list = all.entry(self.arch).or_default();
        if list.iter().any(|k| k.id == id) {
            return;
        }
        let compiled = kernel.compile(
            &mut CudaCompiler::default(),
            &self.options,
            mode,
            kernel.address_type(),
        );
        let captured = match compiled {
            Ok(c) => CapturedKernel {
                id,
                name: c.entrypoint_name,
                dynamic_shared: c.repr.map_or(0, |r| r.shared_memory_size()),
                cube_dim: (c.cube_dim.x, c.cube_dim.y, c.cube_dim.z),
                source: Ok(c.source),
            },
            Err(e) => CapturedKernel {
                name: format!("{id:?}"),
                id,
                source: Err(e.to_string()),
                cube_dim: (0, 0, 0),
                dynamic_shared: 0,
            },
        };
        list.push(captured);
    }

    fn flush(&mut self, _: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(MemoryUsage {
            number_allocs: 0,
            bytes_in_use: 0,
            bytes_padding: 0,
            bytes_reserved: 0,
        })
    }

    fn memory_cleanup(&mut self, _: StreamId) {}

    fn start_profile(&mut self, _: StreamId) -> Result<ProfilingToken, ServerError> {
        Err(unsupported("time kernels"))
    }

    fn end_profile(
        &mut self,
        _: StreamId,
        _: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        Err(ProfileError::NotRegistered {
            backtrace: BackTrace::capture(),
        })
    }

    fn allocation_mode(&mut self, _: MemoryAllocationMode, _: StreamId) {}
}

/// The runtime whose kernels are compiled for a [`Target`] and never run.
#[derive(Debug, Clone)]
pub struct CheckRuntime;

impl Runtime for CheckRuntime {
    type Compiler = CudaCompiler;
    type Server = CheckServer;
    type Device = CheckDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_: &ComputeClient<Self>) -> &'static str {
        "cuda (compile only)"
    }

    fn require_array_lengths() -> bool {
        true
    }

    fn max_cube_count() -> (u32, u32, u32) {
        (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32)
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        has_pitched_row_major_strides(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        // As cubecl-cuda's runtime: the kernels' matrix fragments are laid out alike.
        TargetProperties {
            mma: MmaProperties {
                register_size_bits: 32,
                const_plane_size: 32,
                register_layout_a: MatrixLayout::RowMajor,
                register_layout_b: MatrixLayout::ColMajor,
                register_layout_acc: MatrixLayout::RowMajor,
                register_duplication_a: 1,
                register_duplication_b: 1,
                register_duplication_acc: 1,
                contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
            },
        }
    }

    fn enumerate_devices(_: u16, _: &()) -> Vec<DeviceId> {
        Vec::new()
    }
}
