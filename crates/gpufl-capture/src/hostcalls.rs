//! `hostcall` records: CUDA calls other than launches, copies, memsets and synchronizations
//! that held their thread at least `GPUFL_HOSTCALL_US` (default [`DEFAULT_HOSTCALL_US`] µs):
//! allocations and frees (`cudaFree` waits for the device), pinned-host allocations, module and
//! library loads, context, stream, event and graph lifecycle, limits.
//!
//! **Which calls.** The callback ids are read from CUPTI's function names at start
//! ([`HostcallTable::build`], as `sites.rs` finds launches), by the list of [`is_hostcall`]:
//! - allocation and free: `cudaMalloc*` (`Pitch`, `3D`, `Array`, `Host`, `Managed`, `Async`,
//!   `FromPoolAsync`, `MipmappedArray`), `cudaFree*`, `cudaHostAlloc`, `cudaHostRegister`,
//!   `cudaHostUnregister`, `cudaMemPoolTrimTo`; `cuMemAlloc*`, `cuMemFree*`, `cuMemHostAlloc`,
//!   `cuMemHostRegister`, `cuMemHostUnregister`, `cuMemCreate`, `cuMemRelease`, `cuMemMap`,
//!   `cuMemUnmap`, `cuMemSetAccess`, `cuMemAddressReserve`, `cuMemAddressFree`, `cuMemPoolTrimTo`;
//! - module and library loading: `cuModuleLoad*`, `cuModuleUnload`, `cuLibraryLoad*`,
//!   `cuLibraryUnload`, `cudaLibraryLoad*`, `cudaLibraryUnload`, `cuLinkComplete`, and the
//!   lookups that load a module under lazy loading: `cudaFuncGetAttributes`,
//!   `cuModuleGetFunction`, `cuLibraryGetKernel`, `cudaLibraryGetKernel`;
//! - context, stream, event and graph lifecycle: `cuCtxCreate*`, `cuCtxDestroy*`,
//!   `cuDevicePrimaryCtxRetain` / `Release` / `Reset`, `cudaStreamCreate*`, `cudaStreamDestroy`,
//!   `cuStreamCreate*`, `cuStreamDestroy*`, `cudaEventCreate*`, `cudaEventDestroy`,
//!   `cuEventCreate`, `cuEventDestroy*`, `cudaGraphInstantiate*` / `cuGraphInstantiate*`,
//!   `…GraphExecUpdate*`, `…GraphUpload*`, `…GraphDestroy`, `…GraphExecDestroy`;
//! - limits and configuration: `cudaDeviceSetLimit`, `cuCtxSetLimit`,
//!   `cudaDeviceSetCacheConfig`, `cudaDeviceReset`, `cudaSetDevice` (its first call creates the
//!   context), `cudaInitDevice`.
//!
//! Left out: every id that has a record of its own — a launch, graph launch, copy or memset
//! ([`crate::sites::classify`]: every `cudaMemset*` / `cuMemset*` is a call site, so no memset
//! is a hostcall) and every synchronization ([`crate::cbids::is_sync`]).
//!
//! **Hot path.** Entry: when the call is the thread's outermost ([`crate::callmark`]: a driver
//! call inside a runtime call is the same call), a thread-local entry timestamp. Exit: when the
//! call lasted at least the threshold, the stack (a synchronization's capture, within a
//! per-thread time budget: [`crate::sites::TimeBudget`]), the size asked for (allocation calls
//! whose parameters give it, [`size_in_params`]), the return code and the context go on the
//! samples' queue; the writer writes the `hostcall` record. No lock, no allocation.
//!
//! **Cost guard.** A function of the list called often and never slow is pure cost (a lookup
//! made at every launch, an event created per step): the writer counts each id's short calls and
//! turns the callback of an id off for the rest of the session when it saw more than
//! [`MUTE_RATE`] short calls a second over a [`MUTE_WINDOW`] ([`MutePolicy`]; a notice names it).

use crate::cupti::{self, Cupti};
use crate::sites::TimeBudget;
use crate::stack::{self, HostcallFacts, Sample};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::options::DEFAULT_HOSTCALL_US;

/// Callback ids above this are not classified (CUPTI's tables end well below).
pub const MAX_CBID: usize = 1200;

/// Whether the function (its name without the version suffix, e.g. `cudaMallocAsync_ptsz`) is on
/// the hostcall list; ids that have records of their own are taken out by [`HostcallTable`].
pub fn is_hostcall(name: &str) -> bool {
    let base = name.strip_suffix("_ptsz").unwrap_or(name);
    const PREFIXES: &[&str] = &[
        // allocation and free
        "cudaMalloc",
        "cudaFree",
        "cuMemAlloc",
        "cuMemFree",
        "cuMemHostRegister",
        // modules and libraries
        "cuModuleLoad",
        "cuLibraryLoad",
        "cudaLibraryLoad",
        // contexts, streams, events, graphs
        "cuCtxCreate",
        "cuCtxDestroy",
        "cudaStreamCreate",
        "cuStreamCreate",
        "cuStreamDestroy",
        "cudaEventCreate",
        "cuEventDestroy",
        "cudaGraphInstantiate",
        "cuGraphInstantiate",
        "cudaGraphExecUpdate",
        "cuGraphExecUpdate",
        "cudaGraphUpload",
        "cuGraphUpload",
    ];
    const EXACT: &[&str] = &[
        "cudaHostAlloc",
        "cudaHostRegister",
        "cudaHostUnregister",
        "cudaMemPoolTrimTo",
        "cuMemHostAlloc",
        "cuMemHostUnregister",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemPoolTrimTo",
        "cuModuleUnload",
        "cuLibraryUnload",
        "cudaLibraryUnload",
        "cuLinkComplete",
        "cudaFuncGetAttributes",
        "cuModuleGetFunction",
        "cuLibraryGetKernel",
        "cudaLibraryGetKernel",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxReset",
        "cudaStreamDestroy",
        "cuEventCreate",
        "cudaEventDestroy",
        "cudaGraphDestroy",
        "cuGraphDestroy",
        "cudaGraphExecDestroy",
        "cuGraphExecDestroy",
        "cudaDeviceSetLimit",
        "cuCtxSetLimit",
        "cudaDeviceSetCacheConfig",
        "cudaDeviceReset",
        "cudaSetDevice",
        "cudaInitDevice",
    ];
    EXACT.contains(&base) || PREFIXES.iter().any(|p| base.starts_with(p))
}

/// Whether the function, by its name as CUPTI gives it (version suffix included: the parameter
/// layout belongs to that version), takes the size asked for as its second parameter, a `size_t`
/// at offset 8 of its parameter struct (CUPTI's `generated_cuda_runtime_api_meta.h` /
/// `generated_cuda_meta.h`, as cudarc's bindings give them: `cudaMalloc_v3020_params { void
/// **devPtr; size_t size; }`, `cuMemAlloc_v2_params { CUdeviceptr *dptr; size_t bytesize; }`, …;
/// checked by a test against those bindings). The first driver versions (`cuMemAlloc`,
/// `cuMemAllocHost` of CUDA 2, an `unsigned int` size) are not on it.
pub fn size_in_params(raw_name: &str) -> bool {
    const SIZED: &[&str] = &[
        "cudaMalloc_v3020",
        "cudaMallocHost_v3020",
        "cudaHostAlloc_v3020",
        "cudaHostRegister_v4000",
        "cudaMallocManaged_v6000",
        "cudaMallocAsync_v11020",
        "cudaMallocAsync_ptsz_v11020",
        "cudaMallocFromPoolAsync_v11020",
        "cudaMallocFromPoolAsync_ptsz_v11020",
        "cuMemAlloc_v2",
        "cuMemAllocHost_v2",
        "cuMemHostAlloc",
        "cuMemAllocManaged",
        "cuMemCreate",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemHostRegister_v2",
    ];
    SIZED.contains(&raw_name)
}

/// Flags of a callback id in the table.
const HOSTCALL: u8 = 1;
const SIZED: u8 = 2;
/// An allocating function ([`crate::memcalls::is_alloc_fn`]): its call-site stack and its
/// failure go with `mem` records.
const MEM: u8 = 4;

/// Callback ids of the hostcall list per domain, from CUPTI's names.
pub struct HostcallTable {
    runtime: Box<[u8]>,
    driver: Box<[u8]>,
}

impl HostcallTable {
    /// The table of this CUPTI's functions.
    pub fn build(c: &Cupti) -> HostcallTable {
        let names = [cupti::DOMAIN_RUNTIME, cupti::DOMAIN_DRIVER]
            .into_iter()
            .flat_map(|domain| {
                (0..=MAX_CBID as u32)
                    .filter_map(move |id| c.callback_name_raw(domain, id).map(|n| (domain, id, n)))
            });
        HostcallTable::from_names(names)
    }

    /// The table of functions given as (domain, callback id, name as CUPTI gives it).
    pub fn from_names(names: impl IntoIterator<Item = (u32, u32, String)>) -> HostcallTable {
        let mut runtime = vec![0u8; MAX_CBID + 1];
        let mut driver = vec![0u8; MAX_CBID + 1];
        for (domain, cbid, raw) in names {
            let t = match domain {
                cupti::DOMAIN_RUNTIME => &mut runtime,
                cupti::DOMAIN_DRIVER => &mut driver,
                _ => continue,
            };
            let Some(slot) = t.get_mut(cbid as usize) else {
                continue;
            };
            let name = cupti::strip_version_suffix(&raw);
            let own_record =
                crate::sites::classify(name).is_some() || crate::cbids::is_sync(domain, cbid);
            if is_hostcall(name) && !own_record {
                *slot = HOSTCALL
                    | if size_in_params(&raw) { SIZED } else { 0 }
                    | if crate::memcalls::is_alloc_fn(name) {
                        MEM
                    } else {
                        0
                    };
            }
        }
        HostcallTable {
            runtime: runtime.into_boxed_slice(),
            driver: driver.into_boxed_slice(),
        }
    }

    /// The id's flags (0: not a hostcall).
    #[inline]
    fn flags(&self, domain: u32, cbid: u32) -> u8 {
        let t = match domain {
            cupti::DOMAIN_RUNTIME => &self.runtime,
            cupti::DOMAIN_DRIVER => &self.driver,
            _ => return 0,
        };
        t.get(cbid as usize).copied().unwrap_or(0)
    }

    /// Whether (domain, cbid) is a hostcall.
    #[inline]
    pub fn contains(&self, domain: u32, cbid: u32) -> bool {
        self.flags(domain, cbid) & HOSTCALL != 0
    }

    /// Whether the call's parameters give the size asked for.
    pub fn sized(&self, domain: u32, cbid: u32) -> bool {
        self.flags(domain, cbid) & SIZED != 0
    }

    /// Whether (domain, cbid) is an allocating function (`mem` records' stacks and failures).
    #[inline]
    pub fn is_mem(&self, domain: u32, cbid: u32) -> bool {
        self.flags(domain, cbid) & MEM != 0
    }

    /// Every (domain, cbid) of the table.
    pub fn ids(&self) -> Vec<(u32, u32)> {
        self.ids_with(HOSTCALL)
    }

    /// The ids whose callbacks are to be on: every id with hostcall records on, else the
    /// allocating ones with `mem` records on.
    pub fn enabled_ids(&self, hostcalls: bool, mem: bool) -> Vec<(u32, u32)> {
        match (hostcalls, mem) {
            (true, _) => self.ids_with(HOSTCALL),
            (false, true) => self.ids_with(MEM),
            (false, false) => Vec::new(),
        }
    }

    fn ids_with(&self, flag: u8) -> Vec<(u32, u32)> {
        let f = |domain: u32, t: &[u8]| {
            t.iter()
                .enumerate()
                .filter(|(_, f)| **f & flag != 0)
                .map(move |(i, _)| (domain, i as u32))
                .collect::<Vec<_>>()
        };
        let mut v = f(cupti::DOMAIN_RUNTIME, &self.runtime);
        v.extend(f(cupti::DOMAIN_DRIVER, &self.driver));
        v
    }
}

/// What the hostcall callbacks count, shared with the writer (the module's one static).
struct Shared {
    /// Calls lost because the sample queue was full, and calls recorded without a stack because
    /// the thread's capture budget was spent.
    dropped: AtomicU64,
    unstacked: AtomicU64,
    /// Calls under the threshold per (domain, cbid): index `(domain == driver) * (MAX_CBID + 1) +
    /// cbid` ([`MutePolicy`]).
    short: [AtomicU32; 2 * (MAX_CBID + 1)],
}

static SHARED: Shared = Shared {
    dropped: AtomicU64::new(0),
    unstacked: AtomicU64::new(0),
    short: [const { AtomicU32::new(0) }; 2 * (MAX_CBID + 1)],
};

fn short_index(domain: u32, cbid: u32) -> Option<usize> {
    let base = match domain {
        cupti::DOMAIN_RUNTIME => 0,
        cupti::DOMAIN_DRIVER => MAX_CBID + 1,
        _ => return None,
    };
    ((cbid as usize) <= MAX_CBID).then_some(base + cbid as usize)
}

/// The outermost hostcall a thread is inside: its entry time (trace clock, 0: none) and which.
#[derive(Clone, Copy)]
struct Open {
    start: u64,
    domain: u32,
    cbid: u32,
}

thread_local! {
    static OPEN: Cell<Open> = const { Cell::new(Open { start: 0, domain: 0, cbid: 0 }) };
    static BUDGET: Cell<TimeBudget> = const { Cell::new(TimeBudget::new()) };
}

/// What the callback needs from the recorder.
pub struct HostcallCall<'a> {
    pub cupti: &'a Cupti,
    pub table: &'a HostcallTable,
    pub domain: u32,
    pub cbid: u32,
    /// Entry (true) or exit.
    pub entry: bool,
    /// The call is the thread's outermost ([`crate::callmark::enter`] / `exit`).
    pub outermost: bool,
    /// Stacks are captured, and whether the process runs Python.
    pub stacks: bool,
    pub python: bool,
    /// The threshold, ns (`u64::MAX`: hostcall records off).
    pub threshold_ns: u64,
    /// `mem` records are on: allocations of at least `mem_stack_bytes` get their stack, failed
    /// allocations are recorded ([`crate::memcalls`]).
    pub mem: bool,
    pub mem_stack_bytes: u64,
}

/// API entry or exit of a hostcall.
///
/// # Safety
/// `data` points at the CUpti_CallbackData of this callback.
pub unsafe fn on_api(call: HostcallCall, data: *const c_void) {
    use std::mem::offset_of;
    type D = cupti::sys::CUpti_CallbackData;
    if !call.outermost {
        return;
    }
    if call.entry {
        let start = call.cupti.timestamp();
        let _ = OPEN.try_with(|o| {
            o.set(Open {
                start,
                domain: call.domain,
                cbid: call.cbid,
            })
        });
        return;
    }
    let Ok(open) = OPEN.try_with(|o| {
        o.replace(Open {
            start: 0,
            domain: 0,
            cbid: 0,
        })
    }) else {
        return;
    };
    if open.start == 0 || (open.domain, open.cbid) != (call.domain, call.cbid) {
        return;
    }
    let end = call.cupti.timestamp();
    let slow = end.saturating_sub(open.start) >= call.threshold_ns;
    let mem = call.mem && call.table.is_mem(call.domain, call.cbid);
    if !slow && !mem {
        if let Some(i) = short_index(call.domain, call.cbid) {
            SHARED.short[i].fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    // SAFETY (all `cb_field` reads): CUpti_CallbackData field offsets and types.
    let ret: *const u32 = unsafe { cupti::cb_field(data, offset_of!(D, functionReturnValue)) };
    // SAFETY: CUPTI's pointer to the call's return value, valid at exit.
    let ret = if ret.is_null() {
        0
    } else {
        unsafe { ret.read_unaligned() }
    };
    let bytes = if call.table.sized(call.domain, call.cbid) {
        let params: *const u8 = unsafe { cupti::cb_field(data, offset_of!(D, functionParams)) };
        // SAFETY: the function's parameter struct has a size_t at offset 8 (size_in_params).
        (!params.is_null()).then(|| unsafe { params.add(8).cast::<u64>().read_unaligned() })
    } else {
        None
    };
    let mem = mem
        .then(|| crate::memcalls::facts(bytes, ret, call.mem_stack_bytes))
        .flatten();
    if !slow && mem.is_none() {
        return;
    }
    let mut s = Sample::empty();
    s.corr = unsafe { crate::detach::callback_corr(data) };
    s.ctx = unsafe { cupti::cb_field(data, offset_of!(D, contextUid)) };
    s.domain = call.domain;
    s.cbid = call.cbid;
    s.tid = crate::procinfo::gettid();
    s.ts = open.start;
    s.end = end;
    s.hostcall = slow.then_some(HostcallFacts { bytes, ret });
    s.mem = mem.map(|mut m| {
        if m.failed {
            let ctx: *mut c_void = unsafe { cupti::cb_field(data, offset_of!(D, context)) };
            // SAFETY: the context handle this API call received.
            m.dev = unsafe { call.cupti.device_id(ctx) };
        }
        m
    });
    // A failed allocation always gets its stack (the post-mortem's line); others within the
    // thread's capture budget.
    let must = s.mem.is_some_and(|m| m.failed);
    if call.stacks {
        let afford = must
            || BUDGET
                .try_with(|b| {
                    let mut budget = b.get();
                    let ok = budget.afford(end, crate::sites::budget_ppm());
                    b.set(budget);
                    ok
                })
                .unwrap_or(false);
        if afford {
            s.has_stack = true;
            let cost = stack::capture_for(&mut s, call.python, stack::Purpose::Hostcall);
            let _ = BUDGET.try_with(|b| {
                let mut budget = b.get();
                budget.spend(cost);
                b.set(budget);
            });
        } else {
            SHARED.unstacked.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !stack::try_push(s) {
        SHARED.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Hostcalls lost since the last call (the sample queue was full).
pub fn take_dropped() -> u64 {
    SHARED.dropped.swap(0, Ordering::Relaxed)
}

/// How long the writer looks at each id's short calls before deciding, and the rate of short
/// calls (per second) above which an id's callback is turned off.
pub const MUTE_WINDOW: Duration = Duration::from_secs(2);
pub const MUTE_RATE: u64 = 1000;

/// The writer's side of the cost guard (see the module's doc): every [`MUTE_WINDOW`], the ids
/// whose short calls came faster than [`MUTE_RATE`] a second are turned off for good.
pub struct MutePolicy {
    since: Instant,
    /// Ids turned off: (domain, cbid, short calls per second seen).
    muted: Vec<(u32, u32, u64)>,
}

impl MutePolicy {
    pub fn new(now: Instant) -> MutePolicy {
        MutePolicy {
            since: now,
            muted: Vec::new(),
        }
    }

    /// One turn: the ids to turn off now, from each id's short-call count since the last window
    /// (`take(domain, cbid)`, which resets it).
    pub fn step(
        &mut self,
        now: Instant,
        ids: &[(u32, u32)],
        mut take: impl FnMut(u32, u32) -> u64,
    ) -> Vec<(u32, u32)> {
        let span = now.saturating_duration_since(self.since);
        if span < MUTE_WINDOW {
            return Vec::new();
        }
        self.since = now;
        let mut off = Vec::new();
        for &(domain, cbid) in ids {
            if self.muted.iter().any(|&(d, c, _)| (d, c) == (domain, cbid)) {
                continue;
            }
            let n = take(domain, cbid);
            let per_s = (n as f64 / span.as_secs_f64()) as u64;
            if per_s > MUTE_RATE {
                self.muted.push((domain, cbid, per_s));
                off.push((domain, cbid));
            }
        }
        off
    }

    /// [`Self::step`] over the shared counters, applied (writer thread).
    pub fn tick(&mut self, now: Instant) {
        let Some(table) = crate::collection::hostcall_table() else {
            return;
        };
        if now.saturating_duration_since(self.since) < MUTE_WINDOW {
            return;
        }
        let mut ids = table.ids();
        // Allocating functions keep their callbacks while `mem` records are on: their stacks
        // and failures are the memory findings' evidence.
        if crate::options::knobs().mem_records {
            ids.retain(|&(d, c)| !table.is_mem(d, c));
        }
        let off = self.step(now, &ids, |d, c| {
            short_index(d, c).map_or(0, |i| u64::from(SHARED.short[i].swap(0, Ordering::Relaxed)))
        });
        for (domain, cbid) in off {
            crate::collection::mute_hostcall(domain, cbid);
        }
    }

    /// The ids turned off: (domain, cbid, short calls per second).
    pub fn muted(&self) -> &[(u32, u32, u64)] {
        &self.muted
    }
}

/// The closing notice: hostcalls recorded (`written`), without a stack for the budget, lost
/// (`dropped`), and the ids turned off (`name` names an id). None when hostcall records are off.
pub fn summary(
    threshold_us: u32,
    written: u64,
    dropped: u64,
    muted: &[(u32, u32, u64)],
    mut name: impl FnMut(u32, u32) -> String,
) -> Option<String> {
    if threshold_us == 0 {
        return None;
    }
    let unstacked = SHARED.unstacked.load(Ordering::Relaxed);
    let mut s = format!(
        "hostcalls: {written} CUDA call(s) of at least {threshold_us} µs recorded (hostcall records)"
    );
    if unstacked > 0 {
        s += &format!(
            ", {unstacked} of them without a stack (the thread's capture budget was spent)"
        );
    }
    if dropped > 0 {
        s += &format!(", {dropped} lost (queue full)");
    }
    if !muted.is_empty() {
        let list: Vec<String> = muted
            .iter()
            .map(|&(d, c, r)| format!("{} ({r}/s)", name(d, c)))
            .collect();
        s += &format!(
            "; callbacks turned off for functions called often and never that slow: {}",
            list.join(", ")
        );
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cupti::{DOMAIN_DRIVER as DRV, DOMAIN_RUNTIME as RT};

    /// CUDA 13's function names: (domain, cbid, name as CUPTI gives it).
    fn real_names() -> Vec<(u32, u32, String)> {
        include_str!("testdata/cupti_names.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let mut it = l.split_whitespace();
                let domain = match it.next().unwrap() {
                    "runtime" => RT,
                    _ => DRV,
                };
                let cbid = it.next().unwrap().parse().unwrap();
                (domain, cbid, it.next().unwrap().to_string())
            })
            .collect()
    }

    fn names_in(t: &HostcallTable) -> Vec<String> {
        let names = real_names();
        let mut v: Vec<String> = t
            .ids()
            .into_iter()
            .map(|(d, c)| {
                let raw = &names.iter().find(|n| n.0 == d && n.1 == c).unwrap().2;
                cupti::strip_version_suffix(raw).to_string()
            })
            .collect();
        v.sort();
        v
    }

    /// With hostcall records off and `mem` records on, only the allocating functions'
    /// callbacks are turned on; the frees and the rest of the list stay off.
    #[test]
    fn allocating_functions_alone_when_hostcalls_are_off() {
        let t = HostcallTable::from_names(real_names());
        let names = real_names();
        let name = |(d, c): (u32, u32)| {
            let raw = &names.iter().find(|n| n.0 == d && n.1 == c).unwrap().2;
            cupti::strip_version_suffix(raw).to_string()
        };
        let mem: Vec<String> = t.enabled_ids(false, true).into_iter().map(name).collect();
        for want in [
            "cudaMalloc",
            "cudaMallocAsync",
            "cudaMallocManaged",
            "cuMemAlloc",
            "cuMemCreate",
        ] {
            assert!(mem.iter().any(|n| n == want), "{want} missing from {mem:?}");
        }
        assert!(
            mem.iter().all(|n| crate::memcalls::is_alloc_fn(n)),
            "{mem:?}"
        );
        assert!(!mem.iter().any(|n| n == "cudaFree" || n == "cuModuleLoad"));
        assert_eq!(t.enabled_ids(true, true).len(), t.ids().len());
        assert!(t.enabled_ids(false, false).is_empty());
    }

    #[test]
    fn the_list_against_cudas_function_names() {
        let t = HostcallTable::from_names(real_names());
        let got = names_in(&t);
        for want in [
            "cudaMalloc",
            "cudaFree",
            "cudaMallocHost",
            "cudaFreeHost",
            "cudaHostAlloc",
            "cudaHostRegister",
            "cudaHostUnregister",
            "cudaMallocManaged",
            "cudaMallocPitch",
            "cudaMalloc3D",
            "cudaMallocArray",
            "cudaFreeArray",
            "cudaMallocAsync",
            "cudaMallocAsync_ptsz",
            "cudaFreeAsync",
            "cudaMemPoolTrimTo",
            "cuMemAlloc",
            "cuMemAllocHost",
            "cuMemAllocManaged",
            "cuMemAllocAsync",
            "cuMemFree",
            "cuMemFreeHost",
            "cuMemHostAlloc",
            "cuMemHostRegister",
            "cuMemHostUnregister",
            "cuMemCreate",
            "cuMemRelease",
            "cuMemMap",
            "cuMemUnmap",
            "cuMemSetAccess",
            "cuMemAddressReserve",
            "cuMemAddressFree",
            "cuMemPoolTrimTo",
            "cuModuleLoad",
            "cuModuleLoadData",
            "cuModuleLoadDataEx",
            "cuModuleLoadFatBinary",
            "cuModuleUnload",
            "cuLibraryLoadData",
            "cuLibraryLoadFromFile",
            "cuLibraryUnload",
            "cudaLibraryLoadData",
            "cuLinkComplete",
            "cudaFuncGetAttributes",
            "cuModuleGetFunction",
            "cuLibraryGetKernel",
            "cuCtxCreate",
            "cuCtxDestroy",
            "cuDevicePrimaryCtxRetain",
            "cuDevicePrimaryCtxRelease",
            "cuDevicePrimaryCtxReset",
            "cudaStreamCreate",
            "cudaStreamCreateWithFlags",
            "cudaStreamCreateWithPriority",
            "cudaStreamDestroy",
            "cuStreamCreate",
            "cuStreamCreateWithPriority",
            "cuStreamDestroy",
            "cudaEventCreate",
            "cudaEventCreateWithFlags",
            "cudaEventDestroy",
            "cuEventCreate",
            "cuEventDestroy",
            "cudaGraphInstantiate",
            "cudaGraphInstantiateWithFlags",
            "cudaGraphInstantiateWithParams",
            "cuGraphInstantiate",
            "cuGraphInstantiateWithParams",
            "cudaGraphExecUpdate",
            "cuGraphExecUpdate",
            "cudaGraphUpload",
            "cuGraphUpload",
            "cudaGraphDestroy",
            "cuGraphDestroy",
            "cudaGraphExecDestroy",
            "cuGraphExecDestroy",
            "cudaDeviceSetLimit",
            "cuCtxSetLimit",
            "cudaDeviceSetCacheConfig",
            "cudaDeviceReset",
            "cudaSetDevice",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} missing from {got:?}");
        }
        // Look-alikes that are not on the list, and ids with records of their own.
        for not in [
            "cudaMemcpy",
            "cudaMemcpyAsync",
            "cudaMemset",
            "cudaMemsetAsync",
            "cuMemsetD8",
            "cuMemcpyHtoD",
            "cudaLaunchKernel",
            "cuLaunchKernel",
            "cudaGraphLaunch",
            "cudaStreamSynchronize",
            "cudaDeviceSynchronize",
            "cuCtxSynchronize",
            "cudaEventSynchronize",
            "cudaStreamWaitEvent",
            "cudaEventRecord",
            "cudaHostGetDevicePointer",
            "cudaHostGetFlags",
            "cuMemHostGetDevicePointer",
            "cuMemMapArrayAsync",
            "cudaGraphDestroyNode",
            "cuGraphDestroyNode",
            "cudaGraphExecKernelNodeSetParams",
            "cudaGraphExecGetFlags",
            "cudaSetDeviceFlags",
            "cudaGetDevice",
            "cudaStreamQuery",
            "cuModuleGetGlobal",
            "cuLibraryGetModule",
            "cuMemGetInfo",
            "cudaMemGetInfo",
            "cudaStreamBeginCapture",
            "cudaStreamEndCapture",
        ] {
            assert!(!got.iter().any(|g| g == not), "{not} is on the list");
        }
        // No hostcall id is a synchronization or a call site.
        for (d, c) in t.ids() {
            assert!(!crate::cbids::is_sync(d, c), "sync {d}/{c}");
        }
        assert!(
            got.len() > 100 && got.len() < 200,
            "{} functions",
            got.len()
        );
    }

    #[test]
    fn sizes_are_read_only_where_the_layout_was_checked() {
        let t = HostcallTable::from_names(real_names());
        let sized: Vec<String> = {
            let names = real_names();
            let mut v: Vec<String> = t
                .ids()
                .into_iter()
                .filter(|&(d, c)| t.sized(d, c))
                .map(|(d, c)| {
                    names
                        .iter()
                        .find(|n| n.0 == d && n.1 == c)
                        .unwrap()
                        .2
                        .clone()
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            sized.len(),
            19,
            "every versioned name of the size list exists in CUDA 13: {sized:?}"
        );
        // The CUDA 2 driver functions (an unsigned int size) are hostcalls without a size.
        let names = real_names();
        let id = |n: &str| names.iter().find(|x| x.2 == n).map(|x| (x.0, x.1)).unwrap();
        let (d, c) = id("cuMemAlloc");
        assert!(t.contains(d, c) && !t.sized(d, c));
        let (d, c) = id("cuMemAlloc_v2");
        assert!(t.contains(d, c) && t.sized(d, c));
        let (d, c) = id("cudaFree_v3020");
        assert!(t.contains(d, c) && !t.sized(d, c));
    }

    #[test]
    fn the_size_is_the_second_field_of_each_parameter_struct() {
        use crate::cupti::sys::*;
        use std::mem::offset_of;
        let offsets = [
            offset_of!(cudaMalloc_v3020_params_st, size),
            offset_of!(cudaMallocHost_v3020_params_st, size),
            offset_of!(cudaHostAlloc_v3020_params_st, size),
            offset_of!(cudaHostRegister_v4000_params_st, size),
            offset_of!(cudaMallocManaged_v6000_params_st, size),
            offset_of!(cudaMallocAsync_v11020_params_st, size),
            offset_of!(cudaMallocAsync_ptsz_v11020_params_st, size),
            offset_of!(cudaMallocFromPoolAsync_v11020_params_st, size),
            offset_of!(cudaMallocFromPoolAsync_ptsz_v11020_params_st, size),
            offset_of!(cuMemAlloc_v2_params_st, bytesize),
            offset_of!(cuMemAllocHost_v2_params_st, bytesize),
            offset_of!(cuMemHostAlloc_params_st, bytesize),
            offset_of!(cuMemAllocManaged_params_st, bytesize),
            offset_of!(cuMemCreate_params_st, size),
            offset_of!(cuMemAllocAsync_params_st, bytesize),
            offset_of!(cuMemAllocAsync_ptsz_params_st, bytesize),
            offset_of!(cuMemAllocFromPoolAsync_params_st, bytesize),
            offset_of!(cuMemAllocFromPoolAsync_ptsz_params_st, bytesize),
            offset_of!(cuMemHostRegister_v2_params_st, bytesize),
        ];
        assert!(offsets.iter().all(|&o| o == 8), "{offsets:?}");
        assert_eq!(std::mem::size_of::<usize>(), 8);
    }

    #[test]
    fn often_called_fast_functions_are_turned_off_once() {
        let t0 = Instant::now();
        let mut p = MutePolicy::new(t0);
        let ids = [(RT, 20), (DRV, 100)];
        let mut counts = std::collections::HashMap::from([((RT, 20), 100u64), ((DRV, 100), 9000)]);
        // Not a whole window yet: nothing is read.
        assert!(p
            .step(t0 + Duration::from_secs(1), &ids, |_, _| panic!())
            .is_empty());
        let mut take = |d, c| counts.insert((d, c), 0).unwrap_or(0);
        let off = p.step(t0 + MUTE_WINDOW, &ids, &mut take);
        assert_eq!(off, [(DRV, 100)], "4500/s over 2 s is muted, 50/s is not");
        assert_eq!(p.muted(), [(DRV, 100, 4500)]);
        // Counted again: not turned off twice.
        let off = p.step(t0 + MUTE_WINDOW * 2, &ids, |_, _| 1_000_000);
        assert_eq!(off, [(RT, 20)]);
        assert_eq!(p.muted().len(), 2);
    }

    #[test]
    fn the_summary_names_what_was_turned_off() {
        assert_eq!(summary(0, 0, 0, &[], |_, _| String::new()), None);
        let s = summary(20, 12, 3, &[(DRV, 100, 4500)], |_, c| format!("fn{c}")).unwrap();
        assert!(s.contains("12 CUDA call(s)") && s.contains("3 lost"), "{s}");
        assert!(s.starts_with("hostcalls: "), "{s}");
        assert!(s.contains("at least 20 µs"), "{s}");
        assert!(s.contains("fn100 (4500/s)"), "{s}");
    }
}
