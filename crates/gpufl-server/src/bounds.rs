//! What ingest takes of an upload, whatever its bytes: every string capped at [`MAX_STRING`]
//! bytes and freed of the NUL character PostgreSQL refuses (replaced by `␀`, U+2400, on both
//! backends alike), and every record costed against the session's memory budget
//! ([`Budget`]): reading stops when the records taken would need more memory than the budget
//! (the session is then stored `too_large`, with the reason). The reader's own limits
//! ([`gpufl_trace::ReadLimits`]) are derived from the same budget ([`Budget::read_limits`]).
//!
//! A record's cost is [`RECORD_COST`] bytes — what one record costs through the model, the
//! analysis and the stored documents at most (measured: docs/robustness.md) — plus the bytes of
//! what it holds that grows with the input (a string's text, a stack's frames, a kernel detail's
//! lines). [`Bounded`] wraps the reader: records handed out one by one are capped and costed
//! there, records the analysis folds on the reader's workers are capped and costed as they are
//! pushed into the fold.

use gpufl_trace::{BlockFold, BlockFolding, Item, Items, ReadLimits, Record};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of a string kept from a trace (a kernel name, a path, a function, a source line, a
/// command-line argument); the rest is cut at a character boundary and `…` added.
pub const MAX_STRING: usize = 4096;
/// Arguments of the header's command line kept.
pub const MAX_ARGS: usize = 256;
/// What one record costs at most beyond what it holds, bytes (see the module's text).
pub const RECORD_COST: u64 = 160;

/// The character a NUL becomes.
pub const NUL_AS: char = '\u{2400}';

/// The memory one session's ingest may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
}

impl Budget {
    /// What the records taken may cost in all: half the budget (the other half is for the
    /// reader's blocks in flight, the analysis's working sets and the documents' JSON).
    pub fn records(&self) -> u64 {
        self.bytes / 2
    }

    /// The reader's limits within the budget: decompressed bytes of the session at most the
    /// budget (a record is never smaller than its cost share), blocks and lines at most an
    /// eighth of it (within the reader's own defaults).
    pub fn read_limits(&self) -> ReadLimits {
        let d = ReadLimits::default();
        ReadLimits {
            max_block_bytes: d.max_block_bytes.min(self.bytes / 8).max(1 << 20),
            max_session_bytes: d.max_session_bytes.min(self.bytes.max(1 << 20)),
            max_line_bytes: d
                .max_line_bytes
                .min(usize::try_from(self.bytes / 8).unwrap_or(usize::MAX))
                .max(1 << 20),
            max_ratio: d.max_ratio,
        }
    }
}

/// `s` cut to [`MAX_STRING`] bytes and freed of NULs; the bytes it holds after.
pub fn cap_string(s: &mut String) -> u64 {
    if s.len() > MAX_STRING {
        let mut cut = MAX_STRING;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    if s.contains('\0') {
        *s = s.replace('\0', &NUL_AS.to_string());
    }
    s.len() as u64
}

fn cap_opt(s: &mut Option<String>) -> u64 {
    s.as_mut().map_or(0, cap_string)
}

/// Cap the strings `r` holds; its cost.
pub fn cap_record(r: &mut Record) -> u64 {
    let held = match r {
        Record::Str(s) => cap_string(&mut s.s),
        Record::Stack(s) => s.frames.len() as u64 * 8,
        Record::Header(h) => {
            h.command_line.truncate(MAX_ARGS);
            let mut n = h.command_line.iter_mut().map(cap_string).sum::<u64>();
            for s in [
                &mut h.format,
                &mut h.gpufl_version,
                &mut h.session_id,
                &mut h.app_name,
                &mut h.host,
                &mut h.options.api_records,
                &mut h.options.log_path,
                &mut h.options.started_by,
                &mut h.capture.status,
            ] {
                n += cap_string(s);
            }
            for s in [
                &mut h.python_version,
                &mut h.run_id,
                &mut h.options.mode,
                &mut h.options.call_sites,
                &mut h.capture.reason,
            ] {
                n += cap_opt(s);
            }
            for g in &mut h.gpus {
                n += cap_string(&mut g.name) + cap_string(&mut g.uuid) + 256;
            }
            n
        }
        Record::Kdetail(k) => k.lines.len() as u64 * 128,
        Record::Kstall(k) => {
            let mut n = 0;
            for l in &mut k.lines {
                n += 64;
                n += cap_map(&mut l.stalls);
            }
            n + cap_map(&mut k.unmapped_stalls)
        }
        Record::Telemetry(_) => 256,
        Record::Overhead(o) => cap_string(&mut o.kind),
        Record::Dropped(d) => cap_string(&mut d.source),
        Record::Notice(n) => cap_string(&mut n.level) + cap_string(&mut n.message),
        Record::End(e) => cap_string(&mut e.reason),
        _ => 0,
    };
    RECORD_COST + held
}

/// The keys of a map of counts by name, capped (a capped key that collides adds its count).
fn cap_map(m: &mut std::collections::BTreeMap<String, u64>) -> u64 {
    if m.keys().all(|k| k.len() <= MAX_STRING && !k.contains('\0')) {
        return m.keys().map(|k| k.len() as u64 + 48).sum();
    }
    let old = std::mem::take(m);
    for (mut k, v) in old {
        cap_string(&mut k);
        *m.entry(k).or_insert(0) += v;
    }
    m.keys().map(|k| k.len() as u64 + 48).sum()
}

/// A reader whose records are capped ([`cap_record`]) and costed; it ends (as if the input did)
/// once the cost passes `limit` ([`Bounded::over`] says so).
pub struct Bounded<R> {
    inner: R,
    cost: Arc<AtomicU64>,
    limit: u64,
    over: bool,
}

impl<R: Items> Bounded<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        Bounded {
            inner,
            cost: Arc::new(AtomicU64::new(0)),
            limit,
            over: false,
        }
    }

    /// Whether reading stopped at the budget.
    pub fn over(&self) -> bool {
        self.over
    }

    /// The cost of the records taken so far.
    pub fn cost(&self) -> u64 {
        self.cost.load(Ordering::Relaxed)
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: Items> Items for Bounded<R> {
    fn set_fold(&mut self, fold: Arc<dyn BlockFold>) {
        self.inner.set_fold(Arc::new(CostFold {
            inner: fold,
            cost: self.cost.clone(),
        }));
    }

    fn next_item(&mut self) -> Option<Item> {
        if self.over || self.cost() > self.limit {
            self.over = true;
            return None;
        }
        match self.inner.next_item()? {
            Item::Record(mut r) => {
                self.cost.fetch_add(cap_record(&mut r), Ordering::Relaxed);
                Some(Item::Record(r))
            }
            folded => Some(folded),
        }
    }
}

/// The analysis's fold, its records capped and costed as they are pushed.
struct CostFold {
    inner: Arc<dyn BlockFold>,
    cost: Arc<AtomicU64>,
}

impl BlockFold for CostFold {
    fn takes(&self, rec: &Record) -> bool {
        self.inner.takes(rec)
    }

    fn start(&self, bytes: usize) -> Box<dyn BlockFolding> {
        Box::new(CostFolding {
            inner: self.inner.start(bytes),
            cost: self.cost.clone(),
            n: 0,
        })
    }
}

struct CostFolding {
    inner: Box<dyn BlockFolding>,
    cost: Arc<AtomicU64>,
    n: u64,
}

impl BlockFolding for CostFolding {
    fn push(&mut self, mut rec: Record) {
        self.n += cap_record(&mut rec);
        self.inner.push(rec);
    }

    fn finish(self: Box<Self>) -> Box<dyn Any + Send> {
        self.cost.fetch_add(self.n, Ordering::Relaxed);
        self.inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_capped_at_a_character_and_freed_of_nul() {
        let mut s = "é".repeat(MAX_STRING);
        cap_string(&mut s);
        assert!(s.len() <= MAX_STRING + '…'.len_utf8());
        assert!(s.ends_with('…'));
        let mut s = String::from("a\0b");
        cap_string(&mut s);
        assert_eq!(s, "a\u{2400}b");
    }

    #[test]
    fn limits_follow_the_budget() {
        let b = Budget { bytes: 512 << 20 };
        let l = b.read_limits();
        assert_eq!(l.max_session_bytes, 512 << 20);
        assert_eq!(l.max_block_bytes, 64 << 20);
        assert_eq!(b.records(), 256 << 20);
    }
}
