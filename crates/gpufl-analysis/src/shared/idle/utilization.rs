//! The utilization series of each device's idle summary (its active range cut into
//! [`UTIL_CHUNKS`] equal chunks, as `nsys analyze gpu_time_util`): busy time per chunk, and what
//! the host was doing during each chunk's idle time (the idle gaps' classes and lines), which
//! `low-utilization` reads.

use super::{IdleClass, UtilChunk, LOW_UTILIZATION, UTIL_CHUNKS};
use crate::ids::LocIx;
use crate::insight::share;
use std::collections::HashMap;

/// Idle time of one (class, line) in one chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLine {
    pub class: IdleClass,
    /// The line: one of the analysis's user locations (`Ctx::locs`).
    pub loc: LocIx,
    pub idle_ns: u64,
    /// `sync` class: the blocking call of the longest such gap (`StreamSynchronize`, `cudaMemcpy`…).
    pub blocking_call: Option<String>,
}

/// What the host was doing during one chunk's idle time, by the idle scan's classification of the
/// gaps (or their parts) that fall in the chunk.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ChunkIdle {
    /// Idle ns by class, in [`IdleClass`] order: kernel_wait, launch, sync, other.
    pub by_class: [u64; 4],
    /// `launch` and `sync` idle time with a user line, largest first (ties: smaller class, line).
    pub lines: Vec<ChunkLine>,
}

/// Idle time of a (class, line) in a chunk, and (length, index into the idle scan's blocked index) of
/// its longest gap's blocked call.
type LineAcc = (u64, Option<(u64, usize)>);

/// Per chunk, while scanning: idle by class, and per (class, line) its [`LineAcc`].
#[derive(Default)]
struct Acc {
    by_class: [u64; 4],
    lines: HashMap<(IdleClass, LocIx), LineAcc>,
}

/// Busy and idle time per chunk of a device's active range.
pub(crate) struct Util {
    first: u64,
    span: u64,
    /// Chunks: [`UTIL_CHUNKS`], or 0 when the range is shorter than that many ns.
    n: usize,
    busy: Vec<u64>,
    /// Time of each chunk in gaps that overlap a pause of the recording (not counted either way).
    paused: Vec<u64>,
    idle: Vec<Acc>,
}

impl Util {
    pub(crate) fn new(first: u64, span: u64) -> Util {
        let n = if span >= UTIL_CHUNKS as u64 {
            UTIL_CHUNKS as usize
        } else {
            0
        };
        Util {
            first,
            span,
            n,
            busy: vec![0; n],
            paused: vec![0; n],
            idle: (0..n).map(|_| Acc::default()).collect(),
        }
    }

    /// Start of chunk `i` (`i` = number of chunks: the range's end).
    pub(crate) fn bound(&self, i: usize) -> u64 {
        let n = self.n as u128;
        self.first + (self.span as u128 * i as u128 / n) as u64
    }

    /// Call `f(chunk, ns)` for each chunk that `[a, b)` overlaps.
    fn split(&self, a: u64, b: u64, mut f: impl FnMut(usize, u64)) {
        let n = self.n;
        if n == 0 || b <= a || a < self.first {
            return;
        }
        let mut i = (((a - self.first) as u128 * n as u128) / self.span as u128) as usize;
        i = i.min(n - 1);
        while i > 0 && self.bound(i) > a {
            i -= 1;
        }
        while i + 1 < n && self.bound(i + 1) <= a {
            i += 1;
        }
        while i < n {
            let (lo, hi) = (self.bound(i), self.bound(i + 1));
            if lo >= b {
                break;
            }
            f(i, b.min(hi).saturating_sub(a.max(lo)));
            i += 1;
        }
    }

    /// Busy time `[a, b)`.
    pub(crate) fn add(&mut self, a: u64, b: u64) {
        let mut busy = std::mem::take(&mut self.busy);
        self.split(a, b, |i, ns| busy[i] += ns);
        self.busy = busy;
    }

    /// A gap `[a, b)` that overlaps a pause of the recording: neither busy nor idle.
    pub(crate) fn add_paused(&mut self, a: u64, b: u64) {
        let mut paused = std::mem::take(&mut self.paused);
        self.split(a, b, |i, ns| paused[i] += ns);
        self.paused = paused;
    }

    /// An idle gap `[a, b)` of `class`, at user line `loc` (None without one), ended while the
    /// host was blocked in `blocker` (sync class).
    pub(crate) fn add_idle(
        &mut self,
        a: u64,
        b: u64,
        class: IdleClass,
        loc: Option<LocIx>,
        blocker: Option<usize>,
    ) {
        let mut idle = std::mem::take(&mut self.idle);
        let len = b.saturating_sub(a);
        let lined = loc.filter(|_| matches!(class, IdleClass::Launch | IdleClass::Sync));
        self.split(a, b, |i, ns| {
            let acc = &mut idle[i];
            acc.by_class[class as usize] += ns;
            if let Some(loc) = lined {
                let e = acc.lines.entry((class, loc)).or_insert((0, None));
                e.0 += ns;
                if let Some(bl) = blocker {
                    if e.1.is_none_or(|(l, _)| len > l) {
                        e.1 = Some((len, bl));
                    }
                }
            }
        });
        self.idle = idle;
    }

    pub(crate) fn chunks(&self, origin: u64) -> Vec<UtilChunk> {
        (0..self.n)
            .map(|i| {
                let (lo, hi) = (self.bound(i), self.bound(i + 1));
                // A chunk's share counts its recorded time only; a chunk paused throughout is
                // not low (nothing is known of it).
                let recorded = (hi - lo).saturating_sub(self.paused[i]);
                let busy_share = share(self.busy[i], recorded);
                UtilChunk {
                    start_offset_ns: lo - origin,
                    duration_ns: hi - lo,
                    busy_ns: self.busy[i],
                    busy_share,
                    low: recorded > 0 && busy_share < LOW_UTILIZATION,
                    unobserved_ns: self.paused[i].min(hi - lo),
                }
            })
            .collect()
    }

    /// Each chunk's idle time by class and line, blocked calls named by `label`.
    pub(crate) fn chunk_idle(&self, label: impl Fn(usize) -> String) -> Vec<ChunkIdle> {
        self.idle
            .iter()
            .map(|acc| {
                let mut lines: Vec<ChunkLine> = acc
                    .lines
                    .iter()
                    .map(|(&(class, loc), &(idle_ns, bl))| ChunkLine {
                        class,
                        loc,
                        idle_ns,
                        blocking_call: bl.map(|(_, b)| label(b)),
                    })
                    .collect();
                lines.sort_by(|a, b| {
                    b.idle_ns
                        .cmp(&a.idle_ns)
                        .then(a.class.cmp(&b.class))
                        .then(a.loc.cmp(&b.loc))
                });
                ChunkIdle {
                    by_class: acc.by_class,
                    lines,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilization_chunks_split_intervals_exactly() {
        // 3000 ns in 30 chunks of 100: busy [0,150) and [250,260) and [2990,3000).
        let mut u = Util::new(1000, 3000);
        u.add(1000, 1150);
        u.add(1250, 1260);
        u.add(3990, 4000);
        let c = u.chunks(1000);
        assert_eq!(c.len(), 30);
        assert_eq!(c[0].busy_ns, 100);
        assert_eq!(c[1].busy_ns, 50);
        assert_eq!(c[2].busy_ns, 10);
        assert_eq!(c[29].busy_ns, 10);
        assert_eq!(c[29].start_offset_ns, 2900);
        assert!(c[0].busy_share == 1.0 && !c[0].low && c[1].busy_share == 0.5 && !c[1].low);
        assert!(c[2].low);
        // Uneven spans: chunk bounds are floor(span * i / 30), covering the range exactly.
        let u = Util::new(0, 31);
        assert_eq!(u.bound(30), 31);
        assert_eq!(
            (0..30).map(|i| u.bound(i + 1) - u.bound(i)).sum::<u64>(),
            31
        );
        assert!(Util::new(0, 29).chunks(0).is_empty());
    }

    #[test]
    fn idle_is_split_by_chunk_class_and_line() {
        let mut u = Util::new(0, 3000);
        // A launch gap over chunks 0-2 at line 4, a sync gap in chunk 2 at line 7 (blocked call 9),
        // a longer sync gap at the same line (blocked call 3), an `other` gap without line.
        let (l4, l7) = (LocIx::at(4), LocIx::at(7));
        u.add_idle(50, 250, IdleClass::Launch, Some(l4), None);
        u.add_idle(260, 270, IdleClass::Sync, Some(l7), Some(9));
        u.add_idle(270, 290, IdleClass::Sync, Some(l7), Some(3));
        u.add_idle(290, 300, IdleClass::Other, None, None);
        u.add_idle(2990, 2994, IdleClass::KernelWait, None, None);
        let c = u.chunk_idle(|b| format!("call{b}"));
        assert_eq!(c[0].by_class, [0, 50, 0, 0]);
        assert_eq!(c[1].by_class, [0, 100, 0, 0]);
        assert_eq!(c[2].by_class, [0, 50, 30, 10]);
        assert_eq!(c[29].by_class, [4, 0, 0, 0]);
        assert!(c[29].lines.is_empty(), "kernel_wait and other have no line");
        assert_eq!(
            c[2].lines,
            vec![
                ChunkLine {
                    class: IdleClass::Launch,
                    loc: l4,
                    idle_ns: 50,
                    blocking_call: None
                },
                ChunkLine {
                    class: IdleClass::Sync,
                    loc: l7,
                    idle_ns: 30,
                    blocking_call: Some("call3".into())
                },
            ]
        );
        // Nothing for a device too short for chunks.
        let mut short = Util::new(0, 10);
        short.add_idle(0, 5, IdleClass::Launch, Some(LocIx::at(1)), None);
        assert!(short.chunk_idle(|_| String::new()).is_empty());
    }
}
