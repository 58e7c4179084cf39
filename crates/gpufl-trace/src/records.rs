//! Record types of trace format v1. See `docs/trace-format.md` for the field-by-field schema.
//!
//! Every record is one JSON object on one line whose first key is `"t"`, the record type. Times are
//! nanoseconds in the CUPTI clock domain (see [`ClockSync`]); durations are `end - start`.

use crate::function::Function;
use crate::ids::{FrameId, StackId, StrId};
use crate::kdetail::{Kdetail, Kstall};
use crate::telemetry::Telemetry;
use serde::{Deserialize, Serialize};

/// Name of the format, written in every header.
pub const FORMAT_NAME: &str = "gpufl-trace";
/// Major version of the format written by this crate. Readers accept any version up to this one and
/// read newer ones on a best-effort basis (unknown record types and fields are skipped).
pub const FORMAT_VERSION: u32 = 1;

/// One record of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    Str(StrRecord),
    Frame(Frame),
    Stack(Stack),
    Kernel(Kernel),
    Function(Function),
    Memcpy(Memcpy),
    Memset(Memset),
    Sync(Sync),
    Api(Api),
    Callsite(Callsite),
    Hostcall(Hostcall),
    Hsample(Hsample),
    Mem(Mem),
    Gnode(Gnode),
    Stream(StreamInfo),
    Capture(CaptureState),
    Scope(Scope),
    Range(Range),
    Window(Window),
    Kdetail(Box<Kdetail>),
    Kstall(Box<Kstall>),
    Telemetry(Box<Telemetry>),
    Overhead(Overhead),
    Dropped(Dropped),
    Notice(Notice),
    End(End),
}

/// Every record type, as [`Record::type_name`] spells it (the value of the `"t"` key), in the
/// order of [`Record`]'s variants: the types `gpufl dump --type` accepts.
pub const RECORD_TYPES: &[&str] = &[
    "header",
    "str",
    "frame",
    "stack",
    "kernel",
    "function",
    "memcpy",
    "memset",
    "sync",
    "api",
    "callsite",
    "hostcall",
    "hsample",
    "mem",
    "gnode",
    "stream",
    "capture",
    "scope",
    "range",
    "window",
    "kdetail",
    "kstall",
    "telemetry",
    "overhead",
    "dropped",
    "notice",
    "end",
];

impl Record {
    /// The value of the `"t"` key for this record (one of [`RECORD_TYPES`]).
    pub fn type_name(&self) -> &'static str {
        match self {
            Record::Header(_) => "header",
            Record::Str(_) => "str",
            Record::Frame(_) => "frame",
            Record::Stack(_) => "stack",
            Record::Kernel(_) => "kernel",
            Record::Function(_) => "function",
            Record::Memcpy(_) => "memcpy",
            Record::Memset(_) => "memset",
            Record::Sync(_) => "sync",
            Record::Api(_) => "api",
            Record::Callsite(_) => "callsite",
            Record::Hostcall(_) => "hostcall",
            Record::Hsample(_) => "hsample",
            Record::Mem(_) => "mem",
            Record::Gnode(_) => "gnode",
            Record::Stream(_) => "stream",
            Record::Capture(_) => "capture",
            Record::Scope(_) => "scope",
            Record::Range(_) => "range",
            Record::Window(_) => "window",
            Record::Kdetail(_) => "kdetail",
            Record::Kstall(_) => "kstall",
            Record::Telemetry(_) => "telemetry",
            Record::Overhead(_) => "overhead",
            Record::Dropped(_) => "dropped",
            Record::Notice(_) => "notice",
            Record::End(_) => "end",
        }
    }
}

/// First record of every trace file: who was recorded, on what, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Header {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// Format major version ([`FORMAT_VERSION`] when written by this crate).
    pub version: u32,
    /// Version of the gpufl that wrote the trace.
    pub gpufl_version: String,
    /// Unique id of the session (also the session directory's name).
    pub session_id: String,
    pub app_name: String,
    pub host: String,
    pub pid: u32,
    pub ppid: u32,
    /// argv of the recorded process.
    pub command_line: Vec<String>,
    /// Wall-clock start of the session, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// One instant read on both clocks, to convert record times to wall time.
    pub clock: ClockSync,
    pub gpus: Vec<Gpu>,
    /// CUDA driver version as `cuDriverGetVersion` reports it (e.g. 13000 for 13.0), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<u32>,
    /// CUPTI API version (`cuptiGetVersion`), if CUPTI was loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_version: Option<u32>,
    /// Python interpreter version ("3.12") when Python frames can be captured in this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_version: Option<String>,
    /// Rank of the process in a distributed job, when its launcher set one (`RANK`,
    /// `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`; docs/trace-format.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Rank among the job's processes on this host (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
    /// `SLURM_LOCALID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// Processes in the job (`WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// Id of the `gpufl record` run the process belongs to (`GPUFL_RUN_ID`, set by `gpufl record`
    /// for the command and every process it starts; the run directory's `run.json` has it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub options: CaptureOptions,
    pub capture: CaptureStatus,
}

/// A pair of readings of the trace clock and the wall clock taken at the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClockSync {
    /// CUPTI timestamp (ns), the clock of every `start`/`end` field.
    pub trace_ns: u64,
    /// Wall clock (ns since the Unix epoch).
    pub unix_ns: u64,
}

impl ClockSync {
    /// Convert a trace timestamp to ns since the Unix epoch.
    pub fn to_unix_ns(&self, trace_ns: u64) -> i128 {
        self.unix_ns as i128 + (trace_ns as i128 - self.trace_ns as i128)
    }
}

/// One visible GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Gpu {
    /// CUDA device ordinal (as in `dev` fields of records).
    pub index: u32,
    pub name: String,
    /// "GPU-xxxxxxxx-…" as nvidia-smi prints it.
    pub uuid: String,
    pub sm_count: u32,
    pub cc_major: u32,
    pub cc_minor: u32,
    pub total_mem_bytes: u64,
    /// The device's limits (what occupancy is computed from); absent in traces written before
    /// gpufl recorded them, or when the driver did not report them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<GpuLimits>,
}

/// Per-device limits, read with `cuDeviceGetAttribute` (attribute names in parentheses, without
/// their `CU_DEVICE_ATTRIBUTE_` prefix). Sizes in bytes, clocks in kHz.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuLimits {
    /// Threads per block (`MAX_THREADS_PER_BLOCK`).
    pub max_threads_per_block: u32,
    /// Resident threads per SM (`MAX_THREADS_PER_MULTIPROCESSOR`); resident warps per SM are this
    /// over `warp_size`.
    pub max_threads_per_sm: u32,
    /// Resident blocks per SM (`MAX_BLOCKS_PER_MULTIPROCESSOR`).
    pub max_blocks_per_sm: u32,
    /// 32-bit registers per SM (`MAX_REGISTERS_PER_MULTIPROCESSOR`).
    pub regs_per_sm: u32,
    /// 32-bit registers one block may use (`MAX_REGISTERS_PER_BLOCK`).
    pub regs_per_block: u32,
    /// Shared memory per SM, bytes: the largest carveout (`MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`).
    pub smem_per_sm: u32,
    /// Shared memory one block may use without opting in, bytes (`MAX_SHARED_MEMORY_PER_BLOCK`).
    pub smem_per_block: u32,
    /// Shared memory one block may use after opting in with
    /// `cudaFuncSetAttribute(…MaxDynamicSharedMemorySize…)`, bytes
    /// (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
    pub smem_per_block_optin: u32,
    /// Shared memory the driver reserves for each resident block, bytes
    /// (`RESERVED_SHARED_MEMORY_PER_BLOCK`).
    pub smem_reserved_per_block: u32,
    /// Threads per warp (`WARP_SIZE`).
    pub warp_size: u32,
    /// L2 cache, bytes (`L2_CACHE_SIZE`).
    pub l2_bytes: u32,
    /// Peak SM clock, kHz (`CLOCK_RATE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_khz: Option<u32>,
    /// Peak memory clock, kHz (`MEMORY_CLOCK_RATE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_clock_khz: Option<u32>,
    /// Memory bus width, bits (`GLOBAL_MEMORY_BUS_WIDTH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bus_bits: Option<u32>,
    /// Peak memory bandwidth, bytes/s, derived: 2 (double data rate) × `mem_clock_khz` × 1000 ×
    /// `mem_bus_bits` / 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bandwidth: Option<u64>,
}

impl GpuLimits {
    /// Peak memory bandwidth in bytes/s from a memory clock in kHz and a bus width in bits, as
    /// `mem_bandwidth` is derived (double data rate: two transfers per clock).
    pub fn peak_bandwidth(mem_clock_khz: u32, mem_bus_bits: u32) -> u64 {
        2 * mem_clock_khz as u64 * 1000 * mem_bus_bits as u64 / 8
    }
}

/// Options the session was recorded with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CaptureOptions {
    pub enable_synchronization: bool,
    pub enable_stack_trace: bool,
    /// Which API calls get `api` records: "none", "sync", "default" or "all".
    pub api_records: String,
    /// Where the session directory was created.
    pub log_path: String,
    /// How the recorder was started: "injection" (CUDA_INJECTION64_PATH), "api" (gpufl::init) or "test".
    pub started_by: String,
    /// Period of the NVML telemetry samples, ms (0: telemetry off); absent in sessions recorded
    /// before telemetry existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry_ms: Option<u32>,
    /// Recording mode: "default" (every kernel, copy and memset) or "always-on" (syncs with their
    /// stacks and call-site counts all the time; GPU activity only inside `window` records).
    /// Absent in sessions recorded before modes existed: "default".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// When call-site callbacks ran: "always", or "windows" (always-on recorders from 2026-11-25:
    /// launch and copy call sites inside `window` records only). Absent: "always".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_sites: Option<String>,
    /// The host sampler's rate, samples per second per thread (0: off); absent in sessions
    /// recorded before host samples existed (`hsample` records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_samples_hz: Option<u32>,
    /// A CUDA call other than a launch, copy, memset or synchronization gets a `hostcall` record
    /// when it held its thread at least this long, µs; absent in sessions recorded before
    /// `hostcall` records existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostcall_us: Option<u32>,
    /// Whether `mem` records (allocations and frees) were recorded; absent in sessions recorded
    /// before `mem` records existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_records: Option<bool>,
    /// Allocations of at least this many bytes get their call-site stack (`mem.stack`); absent
    /// in sessions recorded before `mem` records existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_stack_bytes: Option<u64>,
}

/// Whether capture is running; when it is not, `reason` says why (once, clearly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CaptureStatus {
    /// "ok", "partial" (running with something missing, see reason) or "disabled".
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An interned string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrRecord {
    pub id: StrId,
    pub s: String,
}

/// Where a frame comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    /// A machine-code frame (C, C++, Rust, CUDA host code, the driver, the interpreter…).
    Native,
    /// A Python frame read from the interpreter.
    Python,
    #[serde(other)]
    Unknown,
}

/// An interned, symbolized frame. Native frames with inlined calls become several frames, the inlined
/// ones first (`inlined: true`), all sharing `module` and `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub id: FrameId,
    pub kind: FrameKind,
    /// Shared object or executable path (native frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<StrId>,
    /// Address relative to the module's load base (native frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Function (demangled) or Python qualified name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub func: Option<StrId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<StrId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub inlined: bool,
    /// The text of the source line (`file:line`), trimmed and at most 240 bytes, when the recorder
    /// could read the file (Python frames; `GPUFL_SOURCE_TEXT=0` leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<StrId>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An interned stack: frame ids, innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stack {
    pub id: StackId,
    pub frames: Vec<FrameId>,
    /// Set when the calling thread ran no Python and the stack's Python frames were read from
    /// another thread, this one (its OS thread id): the thread inferred to drive the call (e.g. the
    /// thread blocked in `loss.backward()` while PyTorch's autograd thread launches, or the thread
    /// blocked in a JAX host read while an XLA worker copies). The native frames are the calling
    /// thread's own. See docs/insights.md, "Cross-thread Python attribution".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_tid: Option<u64>,
}

/// A kernel execution (CUPTI concurrent-kernel activity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Kernel {
    /// Demangled kernel name.
    pub name: StrId,
    pub start: u64,
    pub end: u64,
    pub dev: u32,
    pub ctx: u32,
    pub stream: u32,
    /// Correlation id of the launching API call.
    pub corr: u32,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    /// Registers per thread.
    pub regs: u16,
    /// Static shared memory per block, bytes.
    pub smem_static: i32,
    /// Dynamic shared memory per block, bytes.
    pub smem_dynamic: i32,
    /// Local memory per thread, bytes (non-zero usually means register spills).
    pub local_mem: u32,
    /// Shared memory per SM the driver configured for the launch (CUPTI's
    /// `sharedMemoryExecuted`: the L1/shared carveout), bytes; absent in traces written before
    /// gpufl recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smem_executed: Option<u32>,
    /// The CUDA graph node this kernel ran as, when a graph launch ran it (then `corr` is the
    /// graph launch's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphNode>,
}

/// The CUDA graph node a kernel, copy or memset ran as: CUPTI's `graphId` (the graph's unique id)
/// and `graphNodeId` (the node's), written as `[graph, node]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct GraphNode(pub u32, pub u64);

/// Direction of a copy, as CUPTI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum CopyKind {
    HtoD,
    DtoH,
    HtoA,
    AtoH,
    AtoA,
    AtoD,
    DtoA,
    DtoD,
    HtoH,
    PtoP,
    #[default]
    #[serde(other)]
    Unknown,
}

/// Kind of memory on either side of a copy or under a memset. `Pageable` host memory makes
/// `cudaMemcpyAsync` synchronous; `Pinned` does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    Pageable,
    Pinned,
    Device,
    Array,
    Managed,
    DeviceStatic,
    ManagedStatic,
    #[default]
    #[serde(other)]
    Unknown,
}

/// A memory copy executed by the GPU (CUPTI memcpy activity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Memcpy {
    pub kind: CopyKind,
    pub src_kind: MemoryKind,
    pub dst_kind: MemoryKind,
    pub bytes: u64,
    pub start: u64,
    pub end: u64,
    pub dev: u32,
    pub ctx: u32,
    pub stream: u32,
    pub corr: u32,
    /// The CUDA graph node this operation ran as, when a graph launch ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphNode>,
}

/// A memset executed by the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Memset {
    pub bytes: u64,
    pub value: u32,
    pub mem_kind: MemoryKind,
    pub start: u64,
    pub end: u64,
    pub dev: u32,
    pub ctx: u32,
    pub stream: u32,
    pub corr: u32,
    /// The CUDA graph node this operation ran as, when a graph launch ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphNode>,
}

/// Kind of host–device synchronization (CUPTI's synchronization types 1–4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncKind {
    /// cudaEventSynchronize / cuEventSynchronize.
    EventSynchronize,
    /// cudaStreamWaitEvent / cuStreamWaitEvent (a device-side wait; the host is not blocked).
    StreamWaitEvent,
    /// cudaStreamSynchronize / cuStreamSynchronize.
    StreamSynchronize,
    /// cudaDeviceSynchronize / cuCtxSynchronize.
    ContextSynchronize,
    #[default]
    #[serde(other)]
    Unknown,
}

impl SyncKind {
    /// Whether the call's duration is time the host was blocked: every kind but StreamWaitEvent,
    /// a device-side wait whose call only enqueues it.
    pub fn blocks_host(self) -> bool {
        self != SyncKind::StreamWaitEvent
    }

    /// The name used in reports ("StreamSynchronize", …), as the seed names them.
    pub fn display_name(self) -> &'static str {
        match self {
            SyncKind::EventSynchronize => "EventSynchronize",
            SyncKind::StreamWaitEvent => "StreamWaitEvent",
            SyncKind::StreamSynchronize => "StreamSynchronize",
            SyncKind::ContextSynchronize => "ContextSynchronize",
            SyncKind::Unknown => "Synchronize",
        }
    }
}

/// A synchronization: the host (or, for StreamWaitEvent, a stream) waited from `start` to `end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Sync {
    pub kind: SyncKind,
    pub start: u64,
    pub end: u64,
    pub ctx: u32,
    /// Stream waited on (absent for context synchronization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<u32>,
    /// CUDA event id (event synchronize / stream wait event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<u32>,
    /// Correlation id of the API call that synchronized.
    pub corr: u32,
    /// Thread that called the API (present when a stack was captured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u64>,
    /// CPU stack at the call (present when stack capture is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
}

/// Which API a call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApiDomain {
    Runtime,
    Driver,
    #[default]
    #[serde(other)]
    Unknown,
}

/// A CUDA runtime or driver API call made by the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Api {
    pub domain: ApiDomain,
    /// Function name, e.g. "cudaLaunchKernel".
    pub name: StrId,
    /// CUPTI callback id of the function.
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    /// OS thread id (gettid) of the caller.
    pub tid: u64,
    pub corr: u32,
    /// Return code (cudaError_t / CUresult).
    pub ret: u32,
}

/// A CUDA graph node as the program made it: created (while a stream was being captured, by the
/// launch or copy that the capture turned into the node, or by an explicit `cudaGraphAdd*Node`
/// call) with the CPU stack of that call, or cloned from another node (instantiating a graph
/// clones its nodes; the kernels a replay runs name the clones). Joins kernels, copies and memsets
/// (their `graph`) to the line that put them into the graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Gnode {
    /// CUPTI's graph id and the node's id.
    pub graph: u32,
    pub node: u64,
    /// The stack of the call that created the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
    /// OS thread id of that call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u64>,
    /// The node this one is a clone of: `[graph, node]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<GraphNode>,
}

/// A CPU stack captured at an API call whose activity record did not carry it (e.g. its activity kind
/// was off, or it never completed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Callsite {
    pub corr: u32,
    /// API function name.
    pub api: StrId,
    pub tid: u64,
    /// Trace-clock time of the capture.
    pub ts: u64,
    pub stack: StackId,
    /// How many calls of this kind (launches of the same kernel function, or copies / memsets)
    /// on this thread the capture stands for: the calls since the previous capture of the same
    /// key, itself included. Absent: 1 (sessions before sampling weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u64>,
}

/// A CUDA runtime or driver call other than a launch, copy, memset or synchronization (those have
/// records of their own) that held the calling thread at least `options.hostcall_us`: allocations
/// and frees (`cudaFree` waits for the device), pinned-host allocations, module loads, stream,
/// event and graph creation, graph instantiation, limits… The time the host spent in it is
/// `end - start`. Calls shorter than the threshold are not recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Hostcall {
    pub domain: ApiDomain,
    /// Function name, e.g. "cudaFree".
    pub name: StrId,
    /// CUPTI callback id of the function.
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    /// OS thread id of the caller.
    pub tid: u64,
    pub corr: u32,
    /// CUPTI context id, when the call had a context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx: Option<u32>,
    /// Bytes asked for (allocation calls), when the call's parameters say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Return code (cudaError_t / CUresult), absent when 0 (success).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ret: u32,
    /// CPU stack at the call (present when stack capture is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// What a `mem` record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MemOp {
    /// Memory was allocated (or, for virtual memory, mapped) at `addr`.
    #[default]
    Alloc,
    /// The allocation at `addr` was freed (or unmapped).
    Free,
    /// An allocation failed: out of memory (`cudaErrorMemoryAllocation` /
    /// `CUDA_ERROR_OUT_OF_MEMORY`); `bytes` is the size asked for.
    AllocFailed,
    /// An operation this reader does not know (written by a newer recorder).
    #[serde(other)]
    Unknown,
}

/// One allocation, free or failed allocation of GPU-visible memory (device, pinned host, managed,
/// stream-ordered pool memory): CUPTI's memory activity, with the call-site stack of allocations
/// of at least `options.mem_stack_bytes`; failed allocations come from the API callbacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Mem {
    /// Trace-clock time of the operation (ns).
    pub ts: u64,
    pub op: MemOp,
    /// Virtual address of the allocation (0 for a failed allocation).
    pub addr: u64,
    /// Bytes allocated or freed; for a failed allocation the bytes asked for.
    pub bytes: u64,
    pub mem_kind: MemoryKind,
    pub dev: u32,
    /// CUPTI context id (0: unknown).
    pub ctx: u32,
    /// Correlation id of the API call that allocated or freed.
    pub corr: u32,
    /// CUPTI stream id of a stream-ordered operation (`cudaMallocAsync`, `cudaFreeAsync`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<u32>,
    /// Base address of the memory pool a stream-ordered allocation came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<u64>,
    /// Bytes the pool held from the device after the operation (its reserved size), when CUPTI
    /// reports it: what the device sees of pool memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_bytes: Option<u64>,
    /// The API function, when known (failed allocations: e.g. `cudaMalloc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<StrId>,
    /// OS thread id of the caller (present with a stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u64>,
    /// CPU stack at the call (allocations of at least `options.mem_stack_bytes`, every failed
    /// allocation; stacks on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
    /// Failed allocations: the device's free memory, bytes, at the last telemetry sample before
    /// the failure (NVML), when telemetry was on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<u64>,
    /// An allocation still live when the recorder started this trace file, written again at its
    /// start (rolling files: the oldest files are deleted, the allocations they hold are not).
    /// Its fields are the original's, `ts` included; a reader that saw the original skips it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carried: bool,
}

impl Mem {
    /// Whether this record adds live bytes (a successful allocation).
    pub fn is_alloc(&self) -> bool {
        self.op == MemOp::Alloc
    }
}

/// What a sampled host thread was doing ([`Hsample::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Running on a CPU (or runnable).
    Cpu,
    /// Inside a CUDA call the recorder sees (`call` names it).
    Cuda,
    /// Blocked on a lock: a futex wait, the GIL included.
    Lock,
    /// Blocked in another system call: sleep, I/O, poll.
    Sleep,
    /// Parked in an idle wait of the Python standard library (`threading`, `queue`, …).
    Idle,
    #[default]
    #[serde(other)]
    Unknown,
}

impl HostState {
    /// The name used in reports ("on CPU", "in a CUDA call", …).
    pub fn display_name(self) -> &'static str {
        match self {
            HostState::Cpu => "on CPU",
            HostState::Cuda => "in a CUDA call",
            HostState::Lock => "waiting on a lock",
            HostState::Sleep => "sleeping or in I/O",
            HostState::Idle => "idle",
            HostState::Unknown => "unknown",
        }
    }
}

/// One sample of a host thread taken by the recorder's host sampler (`options.host_samples_hz`):
/// the threads that issue CUDA work and the Python threads that drive them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Hsample {
    /// Trace-clock time of the sample.
    pub ts: u64,
    /// OS thread id of the sampled thread.
    pub tid: u64,
    pub state: HostState,
    /// Host time this sample stands for, ns (the sampler's period when it was taken).
    pub period_ns: u64,
    /// The thread's stack (Python frames, and native frames where they could be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
    /// The CUDA function the thread was inside (state `cuda`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<StrId>,
}

/// An interval in which GPU activity (kernel, memcpy and memset records) was collected, in an
/// always-on session (`options.mode` "always-on"); outside windows such a session has no GPU
/// activity records. Written when the window closes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Window {
    /// Trace clock (ns) when collection started.
    pub start: u64,
    /// Trace clock (ns) when collection stopped.
    pub end: u64,
    /// Why: "sampled" (the cost budget's periodic window), "trigger" (`gpufl trigger`, the
    /// trigger signal) or "api" (`gpufl_capture_window`).
    pub reason: String,
}

/// What a stream is, when the recorder knows it: written once per context for its default streams
/// (the CUPTI stream id that the NULL stream handle maps to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StreamInfo {
    pub ctx: u32,
    /// CUPTI stream id, as in `kernel.stream`.
    pub stream: u32,
    pub role: StreamRole,
}

/// The role of a stream in its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StreamRole {
    /// The legacy default stream (stream handle 0 without per-thread default streams): work on
    /// it waits for, and blocks, all other blocking streams of the context.
    #[default]
    LegacyDefault,
    /// A thread's per-thread default stream (`cudaStreamPerThread`, `--default-stream per-thread`).
    PerThreadDefault,
    /// A role this reader does not know (written by a newer recorder).
    #[serde(other)]
    Other,
}

/// Recording paused or resumed (`gpufl_pause` / `gpufl_resume`, `gpufl.pause()`): while paused
/// the recorder collects nothing, so an absence of GPU work there says nothing about the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CaptureState {
    /// When the change took effect, trace clock (ns).
    pub ts: u64,
    /// true: recording from `ts` on; false: paused from `ts` on.
    pub recording: bool,
}

/// A named scope opened (`end` false) or closed (`end` true) on a thread: `gpufl_scope_push` /
/// `gpufl_scope_pop`, `gpufl::Scope`, `gpufl.scope(...)`, or an NVTX range push/pop. Scopes of a
/// thread nest: a close ends the innermost open scope of its thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Scope {
    /// When the scope was opened or closed, trace clock (ns).
    pub ts: u64,
    pub tid: u64,
    /// Scope name.
    pub name: StrId,
    /// Nesting depth of this scope on its thread (0 = outermost).
    pub depth: u32,
    /// true: the scope closes here; false (omitted): it opens here.
    #[serde(default, skip_serializing_if = "is_false")]
    pub end: bool,
    pub source: ScopeSource,
}

/// A start/end range that may begin and end on different threads (`nvtxRangeStart*` /
/// `nvtxRangeEnd`, NVTX's process-wide ranges), written once when it ends. Ranges do not nest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Range {
    /// The range id NVTX returned (unique among open ranges of the process).
    pub id: u64,
    pub name: StrId,
    /// Start and end, trace clock (ns).
    pub start: u64,
    pub end: u64,
    /// Thread that started the range.
    pub tid: u64,
    /// Thread that ended it, when not the starting thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_tid: Option<u64>,
    pub source: ScopeSource,
}

/// Where a scope came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScopeSource {
    /// gpufl's own API (C, C++, Python).
    #[default]
    Api,
    /// An NVTX range (nvtxRangePush / nvtxRangePop, recorded through NVTX injection).
    Nvtx,
    /// A source this reader does not know (written by a newer recorder).
    #[serde(other)]
    Unknown,
}

/// Time CUPTI itself spent (buffer flushes, instrumentation…).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Overhead {
    /// CUPTI's overhead kind, e.g. "activity_buffer_flush", "driver_compiler", "instrumentation".
    pub kind: String,
    pub start: u64,
    pub end: u64,
}

/// Records lost, and where. Nothing is lost silently: every loss is counted here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Dropped {
    /// "cupti" (activity buffer full), "stack_queue" (stack samples queue full) or "buffer_pool".
    pub source: String,
    pub count: u64,
}

/// A one-off message from the recorder (e.g. Python frames unavailable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Notice {
    /// "info", "warning" or "error".
    pub level: String,
    pub message: String,
}

/// Last record of a cleanly closed session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct End {
    /// Wall clock at close, ns since the Unix epoch.
    pub end_unix_ns: u64,
    /// "shutdown" (gpufl::shutdown), "exit" (process exit) or "context_destroy".
    pub reason: String,
    pub counts: Counts,
}

/// Number of records of each kind in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Counts {
    pub kernels: u64,
    pub memcpys: u64,
    pub memsets: u64,
    pub syncs: u64,
    pub apis: u64,
    pub stacks: u64,
    pub dropped: u64,
}

impl Counts {
    /// Count one record.
    pub fn add(&mut self, rec: &Record) {
        match rec {
            Record::Kernel(_) => self.kernels += 1,
            Record::Memcpy(_) => self.memcpys += 1,
            Record::Memset(_) => self.memsets += 1,
            Record::Sync(_) => self.syncs += 1,
            Record::Api(_) => self.apis += 1,
            Record::Stack(_) => self.stacks += 1,
            Record::Dropped(d) => self.dropped += d.count,
            _ => {}
        }
    }
}
