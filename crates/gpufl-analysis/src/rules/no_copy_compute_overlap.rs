//! Rule `no-copy-compute-overlap`: host-to-device copies, then kernels, then device-to-host copies,
//! one after the other with no copy overlapping any kernel — the seed's sequential pipeline, which
//! chunks on 2–4 streams would overlap.
//!
//! - **Sequences:** in start order, one or more H2D copies, then one or more kernels, then one or
//!   more D2H copies (memsets and other copies are skipped; anything else out of order breaks the
//!   sequence). They are looked for on each stream and on each device's whole timeline, so work
//!   that other streams serialize (the legacy default stream is a barrier for blocking streams)
//!   counts too; a sequence found both ways counts once.
//! - **Fires** for a sequence whose stages take at least [`MIN_SEQUENCE_NS`] together, during
//!   whose span (first copy's start to last copy's end) kernels and copies of the device
//!   overlapped for at most [`MAX_OVERLAP_PCT`] % of the span (clock jitter), which its stages
//!   fill at least [`MIN_BUSY_PCT`] % of (not mostly host pauses), and whose copy and
//!   compute stages are comparable: both copy stages together at least [`MIN_COPY_PCT`] % and at
//!   most [`MAX_COPY_RATIO`] times the kernel stage (outside that range one side dominates and
//!   overlap hides little).
//! - **Stages:** summed GPU time of each stage's ops; the measured time is their sum (what the
//!   pipeline model splits, [`crate::pipeline`]); predictions with 2 and 4 streams (`chunks =
//!   streams`, the seed's model: 80 ms → 55 ms → 42.5 ms).
//! - **One insight per user line** of the sequences' first H2D copy (its call site; else another
//!   op's of the sequence; in sessions without call sites, the next synchronization with a stack
//!   on the copying thread — approximate, said in the insight), over all its sequences.
//! - **Impact:** measured time − the 4-stream prediction, summed over the sequences.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::ids::LocIx;
use crate::insight::{fmt_duration, in_function, Insight};
use crate::model::Model;
use crate::pipeline::{predict, Prediction, Stages};
use crate::shared::advice::Fix;
use crate::shared::timeline::{
    device_timelines, issuing_api, location_note, op_corr, op_end, op_start, BusyIndex,
    LocationSource, Locator,
};
use crate::shared::Ctx;
use crate::views::copy_kind_to_u8;
use gpufl_trace::CopyKind;
use serde::Serialize;

pub(crate) const RULE: &str = "no-copy-compute-overlap";
/// Shortest sequence (stages together) worth chunking: below it, per-chunk launch and copy
/// overheads (~5–10 µs per op) eat the gain.
pub const MIN_SEQUENCE_NS: u64 = 100_000;
/// Copy stages together at least this share of the kernel stage, percent…
pub const MIN_COPY_PCT: u64 = 25;
/// …and at most this many times the kernel stage.
pub const MAX_COPY_RATIO: u64 = 4;
/// Kernel/copy overlap tolerated within a sequence's span, percent of the span.
pub const MAX_OVERLAP_PCT: u64 = 1;
/// The stages must fill at least this share of the sequence's span, percent: when host pauses
/// dominate the span, the missing overlap is not what costs the time (gpu-idle reports those).
pub const MIN_BUSY_PCT: u64 = 50;

const FIX: Fix = Fix {
    native: "Split the data into chunks and pipeline them over 2–4 non-default streams (per chunk: \
cudaMemcpyAsync host-to-device, the kernel, cudaMemcpyAsync device-to-host, all on the \
chunk's stream) with pinned host memory (cudaMallocHost), so that one chunk's copies overlap \
another's kernels; keep this work off the legacy default stream, which serializes with every \
blocking stream.",
    python: None,
    torch: Some("Split the data into chunks and pipeline them over 2–4 streams (per chunk, under with \
torch.cuda.stream(s): the host-to-device copy with .to(device, non_blocking=True), the \
compute, the copy back with non_blocking=True) from pinned tensors (tensor.pin_memory(), \
DataLoader(pin_memory=True)), so that one chunk's copies overlap another's kernels; or \
prefetch the next batch on a side stream while this one computes."),
    jax: None,
    cupy: Some("Split the data into chunks and pipeline them over 2–4 streams you created (per chunk, under \
with cupy.cuda.Stream(non_blocking=True): the host-to-device copy, the kernel, the copy \
back) from pinned host memory (cupyx.empty_pinned), so that one chunk's copies overlap \
another's kernels."),
};

/// The rule's own figures (sums over the line's sequences).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    /// Sequences at this line.
    pub sequences: u64,
    /// Summed GPU time of each stage.
    pub stages: Stages,
    /// The stages one after the other: what the sequences took, ns.
    pub measured_ns: u64,
    /// Wall span of the sequences (first op's start to last op's end), summed.
    pub span_ns: u64,
    /// Predicted with 2 streams (2 chunks), summed over sequences; speedup = measured / predicted.
    pub two_streams: Prediction,
    /// Predicted with 4 streams.
    pub four_streams: Prediction,
    pub location_source: LocationSource,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cls {
    H2D,
    Kernel,
    D2H,
    Skip,
}

/// One sequence: its ops of note and stage times.
#[derive(Clone, Copy, Debug)]
struct Seq {
    first_h2d: u32,
    first_kernel: Option<u32>,
    first_d2h: Option<u32>,
    start: u64,
    end: u64,
    stages: Stages,
}

struct Classes {
    nk: usize,
    h2d: [u8; 2],
    d2h: [u8; 2],
}

impl Classes {
    fn new(m: &Model) -> Classes {
        Classes {
            nk: m.kernel_count(),
            h2d: [
                copy_kind_to_u8(CopyKind::HtoD),
                copy_kind_to_u8(CopyKind::HtoA),
            ],
            d2h: [
                copy_kind_to_u8(CopyKind::DtoH),
                copy_kind_to_u8(CopyKind::AtoH),
            ],
        }
    }

    fn of(&self, m: &Model, op: u32) -> Cls {
        let i = op as usize;
        if i < self.nk {
            return Cls::Kernel;
        }
        let k = m.copies.op.get(i - self.nk);
        if self.h2d.contains(&k) {
            Cls::H2D
        } else if self.d2h.contains(&k) {
            Cls::D2H
        } else {
            Cls::Skip
        }
    }
}

/// Find H2D+ → kernel+ → D2H+ sequences in `ops` (in start order).
fn scan(m: &Model, cls: &Classes, ops: impl Iterator<Item = u32>, out: &mut Vec<Seq>) {
    // The sequence being built and the stage it is in.
    let mut cur: Option<(Seq, Cls)> = None;
    for op in ops {
        let c = cls.of(m, op);
        if c == Cls::Skip {
            continue;
        }
        let (s, e) = (op_start(m, op), op_end(m, op));
        let d = e - s;
        let fresh = |op: u32| Seq {
            first_h2d: op,
            first_kernel: None,
            first_d2h: None,
            start: s,
            end: e,
            stages: Stages {
                h2d_ns: d,
                kernel_ns: 0,
                d2h_ns: 0,
            },
        };
        cur = match (c, cur) {
            (Cls::H2D, Some((q, Cls::D2H))) => {
                out.push(q);
                Some((fresh(op), Cls::H2D))
            }
            (Cls::H2D, Some((mut q, Cls::H2D))) => {
                q.stages.h2d_ns += d;
                q.end = q.end.max(e);
                Some((q, Cls::H2D))
            }
            (Cls::H2D, _) => Some((fresh(op), Cls::H2D)),
            (Cls::Kernel, Some((mut q, Cls::H2D | Cls::Kernel))) => {
                q.first_kernel.get_or_insert(op);
                q.stages.kernel_ns += d;
                q.end = q.end.max(e);
                Some((q, Cls::Kernel))
            }
            (Cls::Kernel, Some((q, Cls::D2H))) => {
                out.push(q);
                None
            }
            (Cls::D2H, Some((mut q, Cls::Kernel | Cls::D2H))) => {
                q.first_d2h.get_or_insert(op);
                q.stages.d2h_ns += d;
                q.end = q.end.max(e);
                Some((q, Cls::D2H))
            }
            _ => None,
        };
    }
    if let Some((q, Cls::D2H)) = cur {
        out.push(q);
    }
}

/// Kernel ∩ memcpy time on one device (ops sorted by start, memsets left out): a sweep keeping
/// the latest end of each kind; every point where both run is found when the later of the two
/// starts.
fn overlap_index(m: &Model, cls: &Classes, ops: &[u32]) -> BusyIndex {
    let (mut kmax, mut cmax) = (0u64, 0u64);
    let mut iv = Vec::new();
    for &op in ops {
        let (s, e) = (op_start(m, op), op_end(m, op));
        if (op as usize) < cls.nk {
            if cmax > s {
                iv.push((s, e.min(cmax)));
            }
            kmax = kmax.max(e);
        } else {
            if kmax > s {
                iv.push((s, e.min(kmax)));
            }
            cmax = cmax.max(e);
        }
    }
    BusyIndex::from_intervals(iv)
}

fn comparable(st: &Stages) -> bool {
    let copies = st.h2d_ns as u128 + st.d2h_ns as u128;
    let k = st.kernel_ns as u128;
    k > 0 && copies * 100 >= k * MIN_COPY_PCT as u128 && copies <= k * MAX_COPY_RATIO as u128
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let m = cx.m;
    let cls = Classes::new(m);
    let has = |set: [u8; 2]| m.copies.op.iter().any(|k| set.contains(&k));
    if m.kernel_count() == 0 || !has(cls.h2d) || !has(cls.d2h) {
        return Vec::new();
    }
    let mut found: Vec<Seq> = Vec::new();
    for (_, ops) in device_timelines(m, false) {
        let mut cand = Vec::new();
        // Each stream on its own: ops grouped by (context, stream), in start order.
        // Stable: each stream's ops stay in start order.
        let mut by_stream: Vec<u32> = ops.clone();
        by_stream.sort_by_key(|&op| stream_key(m, &cls, op));
        let mut i = 0;
        while i < by_stream.len() {
            let key = stream_key(m, &cls, by_stream[i]);
            let j = i + by_stream[i..]
                .iter()
                .take_while(|&&op| stream_key(m, &cls, op) == key)
                .count();
            scan(m, &cls, by_stream[i..j].iter().copied(), &mut cand);
            i = j;
        }
        drop(by_stream);
        // The device's whole timeline.
        scan(m, &cls, ops.iter().copied(), &mut cand);
        cand.retain(|q| {
            let t = q.stages.sequential_ns();
            t >= MIN_SEQUENCE_NS
                && comparable(&q.stages)
                && t as u128 * 100 >= (q.end - q.start) as u128 * MIN_BUSY_PCT as u128
        });
        if cand.is_empty() {
            continue;
        }
        let ov = overlap_index(m, &cls, &ops);
        cand.retain(|q| {
            ov.busy_in(q.start, q.end) as u128 * 100
                <= (q.end - q.start) as u128 * MAX_OVERLAP_PCT as u128
        });
        // A sequence found on its stream and on the device timeline (or overlapping another)
        // counts once.
        cand.sort_by_key(|q| (q.start, std::cmp::Reverse(q.end), q.first_h2d));
        let mut last_end = 0u64;
        for q in cand {
            if q.start < last_end {
                continue;
            }
            last_end = q.end;
            found.push(q);
        }
    }
    if found.is_empty() {
        return Vec::new();
    }
    let locator = Locator::new(cx);
    let mut located: Vec<(Option<LocIx>, LocationSource, Seq)> = found
        .into_iter()
        .map(|q| {
            let (loc, src) = locate(cx, &locator, &q);
            (loc, src, q)
        })
        .collect();
    // The lines in order, the sequences without one last.
    located.sort_by_key(|x| (x.0.is_none(), x.0, x.2.start));
    located
        .chunk_by(|a, b| a.0 == b.0)
        .map(|line| insight(cx, &locator, line))
        .collect()
}

fn stream_key(m: &Model, cls: &Classes, op: u32) -> u64 {
    let i = op as usize;
    let (ctx, stream) = if i < cls.nk {
        (m.kernels.ctx.get(i), m.kernels.stream.get(i))
    } else {
        (
            m.copies.ctx.get(i - cls.nk),
            m.copies.stream.get(i - cls.nk),
        )
    };
    (ctx as u64) << 32 | stream as u64
}

/// The first H2D copy's call site, else another op's of the sequence, else the next sync of the
/// copying thread.
fn locate(cx: &Ctx, locator: &Locator, q: &Seq) -> (Option<LocIx>, LocationSource) {
    let m = cx.m;
    let corr = op_corr(m, q.first_h2d);
    for op in [Some(q.first_h2d), q.first_kernel, q.first_d2h] {
        let c = op.and_then(|op| op_corr(m, op).known());
        if let Some(loc) = c.and_then(|c| cx.callsite_loc(c)) {
            return (Some(loc), LocationSource::Callsite);
        }
    }
    let api = issuing_api(cx, corr);
    locator.locate(corr, None, api.as_ref(), q.start)
}

fn insight(cx: &Ctx, locator: &Locator, group: &[(Option<LocIx>, LocationSource, Seq)]) -> Insight {
    let loc = group[0].0;
    let src = group
        .iter()
        .map(|g| g.1)
        .max()
        .unwrap_or(LocationSource::None);
    let n = group.len() as u64;
    let mut stages = Stages {
        h2d_ns: 0,
        kernel_ns: 0,
        d2h_ns: 0,
    };
    let (mut measured, mut span, mut t2, mut t4) = (0u64, 0u64, 0u64, 0u64);
    for (_, _, q) in group {
        stages.h2d_ns += q.stages.h2d_ns;
        stages.kernel_ns += q.stages.kernel_ns;
        stages.d2h_ns += q.stages.d2h_ns;
        measured += q.stages.sequential_ns();
        span += q.end - q.start;
        t2 += predict(q.stages, 2).time_ns;
        t4 += predict(q.stages, 4).time_ns;
    }
    let pred = |chunks: u32, time_ns: u64| Prediction {
        chunks,
        time_ns,
        speedup: if time_ns == 0 {
            1.0
        } else {
            measured as f64 / time_ns as f64
        },
    };
    let (two, four) = (pred(2, t2), pred(4, t4));
    let impact = measured.saturating_sub(t4);
    let location = locator.source_loc(loc);
    let at = if loc.is_none() {
        String::new()
    } else {
        format!(" @ {}", location.short())
    };
    let title = format!(
        "No copy/compute overlap × {n}{at} · {} could be ~{} with 2 streams",
        fmt_duration(measured),
        fmt_duration(t2)
    );
    let seqs = if n == 1 {
        "1 sequence".to_string()
    } else {
        format!("{n} sequences")
    };
    let where_ = if loc.is_none() {
        String::new()
    } else {
        format!(" from {}{}", location.short(), in_function(&location))
    };
    let detail = format!(
        "{seqs}{where_} of host-to-device copy → kernels → device-to-host copy ran one after the other with no copy \
         overlapping a kernel: H2D {}, kernels {}, D2H {} ({} in all). Split into chunks on 2 streams: ~{} ({:.2}x); \
         on 4 streams: ~{} ({:.2}x){}",
        fmt_duration(stages.h2d_ns),
        fmt_duration(stages.kernel_ns),
        fmt_duration(stages.d2h_ns),
        fmt_duration(measured),
        fmt_duration(t2),
        two.speedup,
        fmt_duration(t4),
        four.speedup,
        location_note(src, "the copies")
    );
    Insight::new(RULE, location, title, detail, cx.fix(&FIX))
        .count(n)
        .impact(impact, cx.gpu_wall_ns(), cx.wall_ns)
        .data(Data {
            sequences: n,
            stages,
            measured_ns: measured,
            span_ns: span,
            two_streams: two,
            four_streams: four,
            location_source: src,
        })
}
