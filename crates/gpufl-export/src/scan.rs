//! First pass over a session: its header, time range, which correlation ids get a flow arrow, and
//! (for sessions up to a record budget) the insights of gpufl-analysis.

use crate::links::Links;
use crate::ExportError;
use gpufl_analysis::{analyze_on, Config, Insight, Model};
use gpufl_trace::{ClockSync, Header, ParSessionReader, Record};
use std::path::Path;

/// A file's clock: trace ns to Unix ns (`header.clock`), identity before any header.
#[derive(Clone, Copy, Default)]
pub struct Clock(Option<ClockSync>);

impl Clock {
    pub fn from_header(h: &Header) -> Clock {
        Clock(Some(h.clock))
    }
    /// Unix ns, clamped to u64.
    pub fn unix(&self, t: u64) -> u64 {
        match self.0 {
            Some(c) => c.to_unix_ns(t).clamp(0, u64::MAX as i128) as u64,
            None => t,
        }
    }
}

/// The trace-clock interval a record covers, if it is timed.
pub fn span(rec: &Record) -> Option<(u64, u64)> {
    Some(match rec {
        Record::Kernel(k) => (k.start, k.end),
        Record::Memcpy(c) => (c.start, c.end),
        Record::Memset(s) => (s.start, s.end),
        Record::Sync(s) => (s.start, s.end),
        Record::Api(a) => (a.start, a.end),
        Record::Callsite(c) => (c.ts, c.ts),
        Record::Scope(s) => (s.ts, s.ts),
        Record::Range(r) => (r.start, r.end),
        Record::Window(w) => (w.start, w.end),
        Record::Capture(c) => (c.ts, c.ts),
        Record::Telemetry(t) => (t.ts, t.ts),
        _ => return None,
    })
}

/// What the first pass learns about a session.
#[derive(Default)]
pub struct Scan {
    pub header: Option<Header>,
    /// Earliest and latest time of any record, Unix ns (None: no timed record).
    pub range: Option<(u64, u64)>,
    pub links: Links,
    pub insights: Vec<Insight>,
    /// Why there are no insights, when they were left out.
    pub insights_note: Option<String>,
    pub records: u64,
    pub warnings: Vec<String>,
    clock: Clock,
}

impl Scan {
    fn observe(&mut self, rec: &Record) {
        self.records += 1;
        match rec {
            Record::Header(h) => {
                self.clock = Clock::from_header(h);
                if self.header.is_none() {
                    self.header = Some((**h).clone());
                }
            }
            Record::Kernel(k) => self.links.gpu(k.corr),
            Record::Memcpy(c) => self.links.gpu(c.corr),
            Record::Memset(s) => self.links.gpu(s.corr),
            Record::Api(a) => self.links.api(a.corr),
            Record::Callsite(c) => self.links.site(c.corr),
            _ => {}
        }
        if let Some((a, b)) = span(rec) {
            let (a, b) = (self.clock.unix(a), self.clock.unix(b.max(a)));
            self.range = Some(match self.range {
                Some((lo, hi)) => (lo.min(a), hi.max(b)),
                None => (a, b),
            });
        }
    }
}

/// Feeds the model while the budget lasts, scanning every record it passes on.
struct Tap<'a, I: Iterator<Item = Record>> {
    inner: &'a mut I,
    scan: &'a mut Scan,
    left: u64,
    over: bool,
}

impl<I: Iterator<Item = Record>> Iterator for Tap<'_, I> {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        if self.over {
            return None;
        }
        let r = self.inner.next()?;
        self.scan.observe(&r);
        if self.left == 0 {
            self.over = true;
            return None;
        }
        self.left -= 1;
        Some(r)
    }
}

/// Pass 1 over `dir`.
pub fn scan(
    dir: &Path,
    cfg: &Config,
    insights_max_records: u64,
    threads: usize,
) -> Result<Scan, ExportError> {
    let mut reader = ParSessionReader::open(dir, threads)?;
    let mut scan = Scan::default();
    if insights_max_records > 0 {
        let mut tap = Tap {
            inner: &mut reader,
            scan: &mut scan,
            left: insights_max_records,
            over: false,
        };
        let model = Model::load(&mut tap);
        let over = tap.over;
        if over {
            drop(model);
            for r in reader.by_ref() {
                scan.observe(&r);
            }
            scan.insights_note = Some(format!(
                "insights left out: the session has more than {insights_max_records} records \
                 (--insights-max-records raises the budget; the analysis holds ~60 bytes a record)"
            ));
        } else {
            scan.insights = analyze_on(&model, cfg, threads).insights;
        }
    } else {
        for r in reader.by_ref() {
            scan.observe(&r);
        }
        scan.insights_note = Some("insights left out (--insights-max-records 0)".into());
    }
    scan.warnings = reader.warnings();
    Ok(scan)
}
