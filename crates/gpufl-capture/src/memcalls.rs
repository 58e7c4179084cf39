//! `mem` records: allocations, frees and failed allocations of GPU-visible memory.
//!
//! **Where they come from.** Allocations and frees are CUPTI's memory activity
//! (`CUPTI_ACTIVITY_KIND_MEMORY2`, decoded by [`crate::activity`]): one record per operation,
//! with its address, size, memory kind, device, context, stream and the correlation id of the
//! API call. The activity kind stays on in every mode (always-on included, outside windows too):
//! an allocation is rare next to launches, and the out-of-memory post-mortem needs what was
//! alive long before the crash.
//!
//! **Stacks and failures.** The allocating functions ([`is_alloc_fn`]) are on the hostcall
//! table ([`crate::hostcalls`]); at their exit callback, an allocation of at least
//! `GPUFL_MEM_STACK_BYTES` (default [`crate::options::DEFAULT_MEM_STACK_BYTES`]) captures its
//! stack within the thread's capture budget, and a failed one ([`OUT_OF_MEMORY`]) always does.
//! Smaller allocations get no stack. The writer joins a captured stack to the activity record of
//! the same correlation id ([`StackJoin`]) and writes a failed allocation at once, with the
//! device's free memory at the last telemetry sample ([`DeviceFree`]: NVML, read by the telemetry
//! thread; nothing is asked of CUDA or NVML from the callback).
//!
//! **Hot path.** Nothing beyond the hostcall callback's own: a table lookup, the size read from
//! the call's parameters, a comparison; the stack capture and a push on the bounded sample queue
//! for large or failed allocations only. No lock, no allocation.

use gpufl_trace::{Mem, MemOp, MemoryKind, StackId, Telemetry};
use std::collections::{HashMap, VecDeque};

/// `cudaErrorMemoryAllocation` and `CUDA_ERROR_OUT_OF_MEMORY`: both 2.
pub const OUT_OF_MEMORY: u32 = 2;

/// Stacks waiting for their activity record, at most (the oldest go first).
pub const MAX_PENDING_STACKS: usize = 8192;

/// Whether the function (its name without the version suffix) allocates memory: its call-site
/// stack goes with the `mem` record of what it allocated, and its failure is an out-of-memory.
pub fn is_alloc_fn(name: &str) -> bool {
    let base = name.strip_suffix("_ptsz").unwrap_or(name);
    base.starts_with("cudaMalloc")
        || base.starts_with("cuMemAlloc")
        || matches!(base, "cudaHostAlloc" | "cuMemHostAlloc" | "cuMemCreate")
}

/// The kind of memory an allocating function (its name) allocates.
pub fn kind_of(name: &str) -> MemoryKind {
    let base = name.strip_suffix("_ptsz").unwrap_or(name);
    if matches!(
        base,
        "cudaMallocHost" | "cudaHostAlloc" | "cuMemAllocHost" | "cuMemHostAlloc"
    ) {
        MemoryKind::Pinned
    } else if base.contains("Managed") {
        MemoryKind::Managed
    } else if base.contains("Array") {
        MemoryKind::Array
    } else {
        MemoryKind::Device
    }
}

/// What the allocation callback hands the writer besides the sample's common fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemFacts {
    /// Bytes asked for, when the call's parameters give it.
    pub bytes: Option<u64>,
    /// The call's return code.
    pub ret: u32,
    /// The call failed for want of memory: the writer writes an `alloc_failed` record.
    pub failed: bool,
    /// The device of the call's context (failed allocations).
    pub dev: Option<u32>,
}

/// The facts of an allocation call's exit worth a sample: a failure for want of memory, or a
/// successful allocation of at least `threshold` bytes. None: nothing to record here (its
/// activity record is written without a stack).
pub fn facts(bytes: Option<u64>, ret: u32, threshold: u64) -> Option<MemFacts> {
    let failed = ret == OUT_OF_MEMORY;
    let large = ret == 0 && bytes.is_some_and(|b| b >= threshold);
    (failed || large).then_some(MemFacts {
        bytes,
        ret,
        failed,
        dev: None,
    })
}

/// The writer's join of allocation stacks (from the callbacks) to CUPTI's memory records, by
/// correlation id, else by time: the allocation call whose span (entry to exit) holds the
/// record's timestamp (should CUPTI give the memory record the correlation id of a driver call
/// made inside the runtime call the callback saw). Bounded: the oldest stacks are forgotten past [`MAX_PENDING_STACKS`] (an
/// allocation whose activity record never comes).
#[derive(Default)]
pub struct StackJoin {
    by_corr: HashMap<u32, Pending>,
    order: VecDeque<u32>,
}

impl StackJoin {
    /// Remember the stack and thread of the allocation call `corr`, which ran from `start` to
    /// `end`.
    pub fn insert(&mut self, corr: u32, stack: StackId, tid: u64, start: u64, end: u64) {
        let p = Pending {
            stack,
            tid,
            start,
            end,
        };
        if self.by_corr.insert(corr, p).is_none() {
            self.order.push_back(corr);
        }
        while self.order.len() > MAX_PENDING_STACKS {
            if let Some(old) = self.order.pop_front() {
                self.by_corr.remove(&old);
            }
        }
    }

    /// Give an allocation record its call's stack and thread, if captured.
    pub fn attach(&mut self, m: &mut Mem) {
        if m.op != MemOp::Alloc || m.stack.is_some() {
            return;
        }
        let key = if self.by_corr.contains_key(&m.corr) {
            Some(m.corr)
        } else {
            self.by_corr
                .iter()
                .find(|(_, p)| p.start <= m.ts && m.ts <= p.end)
                .map(|(&c, _)| c)
        };
        if let Some(p) = key.and_then(|c| self.by_corr.remove(&c)) {
            m.stack = Some(p.stack);
            m.tid = Some(p.tid);
        }
    }

    /// Stacks waiting.
    pub fn len(&self) -> usize {
        self.by_corr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_corr.is_empty()
    }

    /// Forget every stack (a new trace file: stack ids start over).
    pub fn clear(&mut self) {
        self.by_corr.clear();
        self.order.clear();
    }
}

/// A captured allocation stack: the stack, its thread, the call's span (trace clock).
#[derive(Clone, Copy, Debug)]
struct Pending {
    stack: StackId,
    tid: u64,
    start: u64,
    end: u64,
}

/// Each device's free memory at its last telemetry sample (NVML: total − used).
#[derive(Default)]
pub struct DeviceFree {
    free: HashMap<u32, u64>,
}

impl DeviceFree {
    /// Take a telemetry sample.
    pub fn observe(&mut self, t: &Telemetry) {
        if let (Some(total), Some(used)) = (t.mem_total, t.mem_used) {
            self.free.insert(t.dev, total.saturating_sub(used));
        }
    }

    /// The device's free bytes at its last sample.
    pub fn get(&self, dev: u32) -> Option<u64> {
        self.free.get(&dev).copied()
    }
}

/// Allocations tracked live by the writer, at most (beyond, new ones are counted, not kept).
pub const MAX_LIVE: usize = 1 << 16;

/// The process's live allocations as the writer wrote them: each device's live and peak bytes
/// for the exporter's feed, and the allocations a new trace file starts with (rolling files:
/// [`crate::sink::Sink::rotate`] writes them again, `carried`, so deleting the oldest file loses no
/// allocation that is still held — the out-of-memory post-mortem of a long always-on run needs
/// what was allocated hours before). Bounded: [`MAX_LIVE`] allocations.
#[derive(Default)]
pub struct LiveSet {
    by_addr: HashMap<(u32, u64), Mem>,
    /// (device, live bytes, peak live bytes), live counting untracked allocations too.
    devs: Vec<(u32, u64, u64)>,
    /// Allocations not kept for want of room (their bytes still counted while live).
    pub untracked: u64,
    untracked_live: HashMap<(u32, u64), u64>,
}

impl LiveSet {
    fn dev(&mut self, dev: u32) -> &mut (u32, u64, u64) {
        let i = match self.devs.iter().position(|d| d.0 == dev) {
            Some(i) => i,
            None => {
                self.devs.push((dev, 0, 0));
                self.devs.len() - 1
            }
        };
        &mut self.devs[i]
    }

    /// A `mem` record was written (a carried one is not new: not counted again).
    pub fn note(&mut self, m: &Mem) {
        if m.carried {
            return;
        }
        let key = (m.dev, m.addr);
        match m.op {
            MemOp::Alloc => {
                // An address allocated again without a free seen: the old one is gone.
                let old = self.take(key);
                if self.by_addr.len() < MAX_LIVE {
                    self.by_addr.insert(key, m.clone());
                } else if self.untracked_live.len() < MAX_LIVE {
                    self.untracked += 1;
                    self.untracked_live.insert(key, m.bytes);
                } else {
                    self.untracked += 1;
                }
                let d = self.dev(m.dev);
                d.1 = d.1.saturating_sub(old.unwrap_or(0)) + m.bytes;
                d.2 = d.2.max(d.1);
            }
            MemOp::Free => {
                if let Some(b) = self.take(key) {
                    let d = self.dev(m.dev);
                    d.1 = d.1.saturating_sub(b);
                }
            }
            MemOp::AllocFailed | MemOp::Unknown => {}
        }
    }

    /// Forget the live allocation at `key`, kept or untracked: its bytes.
    fn take(&mut self, key: (u32, u64)) -> Option<u64> {
        self.by_addr
            .remove(&key)
            .map(|o| o.bytes)
            .or_else(|| self.untracked_live.remove(&key))
    }

    /// (device, live bytes, peak live bytes) of each device that allocated, by device.
    pub fn by_device(&self) -> Vec<(u32, u64, u64)> {
        let mut v = self.devs.clone();
        v.sort_by_key(|d| d.0);
        v
    }

    /// The live allocations, oldest first, for a new file; `restack` gives each its stack id in
    /// that file (None: written without one). Their kept records take the new ids.
    pub fn carry<E>(
        &mut self,
        mut restack: impl FnMut(StackId) -> Result<Option<StackId>, E>,
    ) -> Result<Vec<Mem>, E> {
        let mut v: Vec<&mut Mem> = self.by_addr.values_mut().collect();
        v.sort_by_key(|m| (m.ts, m.dev, m.addr));
        let mut out = Vec::with_capacity(v.len());
        for m in v {
            m.stack = match m.stack {
                Some(id) => restack(id)?,
                None => None,
            };
            let mut c = m.clone();
            c.carried = true;
            out.push(c);
        }
        Ok(out)
    }

    /// The stacks of the allocations kept.
    pub fn stacks(&self) -> impl Iterator<Item = StackId> + '_ {
        self.by_addr.values().filter_map(|m| m.stack)
    }

    /// Allocations kept.
    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocating_functions_by_name() {
        for f in [
            "cudaMalloc",
            "cudaMallocAsync_ptsz",
            "cudaMallocManaged",
            "cudaMallocHost",
            "cudaHostAlloc",
            "cuMemAlloc",
            "cuMemAllocAsync",
            "cuMemHostAlloc",
            "cuMemCreate",
        ] {
            assert!(is_alloc_fn(f), "{f}");
        }
        for f in [
            "cudaFree",
            "cuMemFree",
            "cuMemMap",
            "cudaFreeAsync",
            "cudaMemcpy",
        ] {
            assert!(!is_alloc_fn(f), "{f}");
        }
    }

    #[test]
    fn memory_kind_by_function() {
        assert_eq!(kind_of("cudaMallocHost"), MemoryKind::Pinned);
        assert_eq!(kind_of("cuMemHostAlloc"), MemoryKind::Pinned);
        assert_eq!(kind_of("cudaMallocManaged"), MemoryKind::Managed);
        assert_eq!(kind_of("cudaMallocAsync_ptsz"), MemoryKind::Device);
        assert_eq!(kind_of("cuMemCreate"), MemoryKind::Device);
    }

    #[test]
    fn facts_of_large_and_failed_allocations_only() {
        let mib = 1 << 20;
        assert_eq!(facts(Some(mib - 1), 0, mib), None);
        assert!(facts(Some(mib), 0, mib).is_some_and(|f| !f.failed));
        // A failure is recorded whatever its size, and even when the size is not known.
        assert!(facts(Some(16), OUT_OF_MEMORY, mib).is_some_and(|f| f.failed));
        assert!(facts(None, OUT_OF_MEMORY, mib).is_some_and(|f| f.failed));
        // Another error (an invalid value) is not an out-of-memory.
        assert_eq!(facts(Some(1 << 40), 1, mib), None);
        assert_eq!(facts(None, 0, 0), None);
    }

    #[test]
    fn the_join_attaches_once_and_forgets_the_oldest() {
        let mut j = StackJoin::default();
        j.insert(7, StackId(3), 42, 10, 20);
        let mut m = Mem {
            corr: 7,
            ..Mem::default()
        };
        j.attach(&mut m);
        assert_eq!((m.stack, m.tid), (Some(StackId(3)), Some(42)));
        let mut again = Mem {
            corr: 7,
            ..Mem::default()
        };
        j.attach(&mut again);
        assert_eq!(again.stack, None);
        // A free never takes an allocation's stack.
        j.insert(8, StackId(4), 42, 10, 20);
        let mut free = Mem {
            corr: 8,
            op: MemOp::Free,
            ..Mem::default()
        };
        j.attach(&mut free);
        assert_eq!(free.stack, None);
        for c in 100..100 + MAX_PENDING_STACKS as u32 {
            j.insert(c, StackId(1), 1, 10, 20);
        }
        assert_eq!(j.len(), MAX_PENDING_STACKS);
        let mut old = Mem {
            corr: 8,
            ..Mem::default()
        };
        j.attach(&mut old);
        assert_eq!(old.stack, None, "the oldest stack was forgotten");
    }

    #[test]
    fn a_record_of_another_correlation_id_joins_the_call_it_happened_in() {
        let mut j = StackJoin::default();
        j.insert(10, StackId(1), 7, 1_000, 2_000);
        j.insert(11, StackId(2), 7, 3_000, 4_000);
        let mut m = Mem {
            corr: 99,
            ts: 3_500,
            ..Mem::default()
        };
        j.attach(&mut m);
        assert_eq!(m.stack, Some(StackId(2)));
        let mut outside = Mem {
            corr: 98,
            ts: 2_500,
            ..Mem::default()
        };
        j.attach(&mut outside);
        assert_eq!(outside.stack, None);
        assert_eq!(j.len(), 1);
    }

    #[test]
    fn free_memory_from_the_last_sample() {
        let mut f = DeviceFree::default();
        assert_eq!(f.get(0), None);
        f.observe(&Telemetry {
            dev: 0,
            mem_used: Some(70 << 30),
            mem_total: Some(80 << 30),
            ..Telemetry::default()
        });
        f.observe(&Telemetry {
            dev: 0,
            mem_used: Some(79 << 30),
            mem_total: Some(80 << 30),
            ..Telemetry::default()
        });
        assert_eq!(f.get(0), Some(1 << 30));
        assert_eq!(f.get(1), None);
    }

    fn rec(op: MemOp, ts: u64, addr: u64, bytes: u64, stack: Option<u32>) -> Mem {
        Mem {
            ts,
            op,
            addr,
            bytes,
            stack: stack.map(StackId),
            ..Mem::default()
        }
    }

    #[test]
    fn live_set_counts_live_and_peak_and_carries_what_is_held() {
        let mut l = LiveSet::default();
        l.note(&rec(MemOp::Alloc, 10, 0xa, 100, Some(1)));
        l.note(&rec(MemOp::Alloc, 20, 0xb, 50, None));
        l.note(&rec(MemOp::Free, 30, 0xa, 100, None));
        l.note(&rec(MemOp::Alloc, 40, 0xc, 30, Some(2)));
        // A free of an address never seen, and a carried record, change nothing.
        l.note(&rec(MemOp::Free, 50, 0xdead, 999, None));
        l.note(&Mem {
            carried: true,
            ..rec(MemOp::Alloc, 5, 0xe, 1 << 30, None)
        });
        assert_eq!(l.by_device(), vec![(0, 80, 150)]);
        let carried = l
            .carry(|id| Ok::<_, ()>(Some(StackId(id.0 + 100))))
            .unwrap();
        let got: Vec<_> = carried
            .iter()
            .map(|m| (m.ts, m.addr, m.stack.map(|s| s.0), m.carried))
            .collect();
        assert_eq!(got, vec![(20, 0xb, None, true), (40, 0xc, Some(102), true)]);
        // The kept records now name the new file's stacks: a second rotation maps those.
        let again = l.carry(|id| Ok::<_, ()>(Some(StackId(id.0 + 1)))).unwrap();
        assert_eq!(again[1].stack, Some(StackId(103)));
        // An address allocated again replaces the old allocation.
        l.note(&rec(MemOp::Alloc, 60, 0xb, 10, None));
        assert_eq!(l.by_device(), vec![(0, 40, 150)]);
    }

    #[test]
    fn live_set_is_bounded() {
        let mut l = LiveSet::default();
        for i in 0..(MAX_LIVE as u64 + 10) {
            l.note(&rec(MemOp::Alloc, i, 0x1000 + i, 1, None));
        }
        assert_eq!(l.len(), MAX_LIVE);
        assert_eq!(l.untracked, 10);
        // Untracked allocations still count while live, and their frees are seen.
        assert_eq!(l.by_device()[0].1, MAX_LIVE as u64 + 10);
        l.note(&rec(
            MemOp::Free,
            1 << 40,
            0x1000 + MAX_LIVE as u64 + 3,
            1,
            None,
        ));
        assert_eq!(l.by_device()[0].1, MAX_LIVE as u64 + 9);
    }
}
