//! Decoding CUPTI activity records into trace records.
//!
//! Only the leading fields that every struct version since CUDA 12.0 shares are read, by offset,
//! with unaligned reads of plain integers: a newer CUPTI that appends fields decodes the same, and
//! an enum value this build does not know is never materialized as a Rust enum.

use crate::cupti::{self, sys};
use gpufl_trace::{
    Api, ApiDomain, CopyKind, GraphNode, Kernel, Mem, MemOp, Memcpy, MemoryKind, Memset, Overhead,
    StrId, Sync, SyncKind,
};
use std::ffi::{c_char, c_void, CStr};
use std::mem::offset_of;

/// CUPTI's "invalid" marker in stream/event fields of synchronization records.
const INVALID: u32 = u32::MAX;

/// One decoded activity record. Kernel names are handed back as CUPTI's pointer, unread: CUPTI
/// shares one string among all records of a kernel, so the caller can find the name by address and
/// read the bytes only the first time (reading them for every record made the application's
/// launching threads measurably slower, docs/benchmarks.md). Null when CUPTI gave no name.
pub enum Decoded {
    Kernel {
        name: *const c_char,
        kernel: Kernel,
    },
    Memcpy(Memcpy),
    Memset(Memset),
    Sync(Sync),
    /// An API call; its `name` is left for the caller to intern from `domain` and `cbid`.
    Api(Api),
    Overhead(Overhead),
    /// An allocation or free (CUPTI's memory activity); its stack is joined by the writer.
    Mem(Mem),
    /// A kind gpufl does not record (its numeric kind).
    Other(u32),
}

/// Read a plain value at `off` bytes into the record.
///
/// # Safety
/// `base + off .. + size_of::<T>()` must lie inside the record.
unsafe fn rd<T: Copy>(base: *const u8, off: usize) -> T {
    unsafe { (base.add(off) as *const T).read_unaligned() }
}

macro_rules! field {
    ($base:expr, $ty:ty, $field:ident, $out:ty) => {
        // SAFETY: the offset comes from CUPTI's own struct definition for this record kind.
        unsafe { rd::<$out>($base, offset_of!($ty, $field)) }
    };
}

impl Decoded {
    /// Add `base` to the record's correlation id, if it has one (ids made unique across
    /// always-on's detaches: crate::detach).
    pub fn offset_corr(&mut self, base: u32) {
        let corr = match self {
            Decoded::Kernel { kernel, .. } => &mut kernel.corr,
            Decoded::Memcpy(m) => &mut m.corr,
            Decoded::Memset(m) => &mut m.corr,
            Decoded::Sync(s) => &mut s.corr,
            Decoded::Api(a) => &mut a.corr,
            Decoded::Mem(m) => &mut m.corr,
            Decoded::Overhead(_) | Decoded::Other(_) => return,
        };
        *corr = corr.wrapping_add(base);
    }
}

/// The graph node of a GPU record: CUPTI leaves `graphId` 0 for work no graph launch ran.
fn graph_node(graph: u32, node: u64) -> Option<GraphNode> {
    (graph != 0).then_some(GraphNode(graph, node))
}

/// Decode one record.
///
/// # Safety
/// `rec` must point at a complete activity record returned by `cuptiActivityGetNextRecord`.
pub unsafe fn decode(rec: *const c_void) -> Decoded {
    let b = rec as *const u8;
    // SAFETY: every record starts with its u32 kind.
    let kind: u32 = unsafe { rd(b, 0) };
    match kind {
        cupti::KIND_CONCURRENT_KERNEL => {
            type K = sys::CUpti_ActivityKernel9;
            Decoded::Kernel {
                name: field!(b, K, name, *const c_char),
                kernel: Kernel {
                    name: StrId(0),
                    start: field!(b, K, start, u64),
                    end: field!(b, K, end, u64),
                    dev: field!(b, K, deviceId, u32),
                    ctx: field!(b, K, contextId, u32),
                    stream: field!(b, K, streamId, u32),
                    corr: field!(b, K, correlationId, u32),
                    grid: [
                        field!(b, K, gridX, i32),
                        field!(b, K, gridY, i32),
                        field!(b, K, gridZ, i32),
                    ],
                    block: [
                        field!(b, K, blockX, i32),
                        field!(b, K, blockY, i32),
                        field!(b, K, blockZ, i32),
                    ],
                    regs: field!(b, K, registersPerThread, u16),
                    smem_static: field!(b, K, staticSharedMemory, i32),
                    smem_dynamic: field!(b, K, dynamicSharedMemory, i32),
                    local_mem: field!(b, K, localMemoryPerThread, u32),
                    // Same offset in CUpti_ActivityKernel9 (CUDA 12.0) through Kernel13 (13.4).
                    smem_executed: Some(field!(b, K, sharedMemoryExecuted, u32)),
                    graph: graph_node(field!(b, K, graphId, u32), field!(b, K, graphNodeId, u64)),
                },
            }
        }
        cupti::KIND_MEMCPY => {
            type M = sys::CUpti_ActivityMemcpy6;
            Decoded::Memcpy(Memcpy {
                kind: copy_kind(field!(b, M, copyKind, u8)),
                src_kind: memory_kind(field!(b, M, srcKind, u8) as u32),
                dst_kind: memory_kind(field!(b, M, dstKind, u8) as u32),
                bytes: field!(b, M, bytes, u64),
                start: field!(b, M, start, u64),
                end: field!(b, M, end, u64),
                dev: field!(b, M, deviceId, u32),
                ctx: field!(b, M, contextId, u32),
                stream: field!(b, M, streamId, u32),
                corr: field!(b, M, correlationId, u32),
                graph: graph_node(field!(b, M, graphId, u32), field!(b, M, graphNodeId, u64)),
            })
        }
        cupti::KIND_MEMSET => {
            type M = sys::CUpti_ActivityMemset4;
            Decoded::Memset(Memset {
                bytes: field!(b, M, bytes, u64),
                value: field!(b, M, value, u32),
                mem_kind: memory_kind(field!(b, M, memoryKind, u16) as u32),
                start: field!(b, M, start, u64),
                end: field!(b, M, end, u64),
                dev: field!(b, M, deviceId, u32),
                ctx: field!(b, M, contextId, u32),
                stream: field!(b, M, streamId, u32),
                corr: field!(b, M, correlationId, u32),
                graph: graph_node(field!(b, M, graphId, u32), field!(b, M, graphNodeId, u64)),
            })
        }
        cupti::KIND_SYNCHRONIZATION => {
            type S = sys::CUpti_ActivitySynchronization;
            let stream = field!(b, S, streamId, u32);
            let event = field!(b, S, cudaEventId, u32);
            Decoded::Sync(Sync {
                kind: sync_kind(field!(b, S, type_, u32)),
                start: field!(b, S, start, u64),
                end: field!(b, S, end, u64),
                ctx: field!(b, S, contextId, u32),
                stream: (stream != INVALID).then_some(stream),
                event: (event != INVALID).then_some(event),
                corr: field!(b, S, correlationId, u32),
                tid: None,
                stack: None,
            })
        }
        cupti::KIND_RUNTIME | cupti::KIND_DRIVER => {
            type A = sys::CUpti_ActivityAPI;
            Decoded::Api(Api {
                domain: if kind == cupti::KIND_RUNTIME {
                    ApiDomain::Runtime
                } else {
                    ApiDomain::Driver
                },
                name: StrId(0),
                cbid: field!(b, A, cbid, u32),
                start: field!(b, A, start, u64),
                end: field!(b, A, end, u64),
                tid: field!(b, A, threadId, u32) as u64,
                corr: field!(b, A, correlationId, u32),
                ret: field!(b, A, returnValue, u32),
            })
        }
        cupti::KIND_OVERHEAD => {
            type O = sys::CUpti_ActivityOverhead;
            Decoded::Overhead(Overhead {
                kind: overhead_kind(field!(b, O, overheadKind, u32)).to_string(),
                start: field!(b, O, start, u64),
                end: field!(b, O, end, u64),
            })
        }
        cupti::KIND_MEMORY2 => match unsafe { decode_memory(b) } {
            Some(m) => Decoded::Mem(m),
            None => Decoded::Other(kind),
        },
        other => Decoded::Other(other),
    }
}

/// A memory activity record (`CUPTI_ACTIVITY_KIND_MEMORY2`), read with the layout of
/// `CUpti_ActivityMemory3` (CUDA 12.0): `CUpti_ActivityMemory4` (CUPTI 12.6+) only appends a
/// field. None for an operation type other than allocation (1) or release (2).
///
/// # Safety
/// `b` must point at a complete memory activity record.
unsafe fn decode_memory(b: *const u8) -> Option<Mem> {
    type M = sys::CUpti_ActivityMemory3;
    type P = sys::CUpti_ActivityMemory3__bindgen_ty_1;
    let op = match field!(b, M, memoryOperationType, u32) {
        1 => MemOp::Alloc,
        2 => MemOp::Free,
        _ => return None,
    };
    let pool_at = offset_of!(M, memoryPoolConfig);
    // SAFETY: offsets of CUPTI's own struct, inside the record.
    let pool_type: u32 = unsafe { rd(b, pool_at + offset_of!(P, memoryPoolType)) };
    let pool_addr: u64 = unsafe { rd(b, pool_at + offset_of!(P, address)) };
    // The union's `size` (local pools; imported pools hold a process id there).
    let pool_size: u64 = unsafe { rd(b, pool_at + offset_of!(P, pool)) };
    let is_async = field!(b, M, isAsync, u32) != 0;
    let stream = field!(b, M, streamId, u32);
    Some(Mem {
        ts: field!(b, M, timestamp, u64),
        op,
        addr: field!(b, M, address, u64),
        bytes: field!(b, M, bytes, u64),
        mem_kind: memory_kind(field!(b, M, memoryKind, u32)),
        dev: field!(b, M, deviceId, u32),
        ctx: field!(b, M, contextId, u32),
        corr: field!(b, M, correlationId, u32),
        stream: (is_async && stream != INVALID).then_some(stream),
        pool: (pool_type != 0 && pool_addr != 0).then_some(pool_addr),
        pool_bytes: (pool_type == 1 && pool_addr != 0).then_some(pool_size),
        ..Mem::default()
    })
}

/// CUPTI_ACTIVITY_MEMCPY_KIND_* to [`CopyKind`].
pub fn copy_kind(v: u8) -> CopyKind {
    match v {
        1 => CopyKind::HtoD,
        2 => CopyKind::DtoH,
        3 => CopyKind::HtoA,
        4 => CopyKind::AtoH,
        5 => CopyKind::AtoA,
        6 => CopyKind::AtoD,
        7 => CopyKind::DtoA,
        8 => CopyKind::DtoD,
        9 => CopyKind::HtoH,
        10 => CopyKind::PtoP,
        _ => CopyKind::Unknown,
    }
}

/// CUPTI_ACTIVITY_MEMORY_KIND_* to [`MemoryKind`].
pub fn memory_kind(v: u32) -> MemoryKind {
    match v {
        1 => MemoryKind::Pageable,
        2 => MemoryKind::Pinned,
        3 => MemoryKind::Device,
        4 => MemoryKind::Array,
        5 => MemoryKind::Managed,
        6 => MemoryKind::DeviceStatic,
        7 => MemoryKind::ManagedStatic,
        _ => MemoryKind::Unknown,
    }
}

/// CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_* to [`SyncKind`].
pub fn sync_kind(v: u32) -> SyncKind {
    match v {
        1 => SyncKind::EventSynchronize,
        2 => SyncKind::StreamWaitEvent,
        3 => SyncKind::StreamSynchronize,
        4 => SyncKind::ContextSynchronize,
        _ => SyncKind::Unknown,
    }
}

/// CUPTI_ACTIVITY_OVERHEAD_* names.
pub fn overhead_kind(v: u32) -> &'static str {
    match v {
        1 => "driver_compiler",
        0x10000 => "activity_buffer_flush",
        0x20000 => "instrumentation",
        0x30000 => "resource",
        _ => "other",
    }
}

/// Zeroed, 8-byte aligned storage for a synthetic activity record of type `T`, for benchmarks
/// and tests.
#[doc(hidden)]
pub struct SyntheticRecord(Vec<u64>);

impl SyntheticRecord {
    /// A record of type `T` whose kind field is `kind`, every other field zero.
    pub fn new<T>(kind: u32) -> SyntheticRecord {
        let mut r = SyntheticRecord(vec![0u64; std::mem::size_of::<T>() / 8 + 1]);
        r.put(0, &kind.to_ne_bytes());
        r
    }

    /// Write `bytes` at byte offset `off`.
    pub fn put(&mut self, off: usize, bytes: &[u8]) -> &mut Self {
        let storage = self.0.as_mut_slice();
        assert!(
            off + bytes.len() <= storage.len() * 8,
            "field outside the record"
        );
        // SAFETY: in bounds (checked above); u64 storage is valid for any bytes.
        unsafe {
            let b = storage.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.add(off), bytes.len())
        }
        self
    }

    /// The record, as `cuptiActivityGetNextRecord` would point at it.
    pub fn as_ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// A kernel record laid out as CUPTI 13 writes it (`CUpti_ActivityKernel9`): stream 7, grid
/// (132,1,1), block (256,1,1), 40 registers. `name` must outlive every decode of the record.
#[doc(hidden)]
pub fn synthetic_kernel_record(name: &CStr, start: u64, end: u64, corr: u32) -> SyntheticRecord {
    type K = sys::CUpti_ActivityKernel9;
    let mut r = SyntheticRecord::new::<K>(cupti::KIND_CONCURRENT_KERNEL);
    r.put(offset_of!(K, start), &start.to_ne_bytes())
        .put(offset_of!(K, end), &end.to_ne_bytes())
        .put(offset_of!(K, streamId), &7u32.to_ne_bytes());
    for (off, v) in [
        (offset_of!(K, gridX), 132i32),
        (offset_of!(K, gridY), 1),
        (offset_of!(K, gridZ), 1),
        (offset_of!(K, blockX), 256),
        (offset_of!(K, blockY), 1),
        (offset_of!(K, blockZ), 1),
    ] {
        r.put(off, &v.to_ne_bytes());
    }
    r.put(offset_of!(K, registersPerThread), &40u16.to_ne_bytes())
        .put(offset_of!(K, correlationId), &corr.to_ne_bytes())
        .put(offset_of!(K, name), &(name.as_ptr() as usize).to_ne_bytes());
    r
}

/// A memory activity record laid out as CUPTI writes it (`CUpti_ActivityMemory3`): `op` 1
/// allocation, 2 release; device memory on device 0, context 1.
#[doc(hidden)]
pub fn synthetic_memory_record(
    op: u32,
    addr: u64,
    bytes: u64,
    ts: u64,
    corr: u32,
) -> SyntheticRecord {
    type M = sys::CUpti_ActivityMemory3;
    let mut r = SyntheticRecord::new::<M>(cupti::KIND_MEMORY2);
    r.put(offset_of!(M, memoryOperationType), &op.to_ne_bytes())
        .put(offset_of!(M, memoryKind), &3u32.to_ne_bytes())
        .put(offset_of!(M, correlationId), &corr.to_ne_bytes())
        .put(offset_of!(M, address), &addr.to_ne_bytes())
        .put(offset_of!(M, bytes), &bytes.to_ne_bytes())
        .put(offset_of!(M, timestamp), &ts.to_ne_bytes())
        .put(offset_of!(M, contextId), &1u32.to_ne_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_memory_records_by_offset() {
        type M = sys::CUpti_ActivityMemory3;
        type P = sys::CUpti_ActivityMemory3__bindgen_ty_1;
        let rec = synthetic_memory_record(1, 0x7f00_0000_0000, 8 << 20, 1234, 55);
        let Decoded::Mem(m) = (unsafe { decode(rec.as_ptr()) }) else {
            panic!("not decoded as a mem record");
        };
        assert_eq!(m.op, MemOp::Alloc);
        assert_eq!(
            (m.addr, m.bytes, m.ts, m.corr),
            (0x7f00_0000_0000, 8 << 20, 1234, 55)
        );
        assert_eq!((m.mem_kind, m.dev, m.ctx), (MemoryKind::Device, 0, 1));
        assert_eq!((m.stream, m.pool, m.pool_bytes), (None, None, None));
        // A stream-ordered free from a local pool of 64 MiB, on stream 13 of device 2.
        let mut rec = synthetic_memory_record(2, 0x7f00_0000_0000, 8 << 20, 2000, 56);
        let pool = offset_of!(M, memoryPoolConfig);
        rec.put(offset_of!(M, isAsync), &1u32.to_ne_bytes())
            .put(offset_of!(M, streamId), &13u32.to_ne_bytes())
            .put(offset_of!(M, deviceId), &2u32.to_ne_bytes())
            .put(offset_of!(M, memoryKind), &2u32.to_ne_bytes())
            .put(pool + offset_of!(P, memoryPoolType), &1u32.to_ne_bytes())
            .put(
                pool + offset_of!(P, address),
                &0x7e00_0000_0000u64.to_ne_bytes(),
            )
            .put(pool + offset_of!(P, pool), &(64u64 << 20).to_ne_bytes());
        let Decoded::Mem(m) = (unsafe { decode(rec.as_ptr()) }) else {
            panic!("not decoded as a mem record");
        };
        assert_eq!(m.op, MemOp::Free);
        assert_eq!(
            (m.stream, m.dev, m.mem_kind),
            (Some(13), 2, MemoryKind::Pinned)
        );
        assert_eq!(
            (m.pool, m.pool_bytes),
            (Some(0x7e00_0000_0000), Some(64 << 20))
        );
        // An operation type this build does not know is not a mem record.
        let rec = synthetic_memory_record(7, 1, 1, 1, 1);
        assert!(matches!(
            unsafe { decode(rec.as_ptr()) },
            Decoded::Other(cupti::KIND_MEMORY2)
        ));
    }

    /// CUPTI 13 writes `CUpti_ActivityMemory4`; the decoder reads `CUpti_ActivityMemory3`'s
    /// layout: every field it reads sits at the same offset in both.
    #[test]
    fn memory3_and_memory4_share_the_offsets_the_decoder_reads() {
        type M3 = sys::CUpti_ActivityMemory3;
        type M4 = sys::CUpti_ActivityMemory4;
        macro_rules! same {
            ($($f:ident),*) => {$(
                assert_eq!(offset_of!(M3, $f), offset_of!(M4, $f), stringify!($f));
            )*};
        }
        same!(
            memoryOperationType,
            memoryKind,
            correlationId,
            address,
            bytes,
            timestamp,
            deviceId,
            contextId,
            streamId,
            isAsync,
            memoryPoolConfig
        );
    }

    /// A synthetic kernel record laid out as CUPTI writes it decodes field by field.
    #[test]
    fn decodes_a_kernel_record_by_offset() {
        type K = sys::CUpti_ActivityKernel9;
        let name = c"_Z6saxpyifPfS_";
        let mut rec = synthetic_kernel_record(name, 1000, 3500, 99);
        rec.put(offset_of!(K, localMemoryPerThread), &16u32.to_ne_bytes())
            .put(
                offset_of!(K, sharedMemoryExecuted),
                &233_472u32.to_ne_bytes(),
            );
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Kernel { name: n, kernel } => {
                assert_eq!(n, name.as_ptr());
                assert_eq!(
                    (kernel.start, kernel.end, kernel.stream, kernel.corr),
                    (1000, 3500, 7, 99)
                );
                assert_eq!(kernel.grid[0], 132);
                assert_eq!(kernel.block[0], 256);
                assert_eq!(kernel.regs, 40);
                assert_eq!(kernel.local_mem, 16);
                assert_eq!(kernel.smem_executed, Some(233_472));
            }
            _ => panic!("not decoded as a kernel"),
        }
    }

    /// CUPTI 13 writes `CUpti_ActivityKernel10`; the decoder reads with the layout of
    /// `CUpti_ActivityKernel9` (CUDA 12.0): every field it reads sits at the same offset in both.
    #[test]
    fn kernel9_and_kernel10_share_the_offsets_the_decoder_reads() {
        type K9 = sys::CUpti_ActivityKernel9;
        type K10 = sys::CUpti_ActivityKernel10;
        macro_rules! same {
            ($($f:ident),*) => {$(
                assert_eq!(offset_of!(K9, $f), offset_of!(K10, $f), stringify!($f));
            )*};
        }
        same!(
            start,
            end,
            deviceId,
            contextId,
            streamId,
            correlationId,
            gridX,
            blockZ,
            registersPerThread,
            staticSharedMemory,
            dynamicSharedMemory,
            localMemoryPerThread,
            sharedMemoryExecuted,
            graphNodeId,
            graphId,
            name
        );
    }

    #[test]
    fn graph_ids_are_decoded_where_a_graph_ran_the_work() {
        type K = sys::CUpti_ActivityKernel9;
        let name = c"k";
        let mut rec = synthetic_kernel_record(name, 1000, 3500, 99);
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Kernel { kernel, .. } => assert_eq!(kernel.graph, None),
            _ => panic!("not decoded as a kernel"),
        }
        rec.put(offset_of!(K, graphId), &12u32.to_ne_bytes())
            .put(offset_of!(K, graphNodeId), &(7u64 << 40 | 3).to_ne_bytes());
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Kernel { kernel, .. } => {
                assert_eq!(kernel.graph, Some(GraphNode(12, 7 << 40 | 3)))
            }
            _ => panic!("not decoded as a kernel"),
        }
        type M = sys::CUpti_ActivityMemcpy6;
        let mut rec = SyntheticRecord::new::<M>(cupti::KIND_MEMCPY);
        rec.put(offset_of!(M, start), &5u64.to_ne_bytes())
            .put(offset_of!(M, end), &9u64.to_ne_bytes())
            .put(offset_of!(M, graphId), &4u32.to_ne_bytes())
            .put(offset_of!(M, graphNodeId), &77u64.to_ne_bytes());
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Memcpy(m) => assert_eq!(m.graph, Some(GraphNode(4, 77))),
            _ => panic!("not decoded as a copy"),
        }
        type S = sys::CUpti_ActivityMemset4;
        let mut rec = SyntheticRecord::new::<S>(cupti::KIND_MEMSET);
        rec.put(offset_of!(S, graphId), &6u32.to_ne_bytes())
            .put(offset_of!(S, graphNodeId), &8u64.to_ne_bytes());
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Memset(m) => assert_eq!(m.graph, Some(GraphNode(6, 8))),
            _ => panic!("not decoded as a memset"),
        }
    }

    #[test]
    fn sync_record_with_invalid_stream_is_context_sync() {
        type S = sys::CUpti_ActivitySynchronization;
        let mut rec = SyntheticRecord::new::<S>(cupti::KIND_SYNCHRONIZATION);
        rec.put(offset_of!(S, type_), &4u32.to_ne_bytes())
            .put(offset_of!(S, streamId), &u32::MAX.to_ne_bytes())
            .put(offset_of!(S, cudaEventId), &u32::MAX.to_ne_bytes())
            .put(offset_of!(S, correlationId), &5u32.to_ne_bytes());
        match unsafe { decode(rec.as_ptr()) } {
            Decoded::Sync(s) => {
                assert_eq!(s.kind, SyncKind::ContextSynchronize);
                assert_eq!(s.stream, None);
                assert_eq!(s.event, None);
                assert_eq!(s.corr, 5);
            }
            _ => panic!("not decoded as a sync"),
        }
    }

    #[test]
    fn unknown_enum_values_do_not_panic() {
        assert_eq!(copy_kind(200), CopyKind::Unknown);
        assert_eq!(memory_kind(99), MemoryKind::Unknown);
        assert_eq!(sync_kind(17), SyncKind::Unknown);
        assert_eq!(overhead_kind(5), "other");
    }
}
