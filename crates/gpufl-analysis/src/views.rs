//! Plain views of the records a [`Model`](crate::Model) holds, and the byte encodings of the
//! enumerations its columns store.

use crate::ids::{CorrId, StackIx};
use gpufl_trace::{CopyKind, FrameKind, HostState, MemoryKind, StrId, SyncKind};
use serde::Serialize;

/// A kernel execution as the model keeps it (launch configuration and register / memory figures are
/// not kept: no rule needs them yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KernelRec {
    /// Kernel name (resolve with [`Model::str`](crate::Model::str)).
    pub name: StrId,
    pub start: u64,
    pub end: u64,
    pub dev: u32,
    pub ctx: u32,
    pub stream: u32,
    pub corr: CorrId,
}

/// A kernel launch's configuration and resource use, as CUPTI recorded it (`kernel` record). The
/// model keeps each distinct configuration once ([`Model::kernel_config`](crate::Model::kernel_config)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
pub struct LaunchConfig {
    /// Grid dimensions, blocks.
    pub grid: [i32; 3],
    /// Block dimensions, threads.
    pub block: [i32; 3],
    /// Registers per thread.
    pub regs: u16,
    /// Static shared memory per block, bytes.
    pub smem_static: i32,
    /// Dynamic shared memory per block, bytes.
    pub smem_dynamic: i32,
    /// Local memory per thread, bytes.
    pub local_mem: u32,
    /// Shared memory per SM the driver configured (the carveout), bytes, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smem_executed: Option<u32>,
}

impl LaunchConfig {
    /// Blocks in the grid (0 for a negative dimension: CUPTI never writes one).
    pub fn blocks(&self) -> u64 {
        self.grid
            .iter()
            .map(|&d| u64::try_from(d).unwrap_or(0))
            .product()
    }

    /// Threads per block (0 for a negative dimension).
    pub fn threads_per_block(&self) -> u64 {
        self.block
            .iter()
            .map(|&d| u64::try_from(d).unwrap_or(0))
            .product()
    }

    /// Static + dynamic shared memory per block, bytes (negative values count as 0).
    pub fn smem_bytes(&self) -> u64 {
        self.smem_static.max(0) as u64 + self.smem_dynamic.max(0) as u64
    }
}

/// What a [`CopyRec`] is: a copy with its direction and memory kinds, or a memset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum CopyOp {
    Memcpy {
        kind: CopyKind,
        src_kind: MemoryKind,
        dst_kind: MemoryKind,
    },
    Memset {
        mem_kind: MemoryKind,
    },
}

/// A memcpy or memset executed by the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CopyRec {
    #[serde(flatten)]
    pub op: CopyOp,
    pub bytes: u64,
    pub start: u64,
    pub end: u64,
    pub dev: u32,
    pub ctx: u32,
    pub stream: u32,
    pub corr: CorrId,
}

/// A synchronization. `stack` is the model's stack (see [`Model::stack`](crate::Model::stack)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncRec {
    pub kind: SyncKind,
    pub start: u64,
    pub end: u64,
    pub ctx: u32,
    pub stream: Option<u32>,
    pub event: Option<u32>,
    pub corr: CorrId,
    pub tid: Option<u64>,
    pub stack: Option<StackIx>,
}

impl SyncRec {
    /// Host-side duration (`end - start`, 0 if the record ends before it starts).
    pub fn duration_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A host API call (`api` record). `name` resolves with [`Model::str`](crate::Model::str).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ApiRec {
    pub name: StrId,
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    pub tid: u64,
    pub corr: CorrId,
}

impl ApiRec {
    /// Host time in the call (`end - start`, 0 if it ends before it starts).
    pub fn duration_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A CUDA call that held its thread (`hostcall` record): an allocation or free, a pinned-host
/// allocation, a module load, stream / event / graph lifecycle, a limit. `name` resolves with
/// [`Model::str`](crate::Model::str).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HostcallRec {
    pub name: StrId,
    pub start: u64,
    pub end: u64,
    pub tid: u64,
    pub corr: CorrId,
    pub ctx: Option<u32>,
    /// Bytes asked for (allocation calls), when the call's parameters said.
    pub bytes: Option<u64>,
    pub stack: Option<StackIx>,
}

impl HostcallRec {
    /// Host time in the call (`end - start`, 0 if it ends before it starts).
    pub fn duration_ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// One sample of a host thread (`hsample` record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HsampleRec {
    pub ts: u64,
    pub tid: u64,
    pub state: HostState,
    /// Host time the sample stands for, ns.
    pub period_ns: u64,
    /// Python frames (none for a thread that runs no Python).
    pub stack: Option<StackIx>,
    /// The CUDA function the thread was inside (state `cuda`).
    pub call: Option<StrId>,
}

/// A frame with its strings resolved (`?` for strings the trace never defined).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FrameView<'a> {
    pub kind: FrameKind,
    pub module: Option<&'a str>,
    pub offset: Option<u64>,
    pub func: Option<&'a str>,
    pub file: Option<&'a str>,
    pub line: Option<u32>,
    pub inlined: bool,
    /// The source line's text, when the recorder stored it.
    pub text: Option<&'a str>,
}

pub(crate) fn sync_kind_to_u8(k: SyncKind) -> u8 {
    match k {
        SyncKind::EventSynchronize => 1,
        SyncKind::StreamWaitEvent => 2,
        SyncKind::StreamSynchronize => 3,
        SyncKind::ContextSynchronize => 4,
        SyncKind::Unknown => 0,
    }
}

pub(crate) fn sync_kind_from_u8(b: u8) -> SyncKind {
    match b {
        1 => SyncKind::EventSynchronize,
        2 => SyncKind::StreamWaitEvent,
        3 => SyncKind::StreamSynchronize,
        4 => SyncKind::ContextSynchronize,
        _ => SyncKind::Unknown,
    }
}

const HOST_STATES: [HostState; 6] = [
    HostState::Unknown,
    HostState::Cpu,
    HostState::Cuda,
    HostState::Lock,
    HostState::Sleep,
    HostState::Idle,
];

pub(crate) fn host_state_to_u8(s: HostState) -> u8 {
    HOST_STATES.iter().position(|&x| x == s).unwrap_or(0) as u8
}

pub(crate) fn host_state_from_u8(b: u8) -> HostState {
    HOST_STATES
        .get(b as usize)
        .copied()
        .unwrap_or(HostState::Unknown)
}

const COPY_KINDS: [CopyKind; 11] = [
    CopyKind::Unknown,
    CopyKind::HtoD,
    CopyKind::DtoH,
    CopyKind::HtoA,
    CopyKind::AtoH,
    CopyKind::AtoA,
    CopyKind::AtoD,
    CopyKind::DtoA,
    CopyKind::DtoD,
    CopyKind::HtoH,
    CopyKind::PtoP,
];

const MEM_KINDS: [MemoryKind; 8] = [
    MemoryKind::Unknown,
    MemoryKind::Pageable,
    MemoryKind::Pinned,
    MemoryKind::Device,
    MemoryKind::Array,
    MemoryKind::Managed,
    MemoryKind::DeviceStatic,
    MemoryKind::ManagedStatic,
];

/// `op` byte of a memset in the copies table (memcpy kinds use 0..=10).
pub(crate) const OP_MEMSET: u8 = 255;

pub(crate) fn copy_kind_to_u8(k: CopyKind) -> u8 {
    COPY_KINDS.iter().position(|&c| c == k).unwrap_or(0) as u8
}

pub(crate) fn mem_kind_to_u8(k: MemoryKind) -> u8 {
    MEM_KINDS.iter().position(|&c| c == k).unwrap_or(0) as u8
}

pub(crate) fn mem_kind_from_u8(b: u8) -> MemoryKind {
    MEM_KINDS
        .get(b as usize)
        .copied()
        .unwrap_or(MemoryKind::Unknown)
}

pub(crate) fn copy_op_from(op: u8, src: u8, dst: u8) -> CopyOp {
    if op == OP_MEMSET {
        CopyOp::Memset {
            mem_kind: mem_kind_from_u8(src),
        }
    } else {
        CopyOp::Memcpy {
            kind: COPY_KINDS
                .get(op as usize)
                .copied()
                .unwrap_or(CopyKind::Unknown),
            src_kind: mem_kind_from_u8(src),
            dst_kind: mem_kind_from_u8(dst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip_through_bytes() {
        for k in [
            SyncKind::EventSynchronize,
            SyncKind::StreamWaitEvent,
            SyncKind::StreamSynchronize,
            SyncKind::ContextSynchronize,
            SyncKind::Unknown,
        ] {
            assert_eq!(sync_kind_from_u8(sync_kind_to_u8(k)), k);
        }
        for s in HOST_STATES {
            assert_eq!(host_state_from_u8(host_state_to_u8(s)), s);
        }
        for k in COPY_KINDS {
            for m in MEM_KINDS {
                let op = copy_op_from(copy_kind_to_u8(k), mem_kind_to_u8(m), mem_kind_to_u8(m));
                assert_eq!(
                    op,
                    CopyOp::Memcpy {
                        kind: k,
                        src_kind: m,
                        dst_kind: m
                    }
                );
            }
        }
        assert_eq!(
            copy_op_from(OP_MEMSET, mem_kind_to_u8(MemoryKind::Pinned), 0),
            CopyOp::Memset {
                mem_kind: MemoryKind::Pinned
            }
        );
    }
}
