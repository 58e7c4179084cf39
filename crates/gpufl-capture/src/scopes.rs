//! Named scopes: `gpufl_scope_push` / `gpufl_scope_pop` (C, C++ `gpufl::Scope`, Python
//! `gpufl.scope`) and NVTX ranges (`nvtx.rs`), recorded as `scope` records.
//!
//! Hot path (the application's thread): a thread-local stack of open scopes, a thread-local table
//! from name bytes to a process-wide name id (a name is copied once per thread, the first time the
//! thread uses it; that definition goes on an unbounded lock-free queue), one timestamp, and one
//! push of a small `Copy` event on a bounded lock-free queue (full: the event is counted as dropped,
//! the app never waits). No lock, no allocation in steady state.
//!
//! Writer side: [`drain`] turns events into `scope` records (interning each name in the trace).
//! When GPU capture cannot run (no CUPTI, no GPU), [`start_standalone`] runs a small writer thread
//! of its own, so `gpufl_init` + scopes + `gpufl_shutdown` still produce a session.

use crossbeam_queue::{ArrayQueue, SegQueue};
use gpufl_trace::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Capacity of the event queue between the hot path and the writer (drained every 100 ms).
pub const QUEUE_CAPACITY: usize = 1 << 16;
/// Deepest nesting tracked per thread; deeper pushes are counted and not recorded.
pub const MAX_DEPTH: usize = 256;

/// What an [`Event`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A scope opens on its thread.
    Push,
    /// The thread's innermost scope closes.
    Pop,
    /// A start/end range (NVTX id) starts; `name` is its name.
    RangeStart(u64),
    /// The range with this id ends (possibly on another thread).
    RangeEnd(u64),
}

/// One push, pop, range start or range end, as the hot path queues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub ts: u64,
    pub tid: u64,
    /// Process-wide name id (see `Scopes::names`); unused by a range end.
    pub name: u32,
    pub depth: u32,
    pub kind: Kind,
    pub source: ScopeSource,
}

/// Start/end ranges open at once that the writer pairs; more are counted and not recorded.
pub const MAX_OPEN_RANGES: usize = 1 << 14;

/// What the application's threads share with the writer (the module's one static): the queues,
/// the name ids and the counters, all lock-free; the writer's drain state and the scopes-only
/// session, off the hot path.
struct Scopes {
    /// On while a writer drains the queue.
    enabled: AtomicBool,
    /// The events (bounded; full: counted in `dropped`).
    events: OnceLock<ArrayQueue<Event>>,
    /// Name definitions (id, text), each queued before the first event that uses the id.
    names: SegQueue<(u32, Box<str>)>,
    next_name: AtomicU32,
    /// Events lost to a full queue, pops with nothing open, pushes deeper than [`MAX_DEPTH`].
    dropped: AtomicU64,
    unbalanced: AtomicU64,
    too_deep: AtomicU64,
    /// Range ends whose start was not seen, and range starts beyond [`MAX_OPEN_RANGES`].
    ranges_unpaired: AtomicU64,
    /// The recorder's writer thread's drain state ([`recorder_drain`]).
    drain: OnceLock<Mutex<Drain>>,
    /// The scopes-only session, if one runs.
    standalone: OnceLock<Standalone>,
}

static SCOPES: Scopes = Scopes {
    enabled: AtomicBool::new(false),
    events: OnceLock::new(),
    names: SegQueue::new(),
    next_name: AtomicU32::new(0),
    dropped: AtomicU64::new(0),
    unbalanced: AtomicU64::new(0),
    too_deep: AtomicU64::new(0),
    ranges_unpaired: AtomicU64::new(0),
    drain: OnceLock::new(),
    standalone: OnceLock::new(),
};

fn events() -> &'static ArrayQueue<Event> {
    SCOPES
        .events
        .get_or_init(|| ArrayQueue::new(QUEUE_CAPACITY))
}

/// Turn scope recording on or off (on while a writer drains the queue).
pub fn set_enabled(on: bool) {
    if on {
        let _ = events();
    }
    SCOPES.enabled.store(on, Ordering::SeqCst);
}

pub fn enabled() -> bool {
    SCOPES.enabled.load(Ordering::Relaxed)
}

struct ThreadState {
    tid: u64,
    /// Name bytes → process-wide id.
    names: HashMap<Box<[u8]>, u32>,
    /// Open scopes: (name id, source). Capacity reserved once.
    open: Vec<(u32, ScopeSource)>,
    /// Pushes beyond MAX_DEPTH not recorded; their pops are swallowed too.
    hidden: u32,
}

thread_local! {
    static STATE: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
}

fn with_state<R>(f: impl FnOnce(&mut ThreadState) -> R) -> Option<R> {
    STATE
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let st = s.get_or_insert_with(|| ThreadState {
                // SAFETY: gettid has no preconditions.
                tid: unsafe { libc::gettid() } as u64,
                names: HashMap::new(),
                open: Vec::with_capacity(16),
                hidden: 0,
            });
            Some(f(st))
        })
        .ok()
        .flatten()
}

fn enqueue(ev: Event) {
    if events().push(ev).is_err() {
        SCOPES.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Open a scope named `name` on this thread. O(1) in the number of scopes (hashes the name).
pub fn push(name: &[u8], source: ScopeSource) {
    if !enabled() {
        return;
    }
    let ts = crate::recorder::trace_clock();
    with_state(|st| {
        if st.open.len() >= MAX_DEPTH {
            st.hidden += 1;
            SCOPES.too_deep.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let id = st.name_id(name);
        let depth = st.open.len() as u32;
        st.open.push((id, source));
        enqueue(Event {
            ts,
            tid: st.tid,
            name: id,
            depth,
            kind: Kind::Push,
            source,
        });
    });
}

impl ThreadState {
    /// The process-wide id of `name`, defined (queued) the first time this thread uses it.
    fn name_id(&mut self, name: &[u8]) -> u32 {
        match self.names.get(name) {
            Some(&id) => id,
            None => {
                let id = SCOPES.next_name.fetch_add(1, Ordering::Relaxed);
                let text: Box<str> = String::from_utf8_lossy(name).into();
                SCOPES.names.push((id, text));
                self.names.insert(name.into(), id);
                id
            }
        }
    }
}

/// A start/end range (NVTX `nvtxRangeStart*`, id `range`) starts on this thread. The writer pairs
/// it with its [`range_end`], which may come from any thread.
pub fn range_start(range: u64, name: &[u8], source: ScopeSource) {
    if !enabled() {
        return;
    }
    let ts = crate::recorder::trace_clock();
    with_state(|st| {
        let id = st.name_id(name);
        enqueue(Event {
            ts,
            tid: st.tid,
            name: id,
            depth: 0,
            kind: Kind::RangeStart(range),
            source,
        });
    });
}

/// The range `range` ends on this thread.
pub fn range_end(range: u64, source: ScopeSource) {
    if !enabled() {
        return;
    }
    let ts = crate::recorder::trace_clock();
    with_state(|st| {
        enqueue(Event {
            ts,
            tid: st.tid,
            name: 0,
            depth: 0,
            kind: Kind::RangeEnd(range),
            source,
        });
    });
}

/// Close this thread's innermost scope. A pop with nothing open is counted (a warning at the end
/// of the session) and otherwise ignored.
pub fn pop(source: ScopeSource) {
    if !enabled() {
        return;
    }
    let ts = crate::recorder::trace_clock();
    with_state(|st| {
        if st.hidden > 0 {
            st.hidden -= 1;
            return;
        }
        let Some((id, opened_by)) = st.open.pop() else {
            SCOPES.unbalanced.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let _ = source;
        enqueue(Event {
            ts,
            tid: st.tid,
            name: id,
            depth: st.open.len() as u32,
            kind: Kind::Pop,
            source: opened_by,
        });
    });
}

/// A range started and not yet ended: (start, thread, name id, source).
type OpenRange = (u64, u64, u32, ScopeSource);

/// Writer-side state: process-wide name id → text, and the open start/end ranges.
#[derive(Default)]
pub struct Drain {
    names: HashMap<u32, Box<str>>,
    ranges: HashMap<u64, OpenRange>,
}

impl Drain {
    fn take_names(&mut self) {
        while let Some((id, text)) = SCOPES.names.pop() {
            self.names.insert(id, text);
        }
    }

    fn name<W: Write>(&mut self, w: &mut TraceWriter<W>, id: u32) -> Result<StrId, TraceError> {
        if !self.names.contains_key(&id) {
            // Its definition was queued before the event: it is visible now.
            self.take_names();
        }
        w.intern_str(self.names.get(&id).map_or("?", |s| s))
    }

    /// Write every queued event: pushes and pops as `scope` records; a range start is held until
    /// its end arrives, then written as one `range` record.
    pub fn drain<W: Write>(&mut self, w: &mut TraceWriter<W>) -> Result<usize, TraceError> {
        let mut n = 0;
        while let Some(ev) = events().pop() {
            let end = match ev.kind {
                Kind::Push => false,
                Kind::Pop => true,
                Kind::RangeStart(id) => {
                    if self.ranges.len() < MAX_OPEN_RANGES || self.ranges.contains_key(&id) {
                        self.ranges.insert(id, (ev.ts, ev.tid, ev.name, ev.source));
                    } else {
                        SCOPES.ranges_unpaired.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                Kind::RangeEnd(id) => {
                    let Some((start, tid, name, source)) = self.ranges.remove(&id) else {
                        SCOPES.ranges_unpaired.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let name = self.name(w, name)?;
                    w.write(&Record::Range(Range {
                        id,
                        name,
                        start,
                        end: ev.ts.max(start),
                        tid,
                        end_tid: (ev.tid != tid).then_some(ev.tid),
                        source,
                    }))?;
                    n += 1;
                    continue;
                }
            };
            let name = self.name(w, ev.name)?;
            w.write(&Record::Scope(Scope {
                ts: ev.ts,
                tid: ev.tid,
                name,
                depth: ev.depth,
                end,
                source: ev.source,
            }))?;
            n += 1;
        }
        Ok(n)
    }

    /// At the end of a session: drain, then record losses and unbalanced pops.
    pub fn finish<W: Write>(&mut self, w: &mut TraceWriter<W>) -> Result<(), TraceError> {
        self.drain(w)?;
        let lost = SCOPES.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            w.write(&Record::Dropped(Dropped {
                source: "scope_queue".into(),
                count: lost,
            }))?;
        }
        let unbalanced = SCOPES.unbalanced.swap(0, Ordering::Relaxed);
        if unbalanced > 0 {
            w.write(&Record::Notice(Notice {
                level: "warning".into(),
                message: format!(
                    "scopes: {unbalanced} pop(s) without an open scope on their thread were ignored"
                ),
            }))?;
        }
        let unpaired = SCOPES.ranges_unpaired.swap(0, Ordering::Relaxed);
        if unpaired > 0 {
            w.write(&Record::Notice(Notice {
                level: "warning".into(),
                message: format!(
                    "ranges: {unpaired} range end(s) without a recorded start (or starts beyond \
                     {MAX_OPEN_RANGES} open ranges) were ignored"
                ),
            }))?;
        }
        let deep = SCOPES.too_deep.swap(0, Ordering::Relaxed);
        if deep > 0 {
            w.write(&Record::Notice(Notice {
                level: "warning".into(),
                message: format!("scopes: {deep} push(es) deeper than {MAX_DEPTH} not recorded"),
            }))?;
        }
        Ok(())
    }
}

/// The recorder's writer thread keeps its drain state here (only that thread locks it).
pub fn recorder_drain() -> &'static Mutex<Drain> {
    SCOPES.drain.get_or_init(|| Mutex::new(Drain::default()))
}

/// The recorder's writer thread: write queued scope events.
pub fn drain_into(s: &mut crate::sink::Sink) -> Result<(), TraceError> {
    let mut d = recorder_drain().lock().unwrap_or_else(|e| e.into_inner());
    let n = d.drain(s.writer())?;
    if n > 0 {
        s.dirty = true;
        s.feed.add_scopes(n);
    }
    Ok(())
}

/// The recorder's writer thread, at stop: stop recording scopes, write the rest and the warnings.
pub fn finish_into(s: &mut crate::sink::Sink) -> Result<(), TraceError> {
    set_enabled(false);
    let mut d = recorder_drain().lock().unwrap_or_else(|e| e.into_inner());
    d.finish(s.writer())
}

// ---------------------------------------------------------------------------------------------
// Scopes-only session (GPU capture unavailable)
// ---------------------------------------------------------------------------------------------

/// A stop request: the end reason, and where to send the counts.
type StopMsg = (&'static str, Sender<Option<Counts>>);

struct Standalone {
    dir: PathBuf,
    pid: u32,
    stop: Mutex<Option<Sender<StopMsg>>>,
}

/// The session directory of a scopes-only session, if one runs.
pub fn standalone_dir() -> Option<&'static PathBuf> {
    SCOPES.standalone.get().map(|s| &s.dir)
}

/// Write a scopes-only session: `header` (whose capture status says why GPU capture is off) into
/// `path`, then scope records until [`stop_standalone`].
pub fn start_standalone(dir: PathBuf, path: PathBuf, header: &Header) -> Result<(), TraceError> {
    let file = std::fs::File::create(&path)?;
    let w = TraceWriter::new(std::io::BufWriter::new(file), header)?;
    let (tx, rx) = channel();
    let st = Standalone {
        dir,
        pid: std::process::id(),
        stop: Mutex::new(Some(tx)),
    };
    if SCOPES.standalone.set(st).is_err() {
        return Err(TraceError::Write(std::io::Error::other(
            "a scopes-only session already ran in this process",
        )));
    }
    set_enabled(true);
    std::thread::Builder::new()
        .name("gpufl-scopes".into())
        .spawn({
            let feed = crate::metrics_feed::Feed::start(&header.app_name, &header.session_id);
            move || standalone_thread(w, rx, feed)
        })?;
    Ok(())
}

fn standalone_thread<W: Write>(
    mut w: TraceWriter<W>,
    rx: Receiver<StopMsg>,
    mut feed: crate::metrics_feed::Feed,
) {
    let mut d = Drain::default();
    let mut last_block = Instant::now();
    let mut dirty = false;
    crate::crash::set_writer_thread();
    // The header reaches the disk at once.
    if w.end_block().is_err() {
        set_enabled(false);
        return;
    }
    loop {
        if let Some(sig) = crate::crash::pending() {
            // A fatal signal on another thread: write what is queued, say so, close a block.
            let ok = d.drain(&mut w).is_ok()
                && w.write(&Record::Notice(Notice {
                    level: "warning".into(),
                    message: format!(
                        "received {}{}: recording flushed; the program may end here",
                        crate::crash::signal_name(sig),
                        crate::crash::fault_text()
                    ),
                }))
                .is_ok()
                && w.end_block().is_ok();
            crate::crash::served();
            if !ok {
                set_enabled(false);
                return;
            }
            dirty = false;
            last_block = Instant::now();
        }
        match rx.recv_timeout(Duration::from_millis(25)) {
            Ok((reason, ack)) => {
                set_enabled(false);
                let n = d.drain(&mut w).unwrap_or(0);
                feed.add_scopes(n);
                feed.send("ended");
                let counts = d
                    .finish(&mut w)
                    .and_then(|_| {
                        let c = w.counts().clone();
                        w.finish(crate::procinfo::unix_ns(), reason).map(|_| c)
                    })
                    .ok();
                let _ = ack.send(counts);
                return;
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        feed.tick("scopes-only");
        match d.drain(&mut w) {
            Ok(n) => {
                dirty |= n > 0;
                feed.add_scopes(n);
            }
            Err(_) => {
                set_enabled(false);
                return;
            }
        }
        if dirty && last_block.elapsed() >= Duration::from_millis(500) {
            if w.end_block().is_err() {
                set_enabled(false);
                return;
            }
            dirty = false;
            last_block = Instant::now();
        }
    }
}

/// Close a scopes-only session (idempotent; None if none runs in this process).
pub fn stop_standalone(reason: &'static str) -> Option<Counts> {
    let st = SCOPES.standalone.get()?;
    if st.pid != std::process::id() {
        return None;
    }
    let tx = st.stop.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    let (ack_tx, ack_rx) = channel();
    tx.send((reason, ack_tx)).ok()?;
    ack_rx.recv_timeout(Duration::from_secs(5)).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: Vec<u8>) -> Vec<Record> {
        gpufl_trace::reader::TraceReader::from_bytes(bytes, "mem")
            .unwrap()
            .collect()
    }

    #[test]
    fn nesting_unbalanced_pops_names_and_ranges() {
        // One test owns the process-wide queue (tests run in threads of one process).
        set_enabled(true);
        pop(ScopeSource::Api); // nothing open: counted, no crash
        range_start(7, b"data load", ScopeSource::Nvtx);
        range_start(8, b"never ends", ScopeSource::Nvtx);
        range_end(99, ScopeSource::Nvtx); // no start: counted
        push(b"outer", ScopeSource::Api);
        push(b"inner", ScopeSource::Nvtx);
        pop(ScopeSource::Nvtx);
        push(b"inner", ScopeSource::Nvtx);
        pop(ScopeSource::Nvtx);
        pop(ScopeSource::Api);
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u64;
        let ender = std::thread::spawn(|| {
            push(b"other", ScopeSource::Api);
            range_end(7, ScopeSource::Nvtx); // ends on another thread
                                             // SAFETY: as above.
            (unsafe { libc::gettid() }) as u64
        })
        .join()
        .unwrap();
        set_enabled(false);
        push(b"ignored", ScopeSource::Api);

        let header = Header::default();
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        let mut d = Drain::default();
        d.finish(&mut w).unwrap();
        let recs = decode(w.finish(1, "shutdown").unwrap());
        let mut syms = Symbols::default();
        let mut got = Vec::new();
        let mut warned = false;
        let mut unpaired = false;
        let mut ranges = Vec::new();
        for r in &recs {
            syms.observe(r);
            match r {
                Record::Scope(s) => {
                    got.push((syms.str(s.name).to_string(), s.depth, s.end, s.source))
                }
                Record::Range(g) => ranges.push((
                    g.id,
                    syms.str(g.name).to_string(),
                    g.tid,
                    g.end_tid,
                    g.end >= g.start,
                )),
                Record::Notice(n) => {
                    warned |= n.message.contains("1 pop(s) without");
                    unpaired |= n.message.contains("1 range end(s) without");
                }
                _ => {}
            }
        }
        assert_eq!(
            ranges,
            vec![(7, "data load".to_string(), me, Some(ender), true)],
            "one paired range, ended on the other thread; the open one is not written"
        );
        assert!(unpaired, "range end without start not reported");
        use ScopeSource::*;
        let want: Vec<(String, u32, bool, ScopeSource)> = vec![
            ("outer".into(), 0, false, Api),
            ("inner".into(), 1, false, Nvtx),
            ("inner".into(), 1, true, Nvtx),
            ("inner".into(), 1, false, Nvtx),
            ("inner".into(), 1, true, Nvtx),
            ("outer".into(), 0, true, Api),
            ("other".into(), 0, false, Api),
        ];
        assert_eq!(got, want);
        assert!(warned, "unbalanced pop not reported");
    }
}
