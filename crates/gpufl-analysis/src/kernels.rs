//! The kernel table: per kernel name and device, its launches, GPU time (total, mean, median, p99),
//! its share of the device's busy time, its launch configuration with registers, shared and local
//! memory, and its theoretical occupancy with the limiting resource ([`crate::occupancy`]). The
//! kernel rules (`low-occupancy`, `register-spill`, `under-filled-grid`) read it.
//!
//! - **Busy share:** the union of the kernel's own intervals (its concurrent launches count once)
//!   over the union of everything the device ran (kernels, copies, memsets), as the totals count
//!   busy time; shares of concurrent kernels can therefore add up to more than 100 %.
//! - **Configurations:** launches of one kernel may differ (grid sizes that follow the input,
//!   dynamic shared memory); the row shows the configuration with the most GPU time and counts the
//!   others (`configs`); the rules weigh each configuration by its own GPU time.
//! - Memory: one index per kernel (4 bytes) to group them by name, and the durations of one
//!   kernel name at a time.

use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::occupancy::{occupancy, waves, BlockUse, Occupancy, SmLimits};
use crate::store::NONE;
use crate::views::LaunchConfig;
use crate::work::{pieces, PIECE_ROWS};
use gpufl_trace::StrId;
use serde::Serialize;
use std::collections::HashMap;

/// Substrings of kernel names that mark a vendor library's tuned kernel (cuBLAS / cuBLASLt, CUTLASS,
/// cuDNN, cuFFT, cuSPARSE): their registers and shared memory are chosen on purpose, often at low
/// occupancy, and the user cannot change them.
pub const LIBRARY_PATTERNS: [&str; 7] = [
    "xmma", "cutlass", "cublas", "cudnn", "nvjet", "cufft", "cusparse",
];

/// A kernel name for tables and titles: `void ns::kern<float, 4>(float*, int)` → `ns::kern`.
pub fn short_name(name: &str) -> &str {
    let f = crate::text::short_function(name);
    let f = f.strip_prefix("void ").unwrap_or(f);
    match f.find('<') {
        Some(i) if i > 0 => &f[..i],
        _ => f,
    }
}

/// The kernel's signature without `void ` and its parameter list (the first `(` outside template
/// brackets): tells template instantiations apart where the short names are the same.
pub fn signature(name: &str) -> &str {
    let n = name.strip_prefix("void ").unwrap_or(name);
    let mut depth = 0i32;
    for (i, c) in n.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 && i > 0 => return &n[..i],
            _ => {}
        }
    }
    n
}

/// [`signature`] made compact: no namespace or class qualifier (`at::native::F` → `F`), no
/// `(anonymous namespace)`, no casts of template values (`(unsigned long)3` → `3`), `> >` as
/// `>>`. `void at::native::k<4, at::native::F<float> >(int)` → `k<4, F<float>>`.
pub fn compact_signature(name: &str) -> String {
    let sig = signature(name).replace("(anonymous namespace)::", "");
    let mut out = String::with_capacity(sig.len());
    // Where the identifier being copied starts in `out` (its qualifiers are cut back to it).
    let mut ident_start = 0;
    let mut chars = sig.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                out.truncate(ident_start);
            }
            '(' => {
                // A cast of a template value, `(unsigned long)3`: dropped.
                let rest: String = chars.clone().take_while(|&x| x != ')').collect();
                let after = chars.clone().nth(rest.chars().count() + 1);
                let is_cast = !rest.is_empty()
                    && rest.chars().all(|x| x.is_ascii_lowercase() || x == ' ')
                    && after.is_some_and(|x| x.is_ascii_digit() || x == '-');
                if is_cast {
                    for _ in 0..=rest.chars().count() {
                        chars.next();
                    }
                } else {
                    out.push(c);
                }
                ident_start = out.len();
            }
            c if c.is_alphanumeric() || c == '_' || c == '~' => out.push(c),
            _ => {
                if c == '>' && out.ends_with(" >") {
                    out.pop();
                } else if c == '>' && out.ends_with(' ') && out.trim_end().ends_with('>') {
                    out.truncate(out.trim_end().len());
                }
                out.push(c);
                ident_start = out.len();
            }
        }
    }
    out
}

/// The names of a table's kernels where `shown[i]` (the name a table would print for kernel
/// `full[i]`, before clipping to `width` characters) would read the same as another row's once
/// clipped: [`compact_signature`]s, and where those still collide, the compact signature with the
/// part the rows share elided after the kernel's name (`k<…Mul<bool>>, array<char*, 3>>`; a name
/// without template arguments after its first 24 characters), at most `width` characters. Other
/// rows keep `shown`.
pub fn distinct_names(shown: &[String], full: &[&str], width: usize) -> Vec<String> {
    let clip = |s: &str| -> String { s.chars().take(width).collect() };
    let clipped: Vec<String> = shown.iter().map(|s| clip(s)).collect();
    // Rows of one kernel (on two devices) are not told apart by their names.
    let rival = |i: usize, j: usize| j != i && clipped[j] == clipped[i] && full[j] != full[i];
    let collides = |i: usize| (0..shown.len()).any(|j| rival(i, j));
    let compact: Vec<String> = full.iter().map(|n| compact_signature(n)).collect();
    (0..shown.len())
        .map(|i| {
            if !collides(i) {
                return shown[i].clone();
            }
            let group: Vec<usize> = (0..shown.len()).filter(|&j| rival(i, j)).collect();
            let c = &compact[i];
            if c.chars().count() <= width || group.iter().all(|&j| clip(&compact[j]) != clip(c)) {
                return c.clone();
            }
            // Identical compact forms (namespaces alone differ): the signatures, elided.
            let (mine, others): (&str, Vec<&str>) = if group.iter().any(|&j| compact[j] == *c) {
                (
                    signature(full[i]),
                    group.iter().map(|&j| signature(full[j])).collect(),
                )
            } else {
                (
                    c.as_str(),
                    group.iter().map(|&j| compact[j].as_str()).collect(),
                )
            };
            elide_shared(mine, &others, width)
        })
        .collect()
}

/// `s` with the part it shares with the closest of `others` elided after its first `<` (after its
/// first 24 characters when it has none), so that where it differs shows within `width`
/// characters.
fn elide_shared(s: &str, others: &[&str], width: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    let shared = others
        .iter()
        .map(|o| {
            chars
                .iter()
                .zip(o.chars())
                .take_while(|(a, b)| **a == *b)
                .count()
        })
        .max()
        .unwrap_or(0);
    // Kept before the elision: the kernel's name and `<`, or a name's first 24 characters.
    let head = chars
        .iter()
        .position(|&c| c == '<')
        .map_or(24.min(chars.len()), |p| p + 1);
    // Back to the start of the differing argument (at most 16 characters back).
    let mut start = shared.min(chars.len());
    let floor = start.saturating_sub(16).max(head);
    while start > floor && !matches!(chars[start - 1], '<' | ',' | ' ') {
        start -= 1;
    }
    let out: String = if start <= head + 1 {
        s.to_string()
    } else {
        chars[..head]
            .iter()
            .chain(std::iter::once(&'…'))
            .chain(&chars[start..])
            .collect()
    };
    if out.chars().count() > width {
        let mut t: String = out.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    } else {
        out
    }
}

/// Substrings of the kernels a framework runtime launches for itself, not for the user's program
/// (XLA's `stream_executor::` kernels: the one-thread `DelayKernel` timing its autotuning, redzone
/// checks). No kernel rule reports them: nothing the user writes changes them.
pub const RUNTIME_PATTERNS: [&str; 1] = ["stream_executor::"];

/// Whether a kernel is a framework runtime's own ([`RUNTIME_PATTERNS`]).
pub fn is_runtime_kernel(name: &str) -> bool {
    RUNTIME_PATTERNS.iter().any(|p| name.contains(p))
}

/// Whether a kernel name is a vendor library's ([`LIBRARY_PATTERNS`], case-insensitive).
pub fn is_library_kernel(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    LIBRARY_PATTERNS.iter().any(|p| lower.contains(p))
}

/// A generated kernel's source ([`KernelRow::source`]), as recorded.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    pub file: String,
    pub line: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One launch configuration of a kernel, with its share of the launches.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Variant {
    /// Index of the configuration in the model ([`Model::configs`]).
    #[serde(skip)]
    pub(crate) config_id: u32,
    pub config: LaunchConfig,
    pub launches: u64,
    pub gpu_ns: u64,
    pub occupancy: Option<Occupancy>,
    /// Grid blocks over the blocks one wave holds (`blocks_per_sm × SMs`).
    pub waves: Option<f64>,
}

/// One kernel name on one device.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelRow {
    /// Demangled kernel name.
    pub name: String,
    pub device: u32,
    /// Executions (a graph replay's run of the kernel counts as one).
    pub launches: u64,
    /// Of `launches`, the kernels CUDA graph launches ran (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub graph_runs: u64,
    /// Summed kernel durations, ns.
    pub total_ns: u64,
    pub mean_ns: u64,
    /// Median and 99th percentile (nearest rank) of the durations, ns.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// The distribution of the durations in power-of-2 buckets ([`log2_hist`]): `[k, n]` pairs,
    /// `n` kernels of `2^k` to `2^(k+1)` ns (`k` = 0 also holds 0 ns), `k` increasing, empty
    /// buckets left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duration_log2: Vec<(u8, u64)>,
    /// Union of the kernel's intervals, ns.
    pub busy_ns: u64,
    /// `busy_ns` over the device's busy time, 0..1.
    pub busy_share: f64,
    /// Distinct launch configurations.
    pub configs: u32,
    /// The configuration with the most GPU time (its figures below).
    pub launch: LaunchConfig,
    pub blocks: u64,
    pub threads_per_block: u64,
    /// Theoretical occupancy of that configuration (None without the device's limits).
    pub occupancy: Option<Occupancy>,
    pub waves: Option<f64>,
    /// A vendor library's kernel ([`LIBRARY_PATTERNS`]).
    pub library: bool,
    /// A communication library's kernel ([`crate::comm::is_comm_kernel`]): no kernel rule reports
    /// it (absent when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub comm: bool,
    /// Stack frame per thread from the module's cubin (`function` records), bytes: register
    /// spills, local arrays and call overhead, which `launch.local_mem` (CUPTI's) leaves out.
    /// None when the trace has no `function` record for the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_frame: Option<u32>,
    /// Where the kernel's source is, when the recorder found it (Triton kernels PyTorch Inductor
    /// generated: the file in Inductor's cache, the line of the kernel's `def`, and what Inductor
    /// says it was generated from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<KernelSource>,
    /// What the recorder counted inside the kernel (`kdetail` records: lanes per warp
    /// instruction, global sectors per request, bank conflicts), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<crate::kdetail::DetailSummary>,
    /// The device's busy time (union of kernels, copies, memsets), ns.
    #[serde(skip)]
    pub(crate) device_busy_ns: u64,
    /// Every configuration, most GPU time first (not serialized: the rules read it).
    #[serde(skip)]
    pub variants: Vec<Variant>,
    /// Model string ids of the name (one per trace file that interned it).
    #[serde(skip)]
    pub(crate) name_ids: Vec<u32>,
}

/// Limits a device's occupancy was computed with.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DeviceLimits {
    pub device: u32,
    pub limits: SmLimits,
}

/// The kernel table of a session.
#[derive(Serialize, Clone, Debug, PartialEq, Default)]
pub struct KernelTable {
    /// Per device with kernels and known limits.
    pub limits: Vec<DeviceLimits>,
    /// Most GPU time first (then name, then device).
    pub rows: Vec<KernelRow>,
    /// An always-on session: launches and times count the kernels recorded inside its windows
    /// only (absent otherwise).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub windows_only: bool,
}

impl KernelTable {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The limits of a device, if known.
    pub fn limits_of(&self, dev: u32) -> Option<&SmLimits> {
        self.limits
            .iter()
            .find(|d| d.device == dev)
            .map(|d| &d.limits)
    }
}

/// `(median, p99)` of the first fields, as the other rules compute them (median of an even count:
/// the lower middle plus half the gap; p99 nearest rank); `(0, 0)` when empty. Reorders `v`;
/// linear time (order statistics, no full sort).
fn median_p99<T: Copy + Ord + Into<u64>>(v: &mut [T]) -> (u64, u64) {
    let n = v.len();
    if n == 0 {
        return (0, 0);
    }
    let rank = (n * 99).div_ceil(100).max(1);
    let hi: u64 = (*v.select_nth_unstable(n / 2).1).into();
    // The p99 is at or above the upper middle: among the upper part only.
    let p99 = match (rank - 1).checked_sub(n / 2 + 1) {
        None => hi,
        Some(j) => (*v[n / 2 + 1..].select_nth_unstable(j).1).into(),
    };
    let med = if n % 2 == 1 {
        hi
    } else {
        // The lower middle is the largest of the part before the upper one.
        let lo = v[..n / 2].iter().map(|&x| x.into()).max().unwrap_or(hi);
        lo + (hi - lo) / 2
    };
    (med, p99)
}

/// Counts of durations (ns) in power-of-2 buckets: `(k, n)`, `n` durations in `2^k..2^(k+1)`
/// (`k` = 0 also holds 0), `k` increasing, empty buckets left out (at most 64 pairs).
pub fn log2_hist(durations: impl IntoIterator<Item = u64>) -> Vec<(u8, u64)> {
    let mut n = [0u64; 64];
    for d in durations {
        n[63 - (d | 1).leading_zeros() as usize] += 1;
    }
    n.iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(k, &c)| (k as u8, c))
        .collect()
}

fn sat_u32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

/// The occupancy and waves of one configuration on a device.
fn figures(l: Option<&SmLimits>, c: &LaunchConfig) -> (Option<Occupancy>, Option<f64>) {
    let Some(l) = l else { return (None, None) };
    let o = occupancy(
        l,
        BlockUse {
            threads: sat_u32(c.threads_per_block()),
            regs: c.regs as u32,
            smem: sat_u32(c.smem_bytes()),
            carveout: c.smem_executed,
        },
    );
    let w = o
        .as_ref()
        .and_then(|o| waves(l, o.blocks_per_sm, c.blocks()));
    (o, w)
}

/// A slot's work for one thread: its name group, device index, busy time and durations.
type SlotRun<'a> = (usize, usize, u64, Durs<'a>);

/// Kernel durations, ns: 4 bytes each when every kernel's fits (a kernel of 4.3 s or more is
/// rare), 8 otherwise.
#[derive(Debug)]
enum Durs<'a> {
    Narrow(&'a mut [u32]),
    Wide(&'a mut [u64]),
}

impl Default for Durs<'_> {
    fn default() -> Self {
        Durs::Narrow(&mut [])
    }
}

impl<'a> Durs<'a> {
    fn of(narrow: bool, n: &'a mut [u32], w: &'a mut [u64]) -> Durs<'a> {
        if narrow {
            Durs::Narrow(n)
        } else {
            Durs::Wide(w)
        }
    }

    fn len(&self) -> usize {
        match self {
            Durs::Narrow(v) => v.len(),
            Durs::Wide(v) => v.len(),
        }
    }

    fn split_at_mut(self, n: usize) -> (Durs<'a>, Durs<'a>) {
        match self {
            Durs::Narrow(v) => {
                let (a, b) = v.split_at_mut(n);
                (Durs::Narrow(a), Durs::Narrow(b))
            }
            Durs::Wide(v) => {
                let (a, b) = v.split_at_mut(n);
                (Durs::Wide(a), Durs::Wide(b))
            }
        }
    }

    /// Set duration `i` (`d` fits when the durations are narrow).
    #[inline]
    fn set(&mut self, i: usize, d: u64) {
        match self {
            Durs::Narrow(v) => v[i] = d as u32,
            Durs::Wide(v) => v[i] = d,
        }
    }

    /// Their sum (saturating), their median and p99 ([`median_p99`]; reorders them), and their
    /// [`log2_hist`].
    fn figures(&mut self) -> (u64, u64, u64, Vec<(u8, u64)>) {
        let sum = |a: u64, d: u64| a.saturating_add(d);
        match self {
            Durs::Narrow(v) => {
                let total = v.iter().fold(0u64, |a, &d| sum(a, d as u64));
                let hist = log2_hist(v.iter().map(|&d| d as u64));
                let (p50, p99) = median_p99(v);
                (total, p50, p99, hist)
            }
            Durs::Wide(v) => {
                let total = v.iter().fold(0u64, |a, &d| sum(a, d));
                let hist = log2_hist(v.iter().copied());
                let (p50, p99) = median_p99(v);
                (total, p50, p99, hist)
            }
        }
    }
}

/// `index` of a slot whose kernels came in start order (its union needs no second pass).
const NOT_LISTED: usize = usize::MAX;

/// One slot's kernels in a piece of the kernels (or in all pieces so far).
#[derive(Clone, Copy, Debug, Default)]
struct SlotCount {
    n: u64,
    /// Whether a non-empty kernel came; the first and last such start, the latest end.
    any: bool,
    first: u64,
    last: u64,
    top: u64,
    /// A non-empty kernel started before the one before it.
    unsorted: bool,
}

impl SlotCount {
    #[inline]
    fn add(&mut self, s: u64, e: u64) {
        self.n += 1;
        if e <= s {
            return;
        }
        if !self.any {
            (self.any, self.first) = (true, s);
        } else if s < self.last {
            self.unsorted = true;
        }
        self.last = s;
        self.top = self.top.max(e);
    }

    /// `next`, the same slot's count in the next piece, after this one.
    fn follow(&mut self, next: &SlotCount) {
        self.n += next.n;
        if !next.any {
            return;
        }
        self.unsorted |= next.unsorted || (self.any && next.first < self.last);
        if !self.any {
            (self.any, self.first) = (true, next.first);
        }
        self.last = next.last;
        self.top = self.top.max(next.top);
    }
}

/// One piece's counts: per slot, and (launches, GPU ns) per (name, configuration) pair and device.
struct PieceCount {
    slots: Vec<SlotCount>,
    /// The longest kernel, ns.
    max_dur: u64,
    per_launch: Vec<(u64, u64)>,
    per_launch_map: HashMap<(u32, u32), (u64, u64)>,
}

/// The kernel columns and how a kernel finds its slot.
struct KernelCols<'a, D: Fn(u32) -> usize> {
    k: &'a crate::model::Kernels,
    dense: bool,
    ndev: usize,
    launch_group: &'a [u32],
    /// Each kernel's slot when not `dense`.
    kslot: &'a [u32],
    dev_index: &'a D,
}

impl<D: Fn(u32) -> usize> KernelCols<'_, D> {
    #[inline]
    fn slot(&self, i: usize, l: u32, d: u32) -> usize {
        if self.dense {
            self.launch_group[l as usize] as usize * self.ndev + (self.dev_index)(d)
        } else {
            self.kslot[i] as usize
        }
    }

    /// Each slice of kernels `a..b` (chunk by chunk), with the index of its first.
    fn each(
        &self,
        (a, b): (usize, usize),
        mut f: impl FnMut(usize, &[u32], &[u32], &[u64], &[u64]),
    ) {
        let k = self.k;
        let mut i = a;
        let cols = k.launch.slices(a, b).zip(k.dev.slices(a, b));
        for ((ls, ds), (ss, es)) in cols.zip(k.start.slices(a, b).zip(k.end.slices(a, b))) {
            f(i, ls, ds, ss, es);
            i += ls.len();
        }
    }

    /// Count kernels `a..b`: per slot, and per (name, configuration) pair and device (a table of
    /// `launch_cells` when given, else a map).
    fn count(&self, r: (usize, usize), nslots: usize, launch_cells: Option<usize>) -> PieceCount {
        let mut pc = PieceCount {
            slots: vec![SlotCount::default(); nslots],
            max_dur: 0,
            per_launch: vec![(0, 0); launch_cells.unwrap_or(0)],
            per_launch_map: HashMap::new(),
        };
        let ndev = self.ndev;
        self.each(r, |i0, ls, ds, ss, es| {
            for j in 0..ls.len() {
                let (l, d, s, e) = (ls[j], ds[j], ss[j], es[j]);
                let di = (self.dev_index)(d);
                let slot = if self.dense {
                    self.launch_group[l as usize] as usize * ndev + di
                } else {
                    self.kslot[i0 + j] as usize
                };
                pc.slots[slot].add(s, e);
                let x = match launch_cells {
                    Some(_) => &mut pc.per_launch[l as usize * ndev + di],
                    None => pc.per_launch_map.entry((l, di as u32)).or_default(),
                };
                let d = e.saturating_sub(s);
                x.0 += 1;
                x.1 = x.1.saturating_add(d);
                pc.max_dur = pc.max_dur.max(d);
            }
        });
        pc
    }

    /// Write the durations of kernels `a..b` into their slots' regions (`dst`, one per slot, in
    /// order), and return each slot's busy time among them: its non-empty kernels' parts past the
    /// latest end before them (`top`: that end before the piece, per slot; meaningful when the
    /// slot's kernels come in start order).
    fn scatter(&self, r: (usize, usize), dst: &mut [Durs], mut top: Vec<u64>) -> Vec<u64> {
        let mut fill = vec![0usize; dst.len()];
        let mut busy = vec![0u64; dst.len()];
        self.each(r, |i0, ls, ds, ss, es| {
            for j in 0..ls.len() {
                let (s, e) = (ss[j], es[j]);
                let slot = self.slot(i0 + j, ls[j], ds[j]);
                dst[slot].set(fill[slot], e.saturating_sub(s));
                fill[slot] += 1;
                if e > s {
                    busy[slot] += e.saturating_sub(s.max(top[slot]));
                    top[slot] = top[slot].max(e);
                }
            }
        });
        busy
    }
}

/// Build the kernel table.
pub fn table(m: &Model, busy: &DeviceBusy) -> KernelTable {
    table_on(m, busy, 1)
}

/// [`table`], the rows (each a name on a device: the union, order statistics and variants of its
/// kernels) computed on up to `threads` threads.
pub fn table_on(m: &Model, busy: &DeviceBusy, threads: usize) -> KernelTable {
    table_in_pieces(
        m,
        busy,
        threads,
        (threads > 1).then_some((PIECE_ROWS, true)),
    )
}

/// [`table_on`], its counting and scattering passes in pieces of `rows` kernels when given
/// (and, when `bounded`, their per-slot figures stay small beside the kernels), else in one.
///
/// The kernels are grouped into slots, one per (name group, device) ([`SlotLayout`]); pieces of
/// them are counted per slot on the threads ([`KernelCols::count`], merged by [`Merged::of`]),
/// then their durations scattered slot by slot with each slot's busy time ([`slot_busy`]); each
/// slot's run of durations then makes a row ([`Rows::row`]).
fn table_in_pieces(
    m: &Model,
    busy: &DeviceBusy,
    threads: usize,
    piece_rows: Option<(usize, bool)>,
) -> KernelTable {
    let nk = m.kernel_count();
    if nk == 0 {
        return KernelTable::default();
    }
    let devs = m.devices();
    let groups = NameGroups::of(m);
    let ndev = devs.len().max(1);
    // `devs` is sorted; with one device, every kernel is its.
    let single = devs.len() <= 1;
    let dev_index = |d: u32| {
        if single {
            0
        } else {
            devs.binary_search(&d).unwrap_or(0)
        }
    };
    let layout = SlotLayout::of(m, &groups, ndev, &dev_index);
    let nslots = layout.nslots;
    // (launches, GPU ns) per (name, configuration) pair and device: dense, or only the pairs
    // present when dense would be far more than the kernels.
    let launch_dense = few_cells(m.launches.len(), ndev, nk);
    let launch_cells = if launch_dense {
        m.launches.len() * ndev
    } else {
        0
    };
    let cols = KernelCols {
        k: &m.kernels,
        dense: layout.dense,
        ndev,
        launch_group: &groups.launch_group,
        kslot: &layout.kslot,
        dev_index: &dev_index,
    };
    let kp = piece_ranges(nk, piece_rows, nslots + launch_cells);
    let counts: Vec<PieceCount> = pieces(kp.len(), threads, |p| {
        cols.count(kp[p], nslots, launch_dense.then_some(launch_cells))
    });
    let mut merged = Merged::of(&counts, nslots, launch_dense.then_some(ndev));
    let before = std::mem::take(&mut merged.before);
    // The kernels' durations, slot by slot (4 or 8 bytes per kernel).
    let narrow = counts.iter().all(|pc| pc.max_dur <= u32::MAX as u64);
    let mut narrow_durs: Vec<u32> = vec![0; if narrow { nk } else { 0 }];
    let mut wide_durs: Vec<u64> = vec![0; if narrow { 0 } else { nk }];
    let all = Durs::of(narrow, &mut narrow_durs, &mut wide_durs);
    let busy_of = slot_busy(&cols, (&kp, counts, before), &merged.slots, all, threads);
    drop(kp);
    let limits = device_limits(m, devs);
    let rows = Rows::new(m, busy, &limits, &groups, &merged);
    let all = Durs::of(narrow, &mut narrow_durs, &mut wide_durs);
    let rows = rows.compute(&layout.order, &busy_of, all, threads);
    KernelTable {
        limits,
        rows,
        windows_only: m.is_always_on(),
    }
}

/// Devices' limits from the header (GPU index = record `dev`).
fn device_limits(m: &Model, devs: &[u32]) -> Vec<DeviceLimits> {
    let mut limits: Vec<DeviceLimits> = Vec::new();
    if let Some(h) = m.header() {
        for &dev in devs {
            if let Some(l) = h
                .gpus
                .iter()
                .find(|g| g.index == dev)
                .and_then(SmLimits::from_gpu)
            {
                limits.push(DeviceLimits {
                    device: dev,
                    limits: l,
                });
            }
        }
    }
    limits
}

/// Whether a table of `a` entries per device stays small beside the kernels (else only the
/// entries present are numbered: many names on many devices, a hostile trace).
fn few_cells(a: usize, ndev: usize, nk: usize) -> bool {
    (a as u64).saturating_mul(ndev as u64) <= 2 * nk as u64 + 4096
}

/// Name groups: one per distinct kernel name string (trace files of a session intern names
/// again), numbered densely.
struct NameGroups {
    /// The group of each (name, configuration) pair ([`Model::launches`]).
    launch_group: Vec<u32>,
    /// The name ids of each group.
    names: Vec<Vec<u32>>,
}

impl NameGroups {
    fn of(m: &Model) -> NameGroups {
        let mut name_group: HashMap<&str, u32> = HashMap::new();
        let mut names: Vec<Vec<u32>> = Vec::new();
        let mut group_of_id: HashMap<u32, u32> = HashMap::new();
        let launch_group: Vec<u32> = m
            .launches
            .iter()
            .map(|&(name, _)| {
                *group_of_id.entry(name).or_insert_with(|| {
                    let n = names.len() as u32;
                    let g = *name_group.entry(m.str(StrId(name))).or_insert(n);
                    if g == n {
                        names.push(Vec::new());
                    }
                    names[g as usize].push(name);
                    g
                })
            })
            .collect();
        NameGroups {
            launch_group,
            names,
        }
    }

    /// The (name, configuration) pairs of each group.
    fn launches(&self) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); self.names.len()];
        for (l, &g) in self.launch_group.iter().enumerate() {
            out[g as usize].push(l as u32);
        }
        out
    }
}

/// Slots: (name group, device). Counting sort of the kernels' durations by slot: one sequential
/// pass to count, one to scatter, no gathers. Slots are numbered densely (group × devices +
/// device) unless that is far more than the kernels ([`few_cells`]), then only the (group,
/// device) pairs present are numbered.
struct SlotLayout {
    dense: bool,
    /// Each kernel's slot when not `dense`.
    kslot: Vec<u32>,
    nslots: usize,
    /// The slots in (group, device) order: (group, device index, slot).
    order: Vec<(usize, usize, usize)>,
}

impl SlotLayout {
    fn of(m: &Model, groups: &NameGroups, ndev: usize, dev_index: &impl Fn(u32) -> usize) -> Self {
        let k = &m.kernels;
        let ngroups = groups.names.len();
        let dense = few_cells(ngroups, ndev, m.kernel_count());
        if dense {
            return SlotLayout {
                dense,
                kslot: Vec::new(),
                nslots: ngroups * ndev,
                order: (0..ngroups)
                    .flat_map(|g| (0..ndev).map(move |di| (g, di, g * ndev + di)))
                    .collect(),
            };
        }
        let mut present: HashMap<(u32, u32), u32> = HashMap::new();
        let kslot: Vec<u32> = (0..m.kernel_count())
            .map(|i| {
                let key = (
                    groups.launch_group[k.launch.get(i) as usize],
                    dev_index(k.dev.get(i)) as u32,
                );
                let n = present.len() as u32;
                *present.entry(key).or_insert(n)
            })
            .collect();
        let mut order: Vec<(usize, usize, usize)> = present
            .iter()
            .map(|(&(g, di), &s)| (g as usize, di as usize, s as usize))
            .collect();
        order.sort_unstable();
        SlotLayout {
            dense,
            kslot,
            nslots: present.len(),
            order,
        }
    }
}

/// Pieces of the kernels, counted and then scattered on the threads (what one pass in order
/// computes: each piece's kernels land after those of the pieces before it), when their per-slot
/// figures (`cells` per piece) stay small beside the kernels; one piece otherwise.
fn piece_ranges(nk: usize, piece_rows: Option<(usize, bool)>, cells: usize) -> Vec<(usize, usize)> {
    match piece_rows {
        Some((r, bounded)) if r > 0 && (!bounded || cells * nk.div_ceil(r) <= nk / 4) => {
            (0..nk).step_by(r).map(|a| (a, (a + r).min(nk))).collect()
        }
        _ => vec![(0, nk)],
    }
}

/// The pieces' counts together.
struct Merged {
    /// Per slot, over every piece.
    slots: Vec<SlotCount>,
    /// Each piece's latest end before it, per slot (where its union sweep starts from).
    before: Vec<Vec<u64>>,
    /// (launches, GPU ns) per (name, configuration) pair and device: a table of `ndev` columns
    /// when dense, else a map.
    per_launch: Vec<(u64, u64)>,
    per_launch_map: HashMap<(u32, u32), (u64, u64)>,
    dense_ndev: Option<usize>,
}

impl Merged {
    /// `dense_ndev`: the devices, when the pieces counted per (name, configuration) pair and
    /// device in a table.
    fn of(counts: &[PieceCount], nslots: usize, dense_ndev: Option<usize>) -> Merged {
        let cells = counts.first().map_or(0, |pc| pc.per_launch.len());
        let mut out = Merged {
            slots: vec![SlotCount::default(); nslots],
            before: Vec::with_capacity(counts.len()),
            per_launch: vec![(0, 0); cells],
            per_launch_map: HashMap::new(),
            dense_ndev,
        };
        for pc in counts {
            out.before.push(out.slots.iter().map(|s| s.top).collect());
            for (a, b) in out.slots.iter_mut().zip(&pc.slots) {
                a.follow(b);
            }
            for (a, b) in out.per_launch.iter_mut().zip(&pc.per_launch) {
                (a.0, a.1) = (a.0 + b.0, a.1.saturating_add(b.1));
            }
            for (&key, b) in &pc.per_launch_map {
                let a = out.per_launch_map.entry(key).or_default();
                (a.0, a.1) = (a.0 + b.0, a.1.saturating_add(b.1));
            }
        }
        out
    }

    /// (launches, GPU ns) of (name, configuration) pair `l` on device index `di`.
    fn launch(&self, l: u32, di: usize) -> (u64, u64) {
        match self.dense_ndev {
            Some(ndev) => self.per_launch[l as usize * ndev + di],
            None => self
                .per_launch_map
                .get(&(l, di as u32))
                .copied()
                .unwrap_or_default(),
        }
    }
}

/// The pieces of the kernels (row ranges), their counts, and each one's latest end before it
/// per slot ([`Merged::before`]).
type Pieces<'p> = (&'p [(usize, usize)], Vec<PieceCount>, Vec<Vec<u64>>);

/// Scatter the kernels' durations into `all`, slot by slot (each (slot, piece) a region), and
/// return each slot's busy time: the union of its kernels, from each kernel's part past the
/// latest end before it while they come in start order, else from its intervals sorted.
fn slot_busy<D: Fn(u32) -> usize + Sync>(
    cols: &KernelCols<'_, D>,
    (kp, counts, before): Pieces<'_>,
    slots: &[SlotCount],
    all: Durs<'_>,
    threads: usize,
) -> Vec<u64> {
    let nslots = slots.len();
    let mut regions: Vec<Vec<Durs>> = (0..kp.len()).map(|_| Vec::with_capacity(nslots)).collect();
    {
        let mut rest = all;
        for s in 0..nslots {
            for (p, pc) in counts.iter().enumerate() {
                let (r, t) = std::mem::take(&mut rest).split_at_mut(pc.slots[s].n as usize);
                regions[p].push(r);
                rest = t;
            }
        }
    }
    drop(counts);
    let regions: Vec<std::sync::Mutex<Vec<Durs>>> =
        regions.into_iter().map(std::sync::Mutex::new).collect();
    let parts: Vec<Vec<u64>> = pieces(kp.len(), threads, |p| {
        let mut dst = std::mem::take(&mut *regions[p].lock().unwrap_or_else(|e| e.into_inner()));
        cols.scatter(kp[p], &mut dst, before[p].clone())
    });
    drop(regions);
    drop(before);
    let mut busy_of: Vec<u64> = vec![0; nslots];
    for part in parts {
        for (a, b) in busy_of.iter_mut().zip(part) {
            *a += b;
        }
    }
    unsorted_unions(cols, slots, &mut busy_of);
    busy_of
}

/// The busy time of the slots whose kernels do not come in start order: their unions from their
/// intervals sorted.
fn unsorted_unions<D: Fn(u32) -> usize>(
    cols: &KernelCols<'_, D>,
    slots: &[SlotCount],
    busy_of: &mut [u64],
) {
    let unsorted: Vec<usize> = (0..slots.len()).filter(|&s| slots[s].unsorted).collect();
    if unsorted.is_empty() {
        return;
    }
    let k = cols.k;
    let mut index = vec![NOT_LISTED; slots.len()];
    for (j, &s) in unsorted.iter().enumerate() {
        index[s] = j;
    }
    let mut runs: Vec<Vec<(u64, u64)>> = vec![Vec::new(); unsorted.len()];
    for (i, (st, en)) in k.start.iter().zip(k.end.iter()).enumerate() {
        if let Some(r) = runs.get_mut(index[cols.slot(i, k.launch.get(i), k.dev.get(i))]) {
            r.push((st, en));
        }
    }
    for (run, &s) in runs.iter_mut().zip(&unsorted) {
        busy_of[s] = crate::intervals::union_ns(run);
    }
}

/// What a row is made from besides its slot's kernels: the model, the devices' limits and busy
/// time, the name groups with their (name, configuration) pairs and counts, and the stack frames
/// and generated sources by name.
struct Rows<'a> {
    m: &'a Model,
    limits: &'a [DeviceLimits],
    group_names: &'a [Vec<u32>],
    group_launches: Vec<Vec<u32>>,
    merged: &'a Merged,
    frames: HashMap<&'a str, u32>,
    sources: HashMap<&'a str, KernelSource>,
    dev_busy: Vec<u64>,
}

impl<'a> Rows<'a> {
    fn new(
        m: &'a Model,
        busy: &DeviceBusy,
        limits: &'a [DeviceLimits],
        groups: &'a NameGroups,
        merged: &'a Merged,
    ) -> Rows<'a> {
        let devs = m.devices();
        let single = devs.len() == 1;
        let dev_busy: Vec<u64> = devs
            .iter()
            .map(|&d| {
                busy.intervals((!single).then_some(d))
                    .iter()
                    .map(|&(s, e)| e - s)
                    .sum()
            })
            .collect();
        Rows {
            m,
            limits,
            group_names: &groups.names,
            group_launches: groups.launches(),
            merged,
            frames: frames_by_name(m),
            sources: sources_by_name(m),
            dev_busy,
        }
    }

    /// The rows of the slots in `order`, their busy times `busy_of`, their durations in `all`
    /// (slot by slot), on up to `threads` threads; sorted, with their graph runs.
    fn compute(
        &self,
        order: &[(usize, usize, usize)],
        busy_of: &[u64],
        all: Durs<'_>,
        threads: usize,
    ) -> Vec<KernelRow> {
        let nslots = busy_of.len();
        // Each slot's kernels, in slot order.
        let mut runs: Vec<Option<Durs>> = Vec::with_capacity(nslots);
        let mut rest = all;
        for s in 0..nslots {
            let n = self.merged.slots[s].n as usize;
            let (run, r) = std::mem::take(&mut rest).split_at_mut(n);
            runs.push(Some(run));
            rest = r;
        }
        let tasks: Vec<std::sync::Mutex<Option<SlotRun>>> = order
            .iter()
            .map(|&(g, di, slot)| {
                let busy = busy_of[slot];
                std::sync::Mutex::new(runs[slot].take().map(|r| (g, di, busy, r)))
            })
            .collect();
        drop(runs);
        let row = |t: usize| -> Option<KernelRow> {
            let (g, di, busy_ns, run) = tasks[t].lock().ok()?.take()?;
            self.row(g, di, busy_ns, run)
        };
        // Rows are unique per (name, device): the order below does not depend on the threads.
        let mut rows: Vec<KernelRow> = crate::work::pieces(tasks.len(), threads, row)
            .into_iter()
            .flatten()
            .collect();
        rows.sort_by(|a, b| {
            b.total_ns
                .cmp(&a.total_ns)
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| a.device.cmp(&b.device))
        });
        graph_runs(self.m, &mut rows);
        rows
    }

    /// The row of name group `g` on device index `di`: its kernels' durations `run`, their busy
    /// time `busy_ns`.
    fn row(&self, g: usize, di: usize, busy_ns: u64, mut run: Durs) -> Option<KernelRow> {
        let m = self.m;
        let names = &self.group_names[g];
        let &dev = m.devices().get(di)?;
        if run.len() == 0 {
            return None;
        }
        let (total_ns, p50_ns, p99_ns, duration_log2) = run.figures();
        let launches = run.len() as u64;
        let variants = self.variants(g, di, dev);
        let top = variants.first()?;
        let device_busy_ns = self.dev_busy[di];
        let name = m.str(StrId(names[0])).to_string();
        Some(KernelRow {
            library: is_library_kernel(&name),
            comm: crate::comm::is_comm_kernel(&name),
            stack_frame: self.frames.get(name.as_str()).copied(),
            source: self.sources.get(name.as_str()).cloned(),
            detail: m
                .kernel_detail(&name, dev)
                .map(crate::kdetail::DetailSummary::of),
            name,
            device: dev,
            launches,
            graph_runs: 0,
            total_ns,
            mean_ns: total_ns / launches,
            p50_ns,
            p99_ns,
            duration_log2,
            busy_ns,
            busy_share: crate::text::share(busy_ns, device_busy_ns),
            device_busy_ns,
            configs: variants.len() as u32,
            launch: top.config,
            blocks: top.config.blocks(),
            threads_per_block: top.config.threads_per_block(),
            occupancy: top.occupancy.clone(),
            waves: top.waves,
            name_ids: names.clone(),
            variants,
        })
    }

    /// The launch configurations of name group `g` on device `dev` (index `di`), the most GPU
    /// time first.
    fn variants(&self, g: usize, di: usize, dev: u32) -> Vec<Variant> {
        let m = self.m;
        let dev_limits = self
            .limits
            .iter()
            .find(|d| d.device == dev)
            .map(|d| &d.limits);
        let mut variants: Vec<Variant> = self.group_launches[g]
            .iter()
            .filter_map(|&l| {
                let (n, ns) = self.merged.launch(l, di);
                if n == 0 {
                    return None;
                }
                let config_id = m.launches[l as usize].1;
                let config = m.configs[config_id as usize];
                let (occupancy, waves) = figures(dev_limits, &config);
                Some(Variant {
                    config_id,
                    config,
                    launches: n,
                    gpu_ns: ns,
                    occupancy,
                    waves,
                })
            })
            .collect();
        // One configuration can appear under several name ids (trace files): merge them.
        variants.sort_by_key(|v| v.config_id);
        variants.dedup_by(|b, a| {
            let same = a.config_id == b.config_id;
            if same {
                // Sums of a trace's durations: saturating, as the per-launch sums are.
                a.launches = a.launches.saturating_add(b.launches);
                a.gpu_ns = a.gpu_ns.saturating_add(b.gpu_ns);
            }
            same
        });
        variants.sort_by(|a, b| {
            (b.gpu_ns, b.launches, a.config_id).cmp(&(a.gpu_ns, a.launches, b.config_id))
        });
        variants
    }
}

/// Stack frames by name text (a `function` record may be in another trace file than the
/// kernels, with another string id).
fn frames_by_name(m: &Model) -> HashMap<&str, u32> {
    let mut frames: HashMap<&str, u32> = HashMap::new();
    for (&id, &b) in &m.stack_frames {
        let e = frames.entry(m.str(StrId(id))).or_insert(b);
        *e = (*e).max(b);
    }
    frames
}

/// Generated sources by name text, likewise (when trace files disagree, the smallest (file,
/// line, note) wins: the same in every run).
fn sources_by_name(m: &Model) -> HashMap<&str, KernelSource> {
    let mut sources: HashMap<&str, KernelSource> = HashMap::new();
    for (&id, &(file, line, note)) in &m.kernel_sources {
        let src = KernelSource {
            file: m.str(StrId(file)).to_string(),
            line,
            note: (note != NONE).then(|| m.str(StrId(note)).to_string()),
        };
        let e = sources
            .entry(m.str(StrId(id)))
            .or_insert_with(|| src.clone());
        if (&src.file, src.line, &src.note) < (&e.file, e.line, &e.note) {
            *e = src;
        }
    }
    sources
}

/// Of each row's kernels, those a CUDA graph launch ran (few rows have any).
fn graph_runs(m: &Model, rows: &mut [KernelRow]) {
    if m.graph_kernels.is_empty() {
        return;
    }
    let mut at: HashMap<(&str, u32), usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        at.insert((r.name.as_str(), r.device), i);
    }
    let mut runs = vec![0u64; rows.len()];
    for &(i, _) in &m.graph_kernels {
        let kr = m.kernel(i as usize);
        if let Some(&r) = at.get(&(m.str(kr.name), kr.dev)) {
            runs[r] += 1;
        }
    }
    drop(at);
    for (r, n) in rows.iter_mut().zip(runs) {
        r.graph_runs = n;
    }
}

/// Each target's time alone on its device: the time its kernels ran with no other kernel on the
/// device (the device's SMs to themselves). `devs`: the devices to look at; `target(launch, dev)`:
/// the index (below `targets`) whose time a kernel of that (name, configuration) pair and device
/// adds to, [`NONE`] for none (its kernels still count as the others running). Empty and inverted
/// kernels run for no time.
///
/// One pass over the kernel columns, chunk by chunk, sweeping each device's kernels while they
/// come in start order (as the recorder nearly always writes them; see [`AloneSweep`]). A device
/// whose starts go back is swept again from its kernels sorted by start (4 bytes per kernel).
pub(crate) fn alone_times(
    m: &Model,
    devs: &[u32],
    targets: usize,
    target: impl Fn(u32, u32) -> u32,
) -> Vec<u64> {
    let k = &m.kernels;
    let mut sweeps: Vec<AloneSweep> = devs.iter().map(|_| AloneSweep::new(targets)).collect();
    // With one device in the model and among `devs`, every kernel is its.
    let one = devs.len() == 1 && m.devices() == devs;
    let cols = k.start.chunks().zip(k.end.chunks());
    for ((ss, es), (ls, ds)) in cols.zip(k.launch.chunks().zip(k.dev.chunks())) {
        for (j, (&s, &e)) in ss.iter().zip(es).enumerate() {
            if e <= s {
                continue;
            }
            let (l, dev) = (ls[j], ds[j]);
            let d = if one {
                0
            } else {
                match devs.iter().position(|&x| x == dev) {
                    Some(d) => d,
                    None => continue,
                }
            };
            let sw = &mut sweeps[d];
            if sw.out_of_order {
                continue;
            }
            if s < sw.last_start {
                sw.out_of_order = true;
                continue;
            }
            sw.add(s, e, target(l, dev));
        }
    }
    let mut alone = vec![0u64; targets];
    for (d, mut sw) in sweeps.into_iter().enumerate() {
        if sw.out_of_order {
            let dev = devs[d];
            let mut idx: Vec<u32> = (0..k.start.len() as u32)
                .filter(|&i| {
                    let i = i as usize;
                    k.end.get(i) > k.start.get(i) && (one || k.dev.get(i) == dev)
                })
                .collect();
            idx.sort_unstable_by_key(|&i| k.start.get(i as usize));
            sw = AloneSweep::new(targets);
            for i in idx {
                let i = i as usize;
                sw.add(k.start.get(i), k.end.get(i), target(k.launch.get(i), dev));
            }
        }
        for (a, t) in alone.iter_mut().zip(sw.finish()) {
            *a += t;
        }
    }
    alone
}

/// The sweep of [`alone_times`] over one device's non-empty kernels in start order. Between two
/// consecutive starts the kernels running are those started so far that have not ended: exactly
/// one runs from when the second-latest end has passed until the latest end, and it is the
/// kernel of the latest end. So the two latest ends so far are all the state (no heap of the
/// running kernels' ends).
struct AloneSweep {
    last_start: u64,
    /// The latest end so far, its kernel's target, and the second-latest end.
    top: u64,
    who: u32,
    second: u64,
    out_of_order: bool,
    alone: Vec<u64>,
}

impl AloneSweep {
    fn new(targets: usize) -> AloneSweep {
        AloneSweep {
            last_start: 0,
            top: 0,
            who: NONE,
            second: 0,
            out_of_order: false,
            alone: vec![0; targets],
        }
    }

    /// Time alone from the last start up to `t` (no start in between).
    #[inline]
    fn upto(&mut self, t: u64) {
        let d = t
            .min(self.top)
            .saturating_sub(self.last_start.max(self.second));
        if d > 0 && self.who != NONE {
            self.alone[self.who as usize] += d;
        }
    }

    /// A kernel `[s, e)`, `e > s`, starting no earlier than the previous one.
    #[inline]
    fn add(&mut self, s: u64, e: u64, target: u32) {
        self.upto(s);
        self.last_start = s;
        if e > self.top {
            self.second = self.top;
            (self.top, self.who) = (e, target);
        } else if e > self.second {
            self.second = e;
        }
    }

    fn finish(mut self) -> Vec<u64> {
        self.upto(u64::MAX);
        self.alone
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn signatures_drop_void_and_parameters_but_keep_templates() {
        assert_eq!(
            signature("void at::native::k<4, at::native::F<float>>(int, at::native::F<float>)"),
            "at::native::k<4, at::native::F<float>>"
        );
        assert_eq!(signature("small_grid(float*, int)"), "small_grid");
        assert_eq!(signature("(anonymous)"), "(anonymous)");
    }

    const MUL: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<bool, bool, bool, at::native::binary_internal::MulFunctor<bool> >, std::array<char*, (unsigned long)3> >(int, at::native::BinaryFunctor<bool, bool, bool, at::native::binary_internal::MulFunctor<bool> >, std::array<char*, (unsigned long)3>)";
    const EQ: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, bool, at::native::(anonymous namespace)::CompareEqFunctor<c10::BFloat16> >, std::array<char*, (unsigned long)3> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, bool, at::native::(anonymous namespace)::CompareEqFunctor<c10::BFloat16> >, std::array<char*, (unsigned long)3>)";

    #[test]
    fn compact_signatures_drop_qualifiers_and_casts() {
        assert_eq!(
            compact_signature(MUL),
            "vectorized_elementwise_kernel<4, BinaryFunctor<bool, bool, bool, MulFunctor<bool>>, array<char*, 3>>"
        );
        assert_eq!(
            compact_signature(EQ),
            "vectorized_elementwise_kernel<4, BinaryFunctor<BFloat16, BFloat16, bool, CompareEqFunctor<BFloat16>>, array<char*, 3>>"
        );
        assert_eq!(compact_signature("small_grid(float*, int)"), "small_grid");
        assert_eq!(compact_signature("void ns::k<(int)-1>(int)"), "k<-1>");
        assert_eq!(compact_signature("(anonymous)"), "(anonymous)");
    }

    #[test]
    fn rows_that_would_read_the_same_are_told_apart() {
        let shown: Vec<String> = [MUL, EQ, "void other<1>(int)"]
            .iter()
            .map(|n| signature(n).to_string())
            .collect();
        let names = distinct_names(&shown, &[MUL, EQ, "void other<1>(int)"], 60);
        assert_eq!(
            names[2], "other<1>",
            "a row that does not collide keeps its name"
        );
        // Compact forms differ within 60 characters: they are the names (clipped by the table).
        assert_eq!(names[0], compact_signature(MUL));
        assert_eq!(names[1], compact_signature(EQ));
        // Within 45 they would not: the shared part is elided.
        let names = distinct_names(&shown, &[MUL, EQ, "void other<1>(int)"], 45);
        assert_eq!(names[0], "vectorized_elementwise_kernel<…bool, bool, b…");
        assert_eq!(names[1], "vectorized_elementwise_kernel<…BFloat16, BFl…");
        // One kernel on two devices: its name twice.
        let shown = vec!["k".to_string(), "k".to_string()];
        assert_eq!(distinct_names(&shown, &["k<1>()", "k<1>()"], 60), shown);
        // Rows that fit stay as they were.
        let shown = vec!["k<1>".to_string(), "k<2>".to_string()];
        assert_eq!(distinct_names(&shown, &["k<1>()", "k<2>()"], 60), shown);
        // Same compact form: the signatures, the shared part elided.
        let a = "void a::k<float, float, float, float, float, float, float, p::Y>(int)";
        let b = "void a::k<float, float, float, float, float, float, float, q::Y>(int)";
        let shown = vec![signature(a).to_string(), signature(b).to_string()];
        let names = distinct_names(&shown, &[a, b], 30);
        assert_eq!(names, ["a::k<…p::Y>", "a::k<…q::Y>"]);
    }

    use super::*;

    #[test]
    fn library_kernels_by_name() {
        assert!(is_library_kernel(
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel"
        ));
        assert!(is_library_kernel(
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)"
        ));
        assert!(!is_library_kernel("regs_heavy(float const*, float*, int)"));
        assert!(!is_library_kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()"
        ));
    }

    /// Time alone of each kernel by brute force: over every elementary interval between two
    /// instants where a kernel starts or ends, who runs there.
    fn naive_alone(spans: &[(u64, u64, u32)], dev: u32) -> Vec<u64> {
        let on: Vec<usize> = (0..spans.len())
            .filter(|&i| spans[i].2 == dev && spans[i].1 > spans[i].0)
            .collect();
        let mut ts: Vec<u64> = on.iter().flat_map(|&i| [spans[i].0, spans[i].1]).collect();
        ts.sort_unstable();
        ts.dedup();
        let mut alone = vec![0; spans.len()];
        for w in ts.windows(2) {
            let running: Vec<usize> = on
                .iter()
                .copied()
                .filter(|&i| spans[i].0 <= w[0] && spans[i].1 >= w[1])
                .collect();
            if let [i] = running[..] {
                alone[i] += w[1] - w[0];
            }
        }
        alone
    }

    #[test]
    fn time_alone_in_start_order_shuffled_and_by_device_matches_brute_force() {
        use gpufl_trace::{Kernel, Record};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for round in 0..60 {
            let devices = 1 + round % 3;
            let mut t = 0;
            // (start, end, device); some empty and inverted, many touching and overlapping.
            let mut spans: Vec<(u64, u64, u32)> = (0..150)
                .map(|_| {
                    t += rnd(if round % 2 == 0 { 50 } else { 3 });
                    let len = rnd(if round % 3 == 0 { 400 } else { 40 });
                    let end = if rnd(20) == 0 {
                        t.saturating_sub(len)
                    } else {
                        t + len
                    };
                    (t, end, rnd(devices) as u32)
                })
                .collect();
            if round % 4 == 1 {
                // Starts that go back: the sorted path.
                for _ in 0..5 {
                    let (a, b) = (rnd(150) as usize, rnd(150) as usize);
                    spans.swap(a, b);
                }
            }
            // Each kernel its own (name, configuration) pair: the launch index is the record's.
            let recs: Vec<Record> = spans
                .iter()
                .enumerate()
                .map(|(i, &(start, end, dev))| {
                    Record::Kernel(Kernel {
                        start,
                        end,
                        dev,
                        grid: [i as i32 + 1, 1, 1],
                        ..Kernel::default()
                    })
                })
                .collect();
            let m = Model::load(recs);
            assert_eq!(m.launches.len(), spans.len());
            let devs: Vec<u32> = m.devices().to_vec();
            // Every kernel a target, on every device; then the odd ones only, on the last device.
            let all = alone_times(&m, &devs, spans.len(), |l, _| l);
            let mut want = vec![0; spans.len()];
            for &d in &devs {
                for (w, a) in want.iter_mut().zip(naive_alone(&spans, d)) {
                    *w += a;
                }
            }
            assert_eq!(all, want, "round {round}");
            assert!(all.iter().any(|&a| a > 0));
            let last = *devs.last().expect("kernels");
            let odd = alone_times(
                &m,
                &[last],
                spans.len(),
                |l, _| {
                    if l % 2 == 1 {
                        l
                    } else {
                        NONE
                    }
                },
            );
            let want = naive_alone(&spans, last);
            for (i, (&got, &w)) in odd.iter().zip(&want).enumerate() {
                assert_eq!(
                    got,
                    if i % 2 == 1 { w } else { 0 },
                    "round {round}, kernel {i}"
                );
            }
        }
    }

    #[test]
    fn time_alone_of_overlapping_touching_and_empty_kernels() {
        use gpufl_trace::{Kernel, Record};
        let k = |start, end, x| {
            Record::Kernel(Kernel {
                start,
                end,
                grid: [x, 1, 1],
                ..Kernel::default()
            })
        };
        // A [0,100) alone until B [40,60) joins; C [100,150) touches A's end; D [200,200) is
        // empty; E [120,110) is inverted.
        let m = Model::load([
            k(0, 100, 1),
            k(40, 60, 2),
            k(100, 150, 3),
            k(200, 200, 4),
            k(120, 110, 5),
        ]);
        assert_eq!(alone_times(&m, &[0], 5, |l, _| l), vec![80, 0, 50, 0, 0]);
        // Two targets may share a kernel's time: here A and C add to target 0.
        assert_eq!(
            alone_times(&m, &[0], 1, |l, _| if l == 0 || l == 2 { 0 } else { NONE }),
            vec![130]
        );
        // A device without kernels.
        assert_eq!(alone_times(&m, &[7], 5, |l, _| l), vec![0; 5]);
    }

    #[test]
    fn table_counted_in_pieces_is_the_table_counted_in_one() {
        use gpufl_trace::{Kernel, Record};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for round in 0..12 {
            let devices = 1 + round % 3;
            let names = [1, 3, 40][round as usize % 3];
            let mut t = 0;
            let mut recs: Vec<Record> = (0..3000)
                .map(|_| {
                    t += rnd(if round % 2 == 0 { 500 } else { 5 });
                    let len = rnd(2000);
                    // Some empty and inverted kernels.
                    let end = match rnd(30) {
                        0 => t,
                        1 => t.saturating_sub(len),
                        _ => t + len,
                    };
                    Record::Kernel(Kernel {
                        name: gpufl_trace::StrId(rnd(names) as u32),
                        start: t,
                        end,
                        dev: rnd(devices) as u32,
                        grid: [1 + rnd(3) as i32, 1, 1],
                        ..Kernel::default()
                    })
                })
                .collect();
            if round % 4 == 3 {
                // Kernels out of start order: those slots take the sorting path.
                for _ in 0..20 {
                    let (a, b) = (rnd(3000) as usize, rnd(3000) as usize);
                    recs.swap(a, b);
                }
            }
            if round % 6 == 5 {
                // A kernel of more than 2^32 ns: durations kept in 8 bytes.
                if let Record::Kernel(k) = &mut recs[1500] {
                    k.end = k.start + (5 << 30);
                }
            }
            // Names: ids 0 and 1 are one string (two trace files interning it), the others their
            // own.
            let strs = (0..names as u32).map(|i| {
                Record::Str(gpufl_trace::StrRecord {
                    id: gpufl_trace::StrId(i),
                    s: format!("kernel_{}", i.max(1)),
                })
            });
            let m = Model::load(strs.chain(recs.iter().cloned()));
            let busy = DeviceBusy::new(&m);
            let one = table_in_pieces(&m, &busy, 1, None);
            assert!(!one.rows.is_empty());
            // Each row's figures from its kernels, sorted.
            for row in &one.rows {
                let mut d: Vec<u64> = m
                    .kernels()
                    .filter(|k| m.str(k.name) == row.name && k.dev == row.device)
                    .map(|k| k.end.saturating_sub(k.start))
                    .collect();
                d.sort_unstable();
                let n = d.len();
                let med = d[(n - 1) / 2] + (d[n / 2] - d[(n - 1) / 2]) / 2;
                let p99 = d[(n * 99).div_ceil(100).max(1) - 1];
                let total: u64 = d.iter().sum();
                assert_eq!(
                    (row.launches, row.total_ns, row.p50_ns, row.p99_ns),
                    (n as u64, total, med, p99),
                    "round {round}, {}",
                    row.name
                );
                // The histogram counts every kernel once, each in its power-of-2 bucket.
                let mut want: Vec<(u8, u64)> = Vec::new();
                for &x in &d {
                    let k = if x < 2 { 0 } else { x.ilog2() as u8 };
                    match want.iter_mut().find(|w| w.0 == k) {
                        Some(w) => w.1 += 1,
                        None => want.push((k, 1)),
                    }
                }
                want.sort_unstable();
                assert_eq!(row.duration_log2, want, "round {round}, {}", row.name);
            }
            // Pieces of any size, on one thread and on several; boundaries inside runs of a slot.
            for (rows, threads) in [(1, 1), (7, 3), (64, 2), (999, 4), (2999, 2), (5000, 3)] {
                let got = table_in_pieces(&m, &busy, threads, Some((rows, false)));
                assert_eq!(got, one, "round {round}, pieces of {rows}");
            }
        }
    }

    #[test]
    fn durations_in_power_of_two_buckets() {
        assert_eq!(log2_hist([]), vec![]);
        assert_eq!(log2_hist([0, 1]), vec![(0, 2)]);
        assert_eq!(log2_hist([2, 3, 4, 7, 8]), vec![(1, 2), (2, 2), (3, 1)]);
        assert_eq!(
            log2_hist([1023, 1024, u64::MAX, 1 << 63]),
            vec![(9, 1), (10, 1), (63, 2)]
        );
    }

    #[test]
    fn percentiles_by_order_statistics() {
        let p = |v: &[u64]| median_p99(&mut v.to_vec());
        assert_eq!(p(&[]), (0, 0));
        assert_eq!(p(&[5]), (5, 5));
        assert_eq!(p(&[3, 1]), (2, 3));
        assert_eq!(p(&[9, 1, 5]), (5, 9));
        // 1..=200 shuffled: median (100 + 101) / 2 → 100 (integer); p99: rank 198.
        let v: Vec<u64> = (0..200u64).map(|i| (i * 73) % 200 + 1).collect();
        assert_eq!(p(&v), (100, 198));
        // Against a full sort, on random lengths and values (with repeats).
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for n in (1..300).chain([999, 1000, 1001, 4096]) {
            let v: Vec<u64> = (0..n)
                .map(|_| rnd(if n % 2 == 0 { 50 } else { 1 << 40 }))
                .collect();
            let mut sorted = v.clone();
            sorted.sort_unstable();
            let n = n as usize;
            let (lo, hi) = (sorted[(n - 1) / 2], sorted[n / 2]);
            let rank = (n * 99).div_ceil(100).max(1);
            assert_eq!(p(&v), (lo + (hi - lo) / 2, sorted[rank - 1]), "{n}");
        }
    }
}
