//! What the recorder saw inside kernels (`kdetail` and `kstall` records, issue 19), merged per
//! kernel name and device: counters and PC samples summed over every record (every collection
//! window, every trace file), source lines merged by (file, line). The rules `warp-divergence`,
//! `uncoalesced-access`, `bank-conflicts` and `stall-reasons` and the kernel table read the
//! merged view ([`KernelDetail`], [`KernelStalls`]; [`crate::Model::kernel_details`]).
//!
//! Bounded whatever the trace: at most [`MAX_DETAIL_KERNELS`] (name, device) pairs and
//! [`MAX_DETAIL_LINES`] distinct lines over all of them are kept (each record's arrays are
//! already bounded by the reader); what is left out is counted in a warning.

use crate::store::NONE;
use gpufl_trace::{Kdetail, Kstall, SassCounts};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Distinct (kernel name, device) pairs kept, for `kdetail` and for `kstall` records each.
pub const MAX_DETAIL_KERNELS: usize = 100_000;
/// Distinct source lines kept over every kernel (`kdetail` and `kstall` together).
pub const MAX_DETAIL_LINES: usize = 1_000_000;
/// Distinct stall reasons kept per line once merged (more are added to `other`).
pub const MAX_MERGED_REASONS: usize = 64;

/// Lanes of a warp.
pub const WARP: f64 = 32.0;
/// Sectors a request of 32 lanes reading or writing 4 bytes each touches when coalesced (128
/// bytes, 32-byte sectors): the ideal assumed when the recorder could not give one.
pub const ASSUMED_SECTORS_PER_REQUEST: u64 = 4;

/// Counters of [`SassCounts`] as sums. An ideal is `None` when unknown: absent from a record
/// whose actual count is not zero (an absent key with a zero count is a zero). The default is
/// all zeros, ideals included.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetailCounts {
    pub inst: u64,
    pub thread_inst: u64,
    /// Branch executions whose active lanes all took one target, and those that split (two or
    /// more targets): the divergent branches' lines are where warps split.
    pub branch_uniform: u64,
    pub branch_divergent: u64,
    pub gld_inst: u64,
    pub gld_sectors: u64,
    pub gld_sectors_ideal: Option<u64>,
    pub gst_inst: u64,
    pub gst_sectors: u64,
    pub gst_sectors_ideal: Option<u64>,
    pub shared_inst: u64,
    pub shared_wavefronts: u64,
    pub shared_wavefronts_ideal: Option<u64>,
}

impl Default for DetailCounts {
    fn default() -> Self {
        DetailCounts {
            inst: 0,
            thread_inst: 0,
            branch_uniform: 0,
            branch_divergent: 0,
            gld_inst: 0,
            gld_sectors: 0,
            gld_sectors_ideal: Some(0),
            gst_inst: 0,
            gst_sectors: 0,
            gst_sectors_ideal: Some(0),
            shared_inst: 0,
            shared_wavefronts: 0,
            shared_wavefronts_ideal: Some(0),
        }
    }
}

/// An ideal read from a record: its key, else 0 when there is nothing to be ideal about.
fn ideal(key: Option<u64>, actual: u64) -> Option<u64> {
    key.or((actual == 0).then_some(0))
}

fn add_ideal(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.saturating_add(b?))
}

/// `num / den`, None for a zero denominator.
fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

impl DetailCounts {
    pub fn from_record(c: &SassCounts) -> DetailCounts {
        let v = |x: Option<u64>| x.unwrap_or(0);
        DetailCounts {
            inst: v(c.inst),
            thread_inst: v(c.thread_inst),
            branch_uniform: v(c.branch_uniform),
            branch_divergent: v(c.branch_divergent),
            gld_inst: v(c.gld_inst),
            gld_sectors: v(c.gld_sectors),
            gld_sectors_ideal: ideal(c.gld_sectors_ideal, v(c.gld_sectors)),
            gst_inst: v(c.gst_inst),
            gst_sectors: v(c.gst_sectors),
            gst_sectors_ideal: ideal(c.gst_sectors_ideal, v(c.gst_sectors)),
            shared_inst: v(c.shared_inst),
            shared_wavefronts: v(c.shared_wavefronts),
            shared_wavefronts_ideal: ideal(c.shared_wavefronts_ideal, v(c.shared_wavefronts)),
        }
    }

    /// Add `o` (saturating; an ideal unknown on either side is unknown).
    pub fn add(&mut self, o: &DetailCounts) {
        let s = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        s(&mut self.inst, o.inst);
        s(&mut self.thread_inst, o.thread_inst);
        s(&mut self.branch_uniform, o.branch_uniform);
        s(&mut self.branch_divergent, o.branch_divergent);
        s(&mut self.gld_inst, o.gld_inst);
        s(&mut self.gld_sectors, o.gld_sectors);
        s(&mut self.gst_inst, o.gst_inst);
        s(&mut self.gst_sectors, o.gst_sectors);
        s(&mut self.shared_inst, o.shared_inst);
        s(&mut self.shared_wavefronts, o.shared_wavefronts);
        self.gld_sectors_ideal = add_ideal(self.gld_sectors_ideal, o.gld_sectors_ideal);
        self.gst_sectors_ideal = add_ideal(self.gst_sectors_ideal, o.gst_sectors_ideal);
        self.shared_wavefronts_ideal =
            add_ideal(self.shared_wavefronts_ideal, o.shared_wavefronts_ideal);
    }

    /// Active lanes per warp instruction, 0..32 (`thread_inst / inst`, at most 32: a damaged
    /// count cannot claim more); None without instructions.
    pub fn lanes(&self) -> Option<f64> {
        ratio(self.thread_inst, self.inst).map(|l| l.min(WARP))
    }

    /// Branch efficiency: the share of branch executions whose active lanes all took one
    /// target (Nsight Compute's `smsp__sass_average_branch_targets_threads_uniform.pct` / 100);
    /// None without branch counts.
    pub fn branch_efficiency(&self) -> Option<f64> {
        ratio(
            self.branch_uniform,
            self.branch_uniform.saturating_add(self.branch_divergent),
        )
    }

    /// Lane-slots lost to inactive lanes: `inst × 32 − thread_inst` (0 when the counts say more
    /// lanes than a warp has).
    pub fn lost_lanes(&self) -> u64 {
        self.inst
            .saturating_mul(32)
            .saturating_sub(self.thread_inst)
    }

    /// Global loads (`false`: stores) of these counts.
    pub fn global(&self, store: bool) -> Access {
        if store {
            Access::new(self.gst_inst, self.gst_sectors, self.gst_sectors_ideal)
        } else {
            Access::new(self.gld_inst, self.gld_sectors, self.gld_sectors_ideal)
        }
    }

    /// Shared-memory wavefronts beyond the ideal (bank conflicts); None when the ideal is unknown.
    pub fn extra_wavefronts(&self) -> Option<u64> {
        Some(
            self.shared_wavefronts
                .saturating_sub(self.shared_wavefronts_ideal?),
        )
    }

    /// Extra wavefronts over all wavefronts, 0..1; None when unknown or without wavefronts.
    pub fn bank_conflict_share(&self) -> Option<f64> {
        ratio(self.extra_wavefronts()?, self.shared_wavefronts)
    }
}

/// Global loads or stores: requests, sectors, and the ideal sectors (the recorder's, or assumed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Access {
    pub requests: u64,
    pub sectors: u64,
    /// The ideal sectors: the recorder's when it gave them, else
    /// [`ASSUMED_SECTORS_PER_REQUEST`] a request.
    pub ideal: u64,
    /// Whether `ideal` is assumed.
    pub assumed: bool,
}

impl Access {
    fn new(requests: u64, sectors: u64, ideal: Option<u64>) -> Access {
        match ideal {
            Some(i) => Access {
                requests,
                sectors,
                ideal: i,
                assumed: false,
            },
            None => Access {
                requests,
                sectors,
                ideal: requests.saturating_mul(ASSUMED_SECTORS_PER_REQUEST),
                assumed: true,
            },
        }
    }

    /// Sectors beyond the ideal (0 when the ideal is larger: a damaged count, or an ideal the
    /// hardware beat).
    pub fn excess(&self) -> u64 {
        self.sectors.saturating_sub(self.ideal)
    }

    pub fn per_request(&self) -> Option<f64> {
        ratio(self.sectors, self.requests)
    }

    pub fn ideal_per_request(&self) -> Option<f64> {
        ratio(self.ideal, self.requests)
    }
}

/// One source line inside a kernel and its counters.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DetailLine {
    pub file: String,
    pub line: u32,
    pub counts: DetailCounts,
}

/// A kernel's counters (`kdetail`), merged over its records.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelDetail {
    /// Kernel name, as the kernel records' and the kernel table's.
    pub name: String,
    pub device: u32,
    /// Records merged (collection windows), and the launches they instrumented.
    pub records: u32,
    pub launches: u64,
    /// Whether every record had line info (a cubin without a line table: built without
    /// `-lineinfo`, and no lines).
    pub lineinfo: bool,
    pub totals: DetailCounts,
    /// Counts of PCs no line was found for.
    pub unmapped: DetailCounts,
    /// By (file, line).
    pub lines: Vec<DetailLine>,
}

/// One source line's PC samples: their number and stall reasons, most samples first (ties by
/// name).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StallLine {
    pub file: String,
    pub line: u32,
    pub samples: u64,
    pub stalls: Vec<(String, u64)>,
}

/// A kernel's PC samples (`kstall`), merged over its records.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelStalls {
    pub name: String,
    pub device: u32,
    pub records: u32,
    pub launches: u64,
    /// Every sample (the records' `total`, at least the samples of their lines), and those with
    /// no line.
    pub total: u64,
    pub unmapped: u64,
    /// The unmapped samples by stall reason.
    pub unmapped_reasons: BTreeMap<String, u64>,
    /// The sampling period (log2 of cycles) of the first record that gave one.
    pub period_log2: Option<u32>,
    /// Most samples first (ties by file and line).
    pub lines: Vec<StallLine>,
}

/// A kernel's records while loading, by model string id (remapped ids of one name in several
/// trace files are merged by text in [`DetailStore::finish`]).
#[derive(Debug, Default)]
struct RawDetail {
    records: u32,
    launches: u64,
    no_lineinfo: bool,
    totals: DetailCounts,
    unmapped: DetailCounts,
    lines: HashMap<(u32, u32), DetailCounts>,
}

#[derive(Debug, Default)]
struct RawStalls {
    records: u32,
    launches: u64,
    total: u64,
    unmapped: u64,
    unmapped_reasons: BTreeMap<String, u64>,
    period_log2: Option<u32>,
    lines: HashMap<(u32, u32), (u64, BTreeMap<String, u64>)>,
}

/// `kdetail` and `kstall` records while loading: merged per (model name id, device) and line.
#[derive(Debug, Default)]
pub(crate) struct DetailStore {
    details: HashMap<(u32, u32), RawDetail>,
    stalls: HashMap<(u32, u32), RawStalls>,
    /// Distinct lines held (both kinds).
    lines: usize,
    dropped_kernels: u64,
    dropped_lines: u64,
}

impl DetailStore {
    /// Whether no further distinct line is kept.
    pub(crate) fn lines_full(&self) -> bool {
        self.lines >= MAX_DETAIL_LINES
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.details.is_empty() && self.stalls.is_empty() && self.dropped_kernels == 0
    }

    /// Add a `kdetail` record whose name and files are model string ids (`name`, `files[i]`
    /// for `k.lines[i]`).
    pub(crate) fn add_detail(&mut self, k: &Kdetail, name: u32, files: &[u32]) {
        let key = (name, k.dev);
        if !self.details.contains_key(&key) && self.details.len() >= MAX_DETAIL_KERNELS {
            self.dropped_kernels += 1;
            return;
        }
        let lines_held = &mut self.lines;
        let dropped = &mut self.dropped_lines;
        let d = self.details.entry(key).or_default();
        d.records = d.records.saturating_add(1);
        d.launches = d.launches.saturating_add(k.launches);
        d.no_lineinfo |= !k.lineinfo;
        d.totals.add(&DetailCounts::from_record(&k.totals));
        if let Some(u) = &k.unmapped {
            d.unmapped.add(&DetailCounts::from_record(u));
        }
        for (l, &file) in k.lines.iter().zip(files) {
            let c = DetailCounts::from_record(&l.m);
            let lk = (file, l.line);
            match d.lines.get_mut(&lk) {
                Some(e) => e.add(&c),
                None if *lines_held < MAX_DETAIL_LINES => {
                    *lines_held += 1;
                    d.lines.insert(lk, c);
                }
                None => *dropped += 1,
            }
        }
    }

    /// Add a `kstall` record (names and files as in [`DetailStore::add_detail`]).
    pub(crate) fn add_stalls(&mut self, k: &Kstall, name: u32, files: &[u32]) {
        let key = (name, k.dev);
        if !self.stalls.contains_key(&key) && self.stalls.len() >= MAX_DETAIL_KERNELS {
            self.dropped_kernels += 1;
            return;
        }
        let lines_held = &mut self.lines;
        let dropped = &mut self.dropped_lines;
        let s = self.stalls.entry(key).or_default();
        s.records = s.records.saturating_add(1);
        s.launches = s.launches.saturating_add(k.launches);
        let line_samples = k
            .lines
            .iter()
            .fold(0u64, |a, l| a.saturating_add(l.samples));
        // The total is at least what the lines and the unmapped samples hold (a damaged total
        // cannot make a line hold more than all of them).
        let total = k.total.max(line_samples.saturating_add(k.unmapped));
        s.total = s.total.saturating_add(total);
        s.unmapped = s.unmapped.saturating_add(k.unmapped);
        merge_reasons(
            &mut s.unmapped_reasons,
            k.unmapped_stalls.iter().map(|(k, &v)| (k.as_str(), v)),
        );
        s.period_log2 = s.period_log2.or(k.period_log2);
        for (l, &file) in k.lines.iter().zip(files) {
            let lk = (file, l.line);
            let e = match s.lines.get_mut(&lk) {
                Some(e) => e,
                None if *lines_held < MAX_DETAIL_LINES => {
                    *lines_held += 1;
                    s.lines.entry(lk).or_default()
                }
                None => {
                    *dropped += 1;
                    continue;
                }
            };
            e.0 = e.0.saturating_add(l.samples);
            merge_reasons(&mut e.1, l.stalls.iter().map(|(k, &v)| (k.as_str(), v)));
        }
    }

    /// The merged views, by kernel name text (then device), lines by file text and line;
    /// `str_of` gives a model string id's text. Warnings for what was left out.
    pub(crate) fn finish(
        self,
        str_of: impl Fn(u32) -> String,
    ) -> (Vec<KernelDetail>, Vec<KernelStalls>, Vec<String>) {
        let mut warnings = Vec::new();
        if self.dropped_kernels > 0 || self.dropped_lines > 0 {
            warnings.push(format!(
                "kernel detail: {} record(s) of kernels beyond the first {MAX_DETAIL_KERNELS} and {} source line(s) beyond the first {MAX_DETAIL_LINES} left out (a corrupt trace?)",
                self.dropped_kernels, self.dropped_lines
            ));
        }
        let text = |id: u32| {
            if id == NONE {
                "?".to_string()
            } else {
                str_of(id)
            }
        };
        let mut details: BTreeMap<(String, u32), KernelDetail> = BTreeMap::new();
        let mut detail_lines: BTreeMap<(String, u32), BTreeMap<(String, u32), DetailCounts>> =
            BTreeMap::new();
        for ((name, dev), raw) in self.details {
            let key = (text(name), dev);
            let d = details.entry(key.clone()).or_insert_with(|| KernelDetail {
                name: key.0.clone(),
                device: dev,
                records: 0,
                launches: 0,
                lineinfo: true,
                totals: DetailCounts::default(),
                unmapped: DetailCounts::default(),
                lines: Vec::new(),
            });
            d.records = d.records.saturating_add(raw.records);
            d.launches = d.launches.saturating_add(raw.launches);
            d.lineinfo &= !raw.no_lineinfo;
            d.totals.add(&raw.totals);
            d.unmapped.add(&raw.unmapped);
            let lines = detail_lines.entry(key).or_default();
            for ((file, line), c) in raw.lines {
                lines.entry((text(file), line)).or_default().add(&c);
            }
        }
        for (key, lines) in detail_lines {
            if let Some(d) = details.get_mut(&key) {
                d.lines = lines
                    .into_iter()
                    .map(|((file, line), counts)| DetailLine { file, line, counts })
                    .collect();
            }
        }
        let mut stalls: BTreeMap<(String, u32), (KernelStalls, StallMerge)> = BTreeMap::new();
        for ((name, dev), raw) in self.stalls {
            let key = (text(name), dev);
            let (s, lines) = stalls.entry(key.clone()).or_insert_with(|| {
                (
                    KernelStalls {
                        name: key.0.clone(),
                        device: dev,
                        records: 0,
                        launches: 0,
                        total: 0,
                        unmapped: 0,
                        unmapped_reasons: BTreeMap::new(),
                        period_log2: None,
                        lines: Vec::new(),
                    },
                    BTreeMap::new(),
                )
            });
            s.records = s.records.saturating_add(raw.records);
            s.launches = s.launches.saturating_add(raw.launches);
            s.total = s.total.saturating_add(raw.total);
            s.unmapped = s.unmapped.saturating_add(raw.unmapped);
            merge_reasons(
                &mut s.unmapped_reasons,
                raw.unmapped_reasons.iter().map(|(k, &v)| (k.as_str(), v)),
            );
            s.period_log2 = s.period_log2.or(raw.period_log2);
            for ((file, line), (samples, reasons)) in raw.lines {
                let e = lines.entry((text(file), line)).or_default();
                e.0 = e.0.saturating_add(samples);
                merge_reasons(&mut e.1, reasons.iter().map(|(k, &v)| (k.as_str(), v)));
            }
        }
        let stalls = stalls
            .into_values()
            .map(|(mut s, lines)| {
                s.lines = lines
                    .into_iter()
                    .map(|((file, line), (samples, reasons))| {
                        let mut stalls: Vec<(String, u64)> = reasons.into_iter().collect();
                        stalls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                        StallLine {
                            file,
                            line,
                            samples,
                            stalls,
                        }
                    })
                    .collect();
                // Most samples first; ties by (file, line), already the order.
                s.lines.sort_by_key(|l| std::cmp::Reverse(l.samples));
                s
            })
            .collect();
        (details.into_values().collect(), stalls, warnings)
    }
}

type StallMerge = BTreeMap<(String, u32), (u64, BTreeMap<String, u64>)>;

/// Add stall reasons into `into`, at most [`MAX_MERGED_REASONS`] names (further ones count as
/// `other`).
fn merge_reasons<'a>(into: &mut BTreeMap<String, u64>, from: impl Iterator<Item = (&'a str, u64)>) {
    for (k, v) in from {
        let key = if into.contains_key(k) || into.len() < MAX_MERGED_REASONS {
            k
        } else {
            "other"
        };
        let e = into.entry(key.to_string()).or_insert(0);
        *e = e.saturating_add(v);
    }
}

/// A kernel's counters as the kernel table shows them (`kernels.rows[].detail` in `--json`).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DetailSummary {
    /// Launches the counters come from (instrumented), in how many collection windows.
    pub launches: u64,
    pub windows: u32,
    /// false: the kernel's cubin had no line info (built without `-lineinfo`).
    pub lineinfo: bool,
    /// Active lanes per warp instruction (32: no divergence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lanes: Option<f64>,
    /// Branch efficiency, 0..1 (uniform branch executions over all; when branches were counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_efficiency: Option<f64>,
    /// Global load sectors per request and the ideal (the recorder's, else assumed: 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_sectors_per_request: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_ideal_per_request: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub load_ideal_assumed: bool,
    /// The same for global stores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_sectors_per_request: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_ideal_per_request: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub store_ideal_assumed: bool,
    /// Shared-memory wavefronts beyond the ideal over all wavefronts (bank conflicts), 0..1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bank_conflict_share: Option<f64>,
}

impl DetailSummary {
    pub fn of(d: &KernelDetail) -> DetailSummary {
        let t = &d.totals;
        let (ld, st) = (t.global(false), t.global(true));
        DetailSummary {
            launches: d.launches,
            windows: d.records,
            lineinfo: d.lineinfo,
            lanes: t.lanes(),
            branch_efficiency: t.branch_efficiency(),
            load_sectors_per_request: ld.per_request(),
            load_ideal_per_request: ld.ideal_per_request(),
            load_ideal_assumed: ld.requests > 0 && ld.assumed,
            store_sectors_per_request: st.per_request(),
            store_ideal_per_request: st.ideal_per_request(),
            store_ideal_assumed: st.requests > 0 && st.assumed,
            bank_conflict_share: t.bank_conflict_share(),
        }
    }
}
