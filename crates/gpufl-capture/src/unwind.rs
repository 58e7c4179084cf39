//! Fast native (CPU) call-stack capture for the recorder's hot path.
//!
//! [`capture_native`] runs inside CUPTI callbacks (e.g. at the entry of
//! `cudaStreamSynchronize`) and must cost about a microsecond for 20–40 frames. glibc's
//! `backtrace()` is an order of magnitude slower, so we drive framehop's DWARF-CFI unwinder
//! directly over the process's *own* memory: every loaded module's `.eh_frame_hdr` and
//! `.eh_frame` are already mapped, so framehop gets slices pointing straight into them.
//!
//! Design:
//! * A global `Snapshot` (module list + framehop unwinder) is built with `dl_iterate_phdr`
//!   and published behind a mutex together with a global generation counter. The mutex is only
//!   touched when the generation changes; `dl_iterate_phdr` (loader lock) is never called while
//!   holding it, so a thread inside `dlopen` can never deadlock against us.
//! * Each thread keeps, in a `thread_local!`, an `Arc` of the snapshot it uses, its own
//!   framehop rule cache (allocation-free policy) and its stack bounds. Steady-state captures
//!   take no lock and do not allocate.
//! * When a walk ends abnormally (or ends in no known module) and one of its frames lies
//!   outside every known module (e.g. a library was `dlopen`ed), the capture triggers a rescan — rate-limited to one per 100 ms
//!   process-wide, and skipped when the loader's add/remove counters did not change — and
//!   retries once.
//! * Modules without `PT_GNU_EH_FRAME` are still registered (so their PCs count as known);
//!   framehop unwinds through them with its frame-pointer fallback rule.
//!
//! Caveat: after `dlclose` the snapshot may point at unmapped unwind data until the next
//! rescan; call [`invalidate_modules`] after unloading libraries.

use std::ops::Range;

/// Upper bound of frames captured.
pub const MAX_NATIVE_FRAMES: usize = 128;

/// Capture the calling thread's stack as raw return addresses.
///
/// `out[0]` is the *return address of `capture_native` itself*, i.e. the address of the
/// instruction following the `call` inside the function that called `capture_native`.
/// `out[1..]` are the return addresses of the enclosing frames, outermost last. Every entry is
/// therefore a return address: symbolize `addr - 1`.
///
/// `skip` entries are dropped from the innermost end (`skip = 1` drops the caller's frame).
/// Returns the number of entries written (at most `out.len()`).
///
/// Never allocates after the thread's first call (the first call per thread and module-set
/// changes may allocate), never panics, only reads the current thread's stack between the
/// current stack pointer and the stack end reported by `pthread_getattr_np` (cached per
/// thread) plus the modules' mapped unwind tables, and takes no lock other threads hold in
/// normal operation. Returns 0 on other platforms, when re-entered on the same thread (e.g.
/// from a signal handler), when thread-local storage is already destroyed, or when running on
/// a stack other than the thread's main stack.
#[inline(never)]
pub fn capture_native(out: &mut [u64], skip: usize) -> usize {
    capture_here(out, skip, Bound::NONE).0
}

/// Limits on one walk of [`capture_native_bounded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Stop walking once this many nanoseconds have passed since the walk began (0: no limit).
    /// The clock is read before every frame, so a walk overruns by at most one frame's work.
    pub time_ns: u64,
    /// Never rebuild the module list on this thread: when a walk meets an address outside every
    /// known module, ask for a rebuild ([`service`], run by the recorder's writer thread) and
    /// return what was walked. A rebuild reads every loaded module (milliseconds in a big
    /// process), which the hot path of a launch cannot afford.
    pub defer_rescan: bool,
}

impl Bound {
    /// No limit: walk to the end of the stack, rebuild the module list inline when needed.
    pub const NONE: Bound = Bound {
        time_ns: 0,
        defer_rescan: false,
    };
}

/// [`capture_native`] within `bound`. Returns the entries written and whether the walk was cut
/// short by the bound (time spent, or a rescan deferred) rather than reaching the stack's end.
#[inline(never)]
pub fn capture_native_bounded(out: &mut [u64], skip: usize, bound: Bound) -> (usize, bool) {
    capture_here(out, skip, bound)
}

/// rip, rsp and rbp of the frame of the (non-inlined) function this is inlined into.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[inline(always)]
fn registers_here() -> (u64, u64, u64) {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads rip/rsp/rbp into general-purpose output registers; touches no memory and
    // does not move the stack pointer.
    unsafe {
        core::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (pc, sp, bp)
}

/// The walk from the frame of the (non-inlined) public function this is inlined into.
#[inline(always)]
fn capture_here(out: &mut [u64], skip: usize, bound: Bound) -> (usize, bool) {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        let (pc, sp, bp) = registers_here();
        // `black_box` keeps the call from becoming a tail call: the frame described by
        // (pc, sp) must stay intact while we walk it.
        core::hint::black_box(imp::capture_from(pc, sp, bp, out, skip, bound))
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = (out, skip, bound);
        (0, false)
    }
}

/// Set up the calling thread's unwinding state now (its stack bounds, rule cache), so its first
/// capture does not pay for it: on a process's main thread `pthread_getattr_np` parses
/// `/proc/self/maps`, milliseconds in a large process. Called where the recorder starts (the
/// thread making the first CUDA call, usually the main one).
pub fn prepare_thread() {
    imp::prepare_thread();
}

/// Build the module list now if none exists yet (so that no capture on the hot path pays for the
/// first build), and carry out a rebuild that a bounded walk asked for. Called at the recorder's
/// start and from its writer thread.
pub fn service() {
    imp::service();
}

/// Force a rescan of loaded modules (call after `dlopen`/`dlclose`). Also done automatically,
/// rate-limited, when a walk meets a PC outside every known module.
pub fn invalidate_modules() {
    imp::invalidate();
}

/// For tests/diagnostics: the module (path, start..end of its executable segments) containing
/// `addr`, if known. Rescans once if the loader's module set changed since the last scan.
pub fn module_of(addr: u64) -> Option<(String, Range<u64>)> {
    imp::module_of(addr)
}

/// Slots of stack copies ([`copy_stack`]), and the bytes each holds at most.
pub const COPY_SLOTS: usize = 16;
pub const COPY_BYTES: usize = 16 << 10;

/// Copy the calling thread's stack (its registers and up to [`COPY_BYTES`] above its stack
/// pointer) into a free slot, for [`walk_copy`] to unwind later on another thread: a walk's first
/// steps through cold unwind tables can take tens of µs (page faults that wait on the process's
/// memory-map lock), which a synchronization's capture should not pay on the application's
/// thread. ~1 µs: one pass over hot stack memory. None when every slot is taken (the caller walks
/// now) or the thread's stack bounds are unknown. The slot is the caller's until [`walk_copy`] or
/// [`release_copy`].
#[inline(never)]
pub fn copy_stack() -> Option<usize> {
    imp::copy_stack()
}

/// Unwind the copy in `slot` (see [`copy_stack`]) into `out` as [`capture_native_bounded`] would
/// have at the copy's point (`out[0]` the return address into the function that called
/// [`copy_stack`]), and free the slot. Returns the frames written and whether the walk stopped
/// before the stack's end (the copy ended, or a step failed).
pub fn walk_copy(slot: usize, out: &mut [u64]) -> (usize, bool) {
    imp::walk_copy(slot, out)
}

/// Free a slot without walking it (its sample was dropped).
pub fn release_copy(slot: usize) {
    imp::release_copy(slot)
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod imp {
    pub(super) fn prepare_thread() {}
    pub(super) fn invalidate() {}
    pub(super) fn service() {}
    pub(super) fn module_of(_addr: u64) -> Option<(String, std::ops::Range<u64>)> {
        None
    }
    pub(super) fn copy_stack() -> Option<usize> {
        None
    }
    pub(super) fn walk_copy(_slot: usize, _out: &mut [u64]) -> (usize, bool) {
        (0, true)
    }
    pub(super) fn release_copy(_slot: usize) {}
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use super::Bound;
    use std::cell::RefCell;
    use std::ffi::{c_int, c_void, CStr};
    use std::ops::{Deref, Range};
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard};

    use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
    use framehop::{ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder};

    /// Minimum interval between two automatic (unknown-PC triggered) rescans.
    const RESCAN_INTERVAL_NS: u64 = 100_000_000;
    /// Hard cap on unwinding steps, whatever `skip` is.
    const MAX_STEPS: usize = 4096;

    /// A byte range of mapped module memory, handed to framehop without copying.
    #[derive(Clone, Copy)]
    struct MemSlice {
        ptr: NonNull<u8>,
        len: usize,
    }

    // SAFETY: a MemSlice only points at read-only, mapped unwind tables of a loaded module;
    // sharing read access between threads is sound.
    unsafe impl Send for MemSlice {}
    // SAFETY: see above; the memory is never written through a MemSlice.
    unsafe impl Sync for MemSlice {}

    impl MemSlice {
        fn new(r: &Range<u64>) -> Option<Self> {
            let len = usize::try_from(r.end.checked_sub(r.start)?).ok()?;
            Some(Self {
                ptr: NonNull::new(r.start as *mut u8)?,
                len,
            })
        }
    }

    impl Default for MemSlice {
        fn default() -> Self {
            Self {
                ptr: NonNull::dangling(),
                len: 0,
            }
        }
    }

    impl Deref for MemSlice {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            // SAFETY: ptr..ptr+len lies inside a PT_LOAD segment (or PT_GNU_EH_FRAME) of a
            // module that was loaded when the snapshot was built; these mappings are readable
            // and immutable while the module stays loaded (see the dlclose caveat).
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }
    }

    type Unw = UnwinderX86_64<MemSlice, MustNotAllocateDuringUnwind>;
    type RuleCache = CacheX86_64<MustNotAllocateDuringUnwind>;

    struct ModInfo {
        path: String,
        range: Range<u64>,
        /// (.eh_frame_hdr, .eh_frame…) read by the unwinder, prefaulted by [`service`].
        eh: Option<(Range<u64>, Range<u64>)>,
    }

    /// An immutable view of the loaded modules, shared by all threads.
    struct Snapshot {
        unwinder: Unw,
        /// Sorted by start address.
        modules: Vec<ModInfo>,
        /// dl_iterate_phdr's (dlpi_adds, dlpi_subs) at scan time.
        counters: (u64, u64),
        generation: u64,
    }

    impl Snapshot {
        fn find(&self, addr: u64) -> Option<&ModInfo> {
            let i = self.modules.partition_point(|m| m.range.start <= addr);
            let m = self.modules.get(i.checked_sub(1)?)?;
            (addr < m.range.end).then_some(m)
        }
    }

    /// The unwinder's process-wide state (the module's one static): the published module list,
    /// the stack-copy slots and the writer's bookkeeping of rebuilds and prefaulting.
    struct Unwind {
        /// Generation of the published module list (threads compare theirs with it).
        generation: AtomicU64,
        /// The published module list.
        current: Mutex<Option<Arc<Snapshot>>>,
        /// Last automatic rebuild by a walk, ns.
        last_auto_scan_ns: AtomicU64,
        /// The preallocated stack copies ([`copy_stack`]).
        copies: [CopySlot; super::COPY_SLOTS],
        /// The copy slots' pages were touched ([`prefault_copies`]).
        copies_prefaulted: std::sync::atomic::AtomicBool,
        /// A rebuild of the module list asked for by a walk that could not do it itself.
        rescan_wanted: std::sync::atomic::AtomicBool,
        /// Last time [`service`] compared the loader's counters with the module list's, ns.
        last_service_check_ns: AtomicU64,
        /// Modules whose unwind tables [`prefault`] already brought in, by text start.
        prefaulted: Mutex<Vec<u64>>,
        /// The snapshot generation [`prefault`] last went through (it only has work after a
        /// rebuild).
        prefaulted_generation: AtomicU64,
    }

    static UNWIND: Unwind = Unwind {
        generation: AtomicU64::new(0),
        current: Mutex::new(None),
        last_auto_scan_ns: AtomicU64::new(0),
        copies: [const {
            CopySlot {
                busy: std::sync::atomic::AtomicBool::new(false),
                regs: [const { AtomicU64::new(0) }; 3],
                words: AtomicU64::new(0),
                data: std::cell::UnsafeCell::new([0; super::COPY_BYTES / 8]),
            }
        }; super::COPY_SLOTS],
        copies_prefaulted: std::sync::atomic::AtomicBool::new(false),
        rescan_wanted: std::sync::atomic::AtomicBool::new(false),
        last_service_check_ns: AtomicU64::new(0),
        prefaulted: Mutex::new(Vec::new()),
        prefaulted_generation: AtomicU64::new(0),
    };

    fn lock_current() -> MutexGuard<'static, Option<Arc<Snapshot>>> {
        UNWIND.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    struct ThreadState {
        snap: Arc<Snapshot>,
        cache: RuleCache,
        stack_lo: u64,
        stack_hi: u64,
    }

    thread_local! {
        static STATE: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
    }

    impl ThreadState {
        fn new() -> Option<Self> {
            let (stack_lo, stack_hi) = stack_bounds()?;
            Some(Self {
                snap: current(),
                cache: RuleCache::new_in(),
                stack_lo,
                stack_hi,
            })
        }

        /// Switch to the newest published snapshot if ours is outdated (slow path).
        fn refresh(&mut self) {
            if self.snap.generation != UNWIND.generation.load(Ordering::Acquire) {
                self.snap = current();
                // Fresh cache: framehop's u16 module generations could wrap around.
                self.cache = RuleCache::new_in();
            }
        }
    }

    fn stack_bounds() -> Option<(u64, u64)> {
        // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after;
        // the out-pointers are valid locals.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            (rc == 0 && size > 0).then(|| (addr as u64, addr as u64 + size as u64))
        }
    }

    /// One stack copy: registers at the copy, its length in words, the words. `busy` is the
    /// slot's lock: taken (Acquire) by the one thread that copies into it, released (Release) by
    /// the one that walks it or gives it back, so `data` is only ever touched by its holder.
    struct CopySlot {
        busy: std::sync::atomic::AtomicBool,
        regs: [AtomicU64; 3],
        words: AtomicU64,
        data: std::cell::UnsafeCell<[u64; super::COPY_BYTES / 8]>,
    }

    // SAFETY: `data` is accessed only by the thread holding `busy` (see CopySlot).
    unsafe impl Sync for CopySlot {}

    const COPY_WORDS: usize = super::COPY_BYTES / 8;

    /// Run `f` on this thread's unwinding state (made on first use), never unwinding into the
    /// caller (catch_unwind is free on the non-panicking path; whatever framehop/gimli do on
    /// malformed input stays here, away from C callers such as CUPTI). None when the state is in
    /// use on this thread (a signal handler re-entered a walk), cannot be made (stack bounds
    /// unknown), is gone (thread exiting), or `f` panicked.
    fn with_state<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            STATE
                .try_with(|cell| {
                    let mut guard = cell.try_borrow_mut().ok()?;
                    if guard.is_none() {
                        *guard = ThreadState::new();
                    }
                    guard.as_mut().map(f)
                })
                .ok()
                .flatten()
        }))
        .ok()
        .flatten()
    }

    #[inline(always)]
    pub(super) fn copy_stack() -> Option<usize> {
        use super::registers_here;
        let i = UNWIND.copies.iter().position(|c| {
            c.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        let slot = &UNWIND.copies[i];
        let (pc, sp, bp) = registers_here();
        let Some(hi) = with_state(|st| {
            (st.stack_lo..st.stack_hi)
                .contains(&sp)
                .then_some(st.stack_hi)
        })
        .flatten() else {
            slot.busy.store(false, Ordering::Release);
            return None;
        };
        let words = (((hi - sp) / 8) as usize).min(COPY_WORDS);
        // SAFETY: [sp, sp + 8 * words) lies within this thread's mapped stack (bounds checked
        // above); the slot's data is ours while we hold `busy`; the two do not overlap (the
        // slots are a static, not on any stack).
        unsafe {
            std::ptr::copy_nonoverlapping(sp as *const u64, slot.data.get().cast::<u64>(), words);
        }
        for (r, v) in slot.regs.iter().zip([pc, sp, bp]) {
            r.store(v, Ordering::Relaxed);
        }
        slot.words.store(words as u64, Ordering::Release);
        // The frame described by (pc, sp) is this one: it must not be a tail call.
        core::hint::black_box(Some(i))
    }

    /// Touch every page of the copy slots once (here: at the recorder's start and on its writer
    /// thread), so that a capture's copy never pays the first write to a fresh page (device run
    /// of 2026-11-26: 4-60 µs per cold slot in a Trainer, where page faults wait on the memory-map
    /// lock).
    fn prefault_copies() {
        if UNWIND.copies_prefaulted.swap(true, Ordering::Relaxed) {
            return;
        }
        for c in &UNWIND.copies {
            // A slot in use is being written by its capture (its pages are being touched anyway).
            if c.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // A word per 4 KiB page, written (a read would map the shared zero page).
            let base = c.data.get().cast::<u64>();
            for k in (0..COPY_WORDS).step_by(512) {
                // SAFETY: within the slot's data, which we hold.
                unsafe { std::ptr::write_volatile(base.add(k), 0) };
            }
            c.busy.store(false, Ordering::Release);
        }
    }

    pub(super) fn release_copy(slot: usize) {
        if let Some(c) = UNWIND.copies.get(slot) {
            c.busy.store(false, Ordering::Release);
        }
    }

    pub(super) fn walk_copy(slot: usize, out: &mut [u64]) -> (usize, bool) {
        let Some(c) = UNWIND.copies.get(slot) else {
            return (0, true);
        };
        let words = (c.words.load(Ordering::Acquire) as usize).min(COPY_WORDS);
        let [pc, sp, bp] = [0, 1, 2].map(|k| c.regs[k].load(Ordering::Relaxed));
        // SAFETY: the slot is ours (handed over with the sample that named it) until released
        // below; its first `words` were written by the copy, published by the Release store of
        // `words` that the Acquire load above reads.
        let copy: Vec<u64> = unsafe { (&*c.data.get())[..words].to_vec() };
        release_copy(slot);
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            if addr & 7 != 0 || addr < sp {
                return Err(());
            }
            copy.get(((addr - sp) / 8) as usize).copied().ok_or(())
        };
        with_state(|st| {
            st.refresh();
            let (n, _, end) = walk_with(st, (pc, sp, bp), out, 0, None, &mut read_stack);
            (n, end != WalkEnd::Complete)
        })
        .unwrap_or((0, true))
    }

    pub(super) fn prepare_thread() {
        let _ = with_state(|_| ());
    }

    pub(super) fn capture_from(
        pc: u64,
        sp: u64,
        bp: u64,
        out: &mut [u64],
        skip: usize,
        bound: Bound,
    ) -> (usize, bool) {
        with_state(|st| capture_with(st, pc, sp, bp, out, skip, bound)).unwrap_or((0, false))
    }

    fn capture_with(
        st: &mut ThreadState,
        pc: u64,
        sp: u64,
        bp: u64,
        out: &mut [u64],
        skip: usize,
        bound: Bound,
    ) -> (usize, bool) {
        if sp < st.stack_lo || sp >= st.stack_hi {
            return (0, false); // alternate signal stack, fiber, ...: bounds unknown
        }
        let deadline = (bound.time_ns > 0).then(|| mono_fine_ns() + bound.time_ns);
        let mut n = 0;
        let mut cut = false;
        for attempt in 0..2 {
            st.refresh();
            let (count, last, end) = walk(st, pc, sp, bp, out, skip, deadline);
            n = count;
            if end == WalkEnd::OutOfTime {
                cut = true;
                break;
            }
            // A walk that ends normally in a known module is trusted. Otherwise (error,
            // garbage address, or an end-of-stack found by the frame-pointer fallback in an
            // unknown module, e.g. a fresh dlopen) look for frames outside all known modules,
            // and if a rescan finds a changed module set, retry once with the new snapshot.
            let unknown = |a: u64| st.snap.find(a).is_none();
            let suspicious = || unknown(last) || out[..n].iter().any(|&a| unknown(a));
            if (end == WalkEnd::Complete && !unknown(last)) || attempt == 1 {
                break;
            }
            if bound.defer_rescan {
                if suspicious() {
                    UNWIND.rescan_wanted.store(true, Ordering::Relaxed);
                    cut = true;
                }
                break;
            }
            if !maybe_auto_rescan(&st.snap, suspicious) {
                break;
            }
        }
        (n, cut)
    }

    pub(super) fn service() {
        let snap = current();
        let now = mono_ns().max(1);
        let periodic = now.saturating_sub(UNWIND.last_service_check_ns.load(Ordering::Relaxed))
            >= RESCAN_INTERVAL_NS;
        let mut snap = snap;
        if UNWIND.rescan_wanted.swap(false, Ordering::Relaxed) || periodic {
            UNWIND.last_service_check_ns.store(now, Ordering::Relaxed);
            if loader_counters() != snap.counters {
                snap = publish(build_snapshot(), false);
            }
        }
        prefault(&snap);
        prefault_copies();
    }

    /// Bring every module's unwind tables into this process's page tables, once per module, on
    /// the calling (writer) thread: a walk on the hot path then meets no page fault in them. In a
    /// PyTorch process they are tens of MB that a cold walk would fault in a few pages per frame
    /// (a binary search over `.eh_frame_hdr`), each fault some microseconds, and far more under a
    /// sandboxing kernel such as gVisor.
    fn prefault(snap: &Snapshot) {
        if UNWIND.prefaulted_generation.load(Ordering::Relaxed) == snap.generation {
            return;
        }
        let Ok(mut done) = UNWIND.prefaulted.try_lock() else {
            return;
        };
        UNWIND
            .prefaulted_generation
            .store(snap.generation, Ordering::Relaxed);
        for m in &snap.modules {
            if done.contains(&m.range.start) {
                continue;
            }
            done.push(m.range.start);
            if let Some((hdr, frame)) = &m.eh {
                populate(hdr);
                // SAFETY: the module's mapped .eh_frame_hdr (populated above).
                if let Some(end) = unsafe { eh_frame_end(hdr, frame) } {
                    populate(&(frame.start..end));
                }
            }
        }
    }

    /// End of `.eh_frame` from the `.eh_frame_hdr` search table (the usual encodings: count
    /// `udata4`, table `datarel | sdata4`): past the FDE at the highest address. `frame` runs to
    /// the end of its segment, which may hold much more than unwind tables.
    ///
    /// # Safety
    /// `hdr` is a mapped `.eh_frame_hdr`.
    unsafe fn eh_frame_end(hdr: &Range<u64>, frame: &Range<u64>) -> Option<u64> {
        let len = hdr.end.checked_sub(hdr.start)?;
        if len < 12 {
            return None;
        }
        let p = hdr.start as *const u8;
        // SAFETY: at least 12 bytes are mapped (len >= 12); unaligned reads.
        let (ptr_enc, count_enc, table_enc) = unsafe { (*p.add(1), *p.add(2), *p.add(3)) };
        let ptr_size = match ptr_enc & 0x0f {
            0x03 | 0x0b => 4,
            0x00 | 0x04 | 0x0c => 8,
            _ => return None,
        };
        if count_enc != 0x03 || table_enc != 0x3b || len < 4 + ptr_size + 4 {
            return None;
        }
        // SAFETY: within the header (checked above).
        let count = unsafe { p.add(4 + ptr_size as usize).cast::<u32>().read_unaligned() } as u64;
        let table = 4 + ptr_size + 4;
        if table + count.checked_mul(8)? > len {
            return None;
        }
        let mut highest: Option<u64> = None;
        for i in 0..count {
            // SAFETY: entry i lies inside the header (checked above).
            let off = unsafe {
                p.add((table + i * 8 + 4) as usize)
                    .cast::<i32>()
                    .read_unaligned()
            };
            let fde = hdr.start.wrapping_add(off as i64 as u64);
            if frame.contains(&fde) && highest.is_none_or(|h| fde > h) {
                highest = Some(fde);
            }
        }
        let fde = highest?;
        if fde + 4 > frame.end {
            return None;
        }
        // SAFETY: the FDE's length word lies inside `frame` (checked).
        let flen = unsafe { (fde as *const u32).read_unaligned() } as u64;
        Some((fde + 4 + flen).min(frame.end))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn eh_frame_ends_inside_its_segment_past_every_fde() {
            let mut scan = Scan::default();
            iterate(&mut scan);
            let mut found = 0;
            for m in &scan.modules {
                let Some((hdr, frame)) = &m.eh else { continue };
                // SAFETY: a loaded module's mapped .eh_frame_hdr.
                if let Some(end) = unsafe { eh_frame_end(hdr, frame) } {
                    assert!(end > frame.start && end <= frame.end, "{}", m.name);
                    found += 1;
                }
            }
            assert!(found > 0, "no module with a standard .eh_frame_hdr table");
            service();
            assert!(UNWIND.prefaulted.lock().unwrap().len() >= found);
        }
    }

    /// Fault in the pages of a mapped range: `MADV_POPULATE_READ` where the kernel has it, else a
    /// read of one byte per page.
    fn populate(r: &Range<u64>) {
        const PAGE: u64 = 4096;
        const MADV_POPULATE_READ: c_int = 22;
        let start = r.start & !(PAGE - 1);
        let Some(len) = r.end.checked_sub(start) else {
            return;
        };
        if len == 0 || len > (1 << 31) {
            return;
        }
        // SAFETY: advice on a range of a loaded module's mapping; the kernel checks the range and
        // fails (ENOMEM, EINVAL) rather than faulting.
        let rc = unsafe { libc::madvise(start as *mut c_void, len as usize, MADV_POPULATE_READ) };
        if rc == 0 {
            return;
        }
        let mut a = start.max(r.start);
        while a < r.end {
            // SAFETY: inside the loaded module's unwind tables, mapped for as long as the module
            // is loaded (the unwinder reads the same memory).
            unsafe { std::ptr::read_volatile(a as *const u8) };
            a = (a | (PAGE - 1)) + 1;
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum WalkEnd {
        /// End of the stack, or `out` full.
        Complete,
        /// An error or an implausible address.
        Broken,
        /// The time bound was reached.
        OutOfTime,
    }

    /// Walk the stack. Returns the frame count, the last good frame address, and how the walk
    /// ended. With a `deadline` (mono_fine_ns), the clock is read before every step after the first
    /// (a vDSO read, ~20 ns; one step through a cold page can take tens of µs).
    fn walk(
        st: &mut ThreadState,
        pc: u64,
        sp: u64,
        bp: u64,
        out: &mut [u64],
        skip: usize,
        deadline: Option<u64>,
    ) -> (usize, u64, WalkEnd) {
        let stack_hi = st.stack_hi;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            if addr & 7 == 0 && addr >= sp && addr < stack_hi - 7 {
                // SAFETY: addr is 8-byte aligned and within [sp, stack_end) of the current
                // thread's stack, which is mapped; frames above `sp` belong to our callers
                // and are not modified while we walk them.
                Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
            } else {
                Err(())
            }
        };
        walk_with(st, (pc, sp, bp), out, skip, deadline, &mut read_stack)
    }

    /// [`walk`] with the stack's memory read through `read_stack`.
    fn walk_with(
        st: &mut ThreadState,
        (pc, sp, bp): (u64, u64, u64),
        out: &mut [u64],
        skip: usize,
        deadline: Option<u64>,
        read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> (usize, u64, WalkEnd) {
        let regs = UnwindRegsX86_64::new(pc, sp, bp);
        let mut iter = st
            .snap
            .unwinder
            .iter_frames(pc, regs, &mut st.cache, read_stack);
        let (mut n, mut step, mut last) = (0usize, 0usize, pc);
        while n < out.len() && step < MAX_STEPS {
            if step > 0 && deadline.is_some_and(|d| mono_fine_ns() >= d) {
                return (n, last, WalkEnd::OutOfTime);
            }
            match iter.next() {
                Ok(Some(frame)) => {
                    let addr = frame.address();
                    // Frame 0 is the PC inside capture_native: not reported.
                    if step > 0 {
                        if !(0x1000..0x0000_8000_0000_0000).contains(&addr) {
                            return (n, last, WalkEnd::Broken);
                        }
                        if step > skip {
                            out[n] = addr;
                            n += 1;
                        }
                    }
                    last = addr;
                    step += 1;
                }
                Ok(None) => return (n, last, WalkEnd::Complete),
                Err(_) => return (n, last, WalkEnd::Broken),
            }
        }
        (n, last, WalkEnd::Complete)
    }

    /// `clock` (CLOCK_MONOTONIC for a walk's bound, CLOCK_MONOTONIC_COARSE for rescan intervals;
    /// both served by the vDSO), ns.
    fn clock_ns(clock: libc::clockid_t) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: valid out-pointer.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        (ts.tv_sec as u64).wrapping_mul(1_000_000_000) + ts.tv_nsec as u64
    }

    fn mono_ns() -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC_COARSE)
    }

    fn mono_fine_ns() -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC)
    }

    /// Rate-limited rescan, attempted only if `suspicious()` (evaluated after the cheap time
    /// check). Returns true if a new snapshot was published.
    fn maybe_auto_rescan(snap: &Snapshot, suspicious: impl FnOnce() -> bool) -> bool {
        let last = UNWIND.last_auto_scan_ns.load(Ordering::Relaxed);
        let now = mono_ns().max(1);
        if (last != 0 && now.saturating_sub(last) < RESCAN_INTERVAL_NS) || !suspicious() {
            return false;
        }
        let claimed = UNWIND.last_auto_scan_ns.compare_exchange(
            last,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if claimed.is_err() || loader_counters() == snap.counters {
            return false; // another thread claimed this slot, or nothing was (un)loaded
        }
        publish(build_snapshot(), false).generation != snap.generation
    }

    pub(super) fn invalidate() {
        publish(build_snapshot(), true);
    }

    pub(super) fn module_of(addr: u64) -> Option<(String, Range<u64>)> {
        let mut snap = current();
        if snap.find(addr).is_none() && loader_counters() != snap.counters {
            snap = publish(build_snapshot(), false);
        }
        snap.find(addr).map(|m| (m.path.clone(), m.range.clone()))
    }

    /// The newest published snapshot, building the first one if needed.
    fn current() -> Arc<Snapshot> {
        if let Some(s) = lock_current().as_ref() {
            return s.clone();
        }
        publish(build_snapshot(), false) // built without holding `UNWIND.current`
    }

    /// Publish `snap` unless an equal (and not `force`) or newer one is already current.
    fn publish(mut snap: Snapshot, force: bool) -> Arc<Snapshot> {
        let mut guard = lock_current();
        if let Some(cur) = guard.as_ref() {
            let (a, s) = snap.counters;
            let stale = a < cur.counters.0 || s < cur.counters.1;
            if stale || (!force && snap.counters == cur.counters) {
                return cur.clone();
            }
        }
        let generation = UNWIND.generation.load(Ordering::Relaxed) + 1;
        snap.generation = generation;
        let arc = Arc::new(snap);
        *guard = Some(arc.clone());
        UNWIND.generation.store(generation, Ordering::Release);
        arc
    }

    /// Raw facts about one loaded object, all addresses absolute (AVMA).
    struct RawModule {
        name: String,
        bias: u64,
        text: Range<u64>,
        /// (.eh_frame_hdr, .eh_frame up to the end of its PT_LOAD segment)
        eh: Option<(Range<u64>, Range<u64>)>,
    }

    #[derive(Default)]
    struct Scan {
        counters_only: bool,
        counters: (u64, u64),
        modules: Vec<RawModule>,
    }

    fn iterate(scan: &mut Scan) {
        // SAFETY: the callback only dereferences `data` as the `&mut Scan` we pass here, which
        // outlives the call.
        unsafe { crate::dl::iterate_phdr(phdr_callback, scan as *mut Scan as *mut c_void) };
    }

    /// (dlpi_adds, dlpi_subs): changes whenever an object is loaded or unloaded.
    fn loader_counters() -> (u64, u64) {
        let mut scan = Scan {
            counters_only: true,
            ..Scan::default()
        };
        iterate(&mut scan);
        scan.counters
    }

    unsafe extern "C" fn phdr_callback(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut Scan` passed by `iterate`; `info` is valid for the
        // duration of the callback (dl_iterate_phdr contract).
        let (scan, info) = unsafe { (&mut *(data as *mut Scan), &*info) };
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
            scan.counters = (info.dlpi_adds, info.dlpi_subs);
        }
        if scan.counters_only {
            return 1; // the counters are the same in every callback: stop now
        }
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers of a loaded object.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let bias = info.dlpi_addr;
        let seg = |p: &libc::Elf64_Phdr, len: u64| {
            let start = bias.wrapping_add(p.p_vaddr);
            start..start.wrapping_add(len)
        };
        let mut text: Option<Range<u64>> = None;
        let mut hdr = None;
        for p in phdrs {
            if p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0 && p.p_memsz > 0 {
                let r = seg(p, p.p_memsz);
                text = Some(match text {
                    None => r,
                    Some(t) => t.start.min(r.start)..t.end.max(r.end),
                });
            } else if p.p_type == libc::PT_GNU_EH_FRAME {
                hdr = Some(seg(p, p.p_memsz));
            }
        }
        let Some(text) = text else { return 0 };
        let eh = hdr.and_then(|hdr| {
            // SAFETY: hdr is the mapped PT_GNU_EH_FRAME segment of this object.
            let start = unsafe { eh_frame_address(&hdr, bias) }?;
            let load = phdrs
                .iter()
                .map(|p| seg(p, p.p_filesz))
                .zip(phdrs)
                .find(|(r, p)| {
                    p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_R != 0 && r.contains(&start)
                })?;
            Some((hdr, start..load.0.end))
        });
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        scan.modules.push(RawModule {
            name,
            bias,
            text,
            eh,
        });
        0
    }

    /// Decode `.eh_frame_hdr`'s `eh_frame_ptr` field (absolute address of `.eh_frame`).
    ///
    /// # Safety
    /// `hdr` must be a readable mapping.
    unsafe fn eh_frame_address(hdr: &Range<u64>, bias: u64) -> Option<u64> {
        let (p, len) = (hdr.start as *const u8, hdr.end.checked_sub(hdr.start)?);
        if p.is_null() || len < 4 {
            return None;
        }
        // SAFETY: the first 4 bytes are readable (len >= 4).
        let (version, enc, field) = unsafe { (*p, *p.add(1), p.add(4)) };
        if version != 1 || enc & 0x80 != 0 {
            return None; // unknown version, or DW_EH_PE_indirect
        }
        // SAFETY: each arm reads only as many bytes as `len - 4` guarantees (unaligned reads);
        // signed formats sign-extend.
        let value = unsafe {
            match (enc & 0x0f, len - 4) {
                (0x02, 2..) => u64::from(field.cast::<u16>().read_unaligned()),
                (0x0a, 2..) => field.cast::<i16>().read_unaligned() as u64,
                (0x03, 4..) => u64::from(field.cast::<u32>().read_unaligned()),
                (0x0b, 4..) => field.cast::<i32>().read_unaligned() as u64,
                (0x00 | 0x04 | 0x0c, 8..) => field.cast::<u64>().read_unaligned(),
                _ => return None,
            }
        };
        let field = hdr.start + 4;
        let base = match enc & 0x70 {
            0x00 => bias,      // absptr: a stated (link-time) address
            0x10 => field,     // pcrel
            0x30 => hdr.start, // datarel: relative to .eh_frame_hdr
            _ => return None,
        };
        Some(base.wrapping_add(value))
    }

    fn build_snapshot() -> Snapshot {
        let mut scan = Scan::default();
        iterate(&mut scan);
        let exe = std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "[main]".to_owned());
        let mut unwinder = Unw::new();
        let mut modules = Vec::with_capacity(scan.modules.len());
        for (i, m) in scan.modules.into_iter().enumerate() {
            let path = match (m.name.is_empty(), i) {
                (false, _) => m.name,
                (true, 0) => exe.clone(),
                (true, _) => "[unnamed]".to_owned(),
            };
            let svma = |r: &Range<u64>| r.start.wrapping_sub(m.bias)..r.end.wrapping_sub(m.bias);
            let mut info = ExplicitModuleSectionInfo::<MemSlice> {
                base_svma: 0,
                text_svma: Some(svma(&m.text)),
                ..Default::default()
            };
            if let Some((hdr, frame)) = &m.eh {
                if let (Some(h), Some(f)) = (MemSlice::new(hdr), MemSlice::new(frame)) {
                    info.eh_frame_hdr_svma = Some(svma(hdr));
                    info.eh_frame_hdr = Some(h);
                    info.eh_frame_svma = Some(svma(frame));
                    info.eh_frame = Some(f);
                }
            }
            unwinder.add_module(Module::new(path.clone(), m.text.clone(), m.bias, info));
            modules.push(ModInfo {
                path,
                range: m.text,
                eh: m.eh.clone(),
            });
        }
        modules.sort_by_key(|m| m.range.start);
        Snapshot {
            unwinder,
            modules,
            counters: scan.counters,
            generation: 0,
        }
    }
}
