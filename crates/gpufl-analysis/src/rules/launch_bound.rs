//! Rule `launch-bound`: kernel functions launched many times that run shorter than their launch
//! call, while the GPU sits mostly idle around them — the host cannot launch fast enough to keep
//! the GPU busy (HTA's "short kernels"; `nsys stats cuda_kern_exec_sum`'s launch and queue times).
//!
//! - **Per kernel function and device** (launches with an `api` record; kernels whose launch call
//!   was not recorded are left out): *launch latency* = the launch call's host duration, *queue
//!   latency* = launch call's end → kernel start (0 when the kernel starts first), a *short* launch
//!   is one whose kernel ran shorter than its launch call; count, median and p99 of each.
//! - **Fires** for a function with at least [`MIN_LAUNCHES`] launches, at least [`MIN_SHORT_PCT`] %
//!   of them short, and its device busy (any kernel, copy or memset) less than [`MAX_BUSY_PCT`] %
//!   of the function's span (first start to last end of its kernels): a GPU that is busy anyway
//!   gains nothing from faster launches.
//! - **Impact:** the recoverable launch overhead: over its short launches, Σ (launch call −
//!   kernel time), each at most the device's idle time right before that kernel (0 when the
//!   kernel was queued behind other work).
//! - **Line:** the most frequent call site of its sampled launches; in sessions without call sites,
//!   the most frequent next synchronization (with a stack) on the launching thread (approximate).
//!   Functions at one line make one insight.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, in_function, share, short_function, Insight};
use crate::shared::advice::Fix;
use crate::shared::host::{HostActivity, HostGap};
use crate::shared::timeline::{
    location_note, median_p99, most_frequent_per_key, BusyIndex, LocationSource, Locator,
};
use crate::shared::Ctx;
use crate::store::NONE;
use crate::userframe::SourceLoc;
use serde::Serialize;

pub(crate) const RULE: &str = "launch-bound";
/// Fewest launches (with an API record) of a kernel function for the rule to look at it.
pub const MIN_LAUNCHES: u64 = 100;
/// Least share of short launches, percent.
pub const MIN_SHORT_PCT: u64 = 50;
/// The device must be busy less than this share of the function's span, percent.
pub const MAX_BUSY_PCT: u64 = 50;

const FIX: Fix = Fix {
    native: "Do more work per launch: fuse small kernels into one, batch the work so that each launch \
processes more data, or capture the loop into a CUDA graph (cudaStreamBeginCapture … \
cudaStreamEndCapture, cudaGraphInstantiate, then cudaGraphLaunch), which replays many \
kernels for one launch.",
    python: None,
    torch: Some("Do more work per launch: fuse small kernels (torch.compile, a fused custom kernel), batch \
the work so that each launch processes more data, or capture the loop into a CUDA graph \
(torch.cuda.graphs / torch.cuda.CUDAGraph, or torch.compile(mode=\"reduce-overhead\")), which \
replays many kernels for one launch."),
    jax: Some("Do more work per dispatch: put the whole step (and the loop, with lax.scan or lax.fori_loop) \
inside one jax.jit function so that XLA fuses its operations and launches them together, and \
batch the work (jax.vmap, larger batches) so that each kernel processes more data."),
    cupy: Some("Do more work per launch: fuse elementwise operations (cupy.fuse, cupy.ElementwiseKernel, a \
RawKernel), batch the work so that each launch processes more data, or capture the loop into \
a CUDA graph (stream.begin_capture() … stream.end_capture(), then graph.launch()), which \
replays many kernels for one launch."),
};

/// Median and 99th percentile (nearest rank), ns.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stat {
    pub median_ns: u64,
    pub p99_ns: u64,
}

/// One kernel function's launches (on one device).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelLaunches {
    pub name: String,
    pub device: u32,
    /// Launches with an API record.
    pub launches: u64,
    /// Of those, kernels that ran shorter than their launch call.
    pub short_launches: u64,
    /// Kernel duration.
    pub kernel: Stat,
    /// Launch call's host duration.
    pub launch: Stat,
    /// Launch call's end to kernel start.
    pub queue: Stat,
    /// GPU time of all the function's kernels.
    pub gpu_ns: u64,
    /// GPU time of its short launches.
    pub short_gpu_ns: u64,
    /// `short_gpu_ns` over the GPU time of every kernel of the session, 0..1.
    pub short_share_of_kernel_time: f64,
    /// First start to last end of its kernels.
    pub span_ns: u64,
    /// Device busy time over that span, 0..1.
    pub busy_share: f64,
    pub recoverable_ns: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub launches: u64,
    pub short_launches: u64,
    pub recoverable_ns: u64,
    /// Functions at this line, most recoverable first.
    pub kernels: Vec<KernelLaunches>,
    pub location_source: LocationSource,
    /// What the host was doing during the idle before the short launches' kernels (sessions
    /// with `hostcall` or `hsample` records; absent without them): the join of `shared::host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostActivity>,
    /// When the finding moved to the host line holding most of that idle time: the launch line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ended_at: Option<SourceLoc>,
}

/// Counts of one (kernel function, device).
#[derive(Clone)]
struct Acc {
    name: u32,
    dev: u32,
    /// Next accumulator of the same name (another device), or NONE.
    next: u32,
    launches: u64,
    short: u64,
    first: u64,
    last: u64,
    gpu_ns: u64,
    short_gpu_ns: u64,
    /// Index into the fired list, or NONE.
    fired: u32,
    /// A communication kernel ([`crate::comm::is_comm_kernel`]): never a candidate.
    comm: bool,
    busy_share: f64,
}

/// Figures gathered for a fired function.
#[derive(Default)]
struct Fired {
    kernel: Vec<u32>,
    launch: Vec<u32>,
    queue: Vec<u32>,
    recoverable: u64,
    /// (0, loc) votes from sampled call sites / from next syncs.
    site_votes: Vec<(u32, LocIx)>,
    sync_votes: Vec<(u32, LocIx)>,
    /// The idle gaps before its short launches' kernels, with the launching thread (kept only
    /// when the session has host records).
    gaps: Vec<HostGap>,
}

/// Index of each kernel's launch call in the API columns (NONE when not recorded, and for kernels a
/// CUDA graph launch ran): a merge join of the kernels sorted by correlation id with the API calls
/// sorted by correlation id.
fn kernel_apis(cx: &Ctx) -> (Vec<u32>, usize) {
    let m = cx.m;
    let mut kc: Vec<(CorrId, u32)> = m
        .kernel_corrs()
        .enumerate()
        .map(|(i, c)| (c, i as u32))
        .collect();
    kc.sort_unstable();
    let mut out = vec![NONE; kc.len()];
    let apis = &cx.api_by_corr;
    // Kernels a graph launch ran were not launched one by one: their correlation id is the graph
    // launch's, whose host time is not theirs (left out here, as kernels without a launch record).
    let graph = crate::shared::timeline::graph_kernel_mask(m);
    let (mut j, mut found) = (0, 0);
    for &(corr, k) in &kc {
        if corr.known().is_none() || graph.get(k as usize).copied().unwrap_or(false) {
            continue;
        }
        while j < apis.len() && apis[j].0 < corr {
            j += 1;
        }
        match apis.get(j) {
            Some(&(c, a)) if c == corr => {
                out[k as usize] = a;
                found += 1;
            }
            Some(_) => {}
            None => break,
        }
    }
    (out, found)
}

fn sat_u32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let m = cx.m;
    let nk = m.kernel_count();
    if nk == 0 || cx.api_by_corr.is_empty() {
        return Vec::new();
    }
    let (api_of, found) = kernel_apis(cx);
    if found == 0 {
        return Vec::new();
    }
    let k = &m.kernels;
    let a = &m.apis;
    let launch_ns = |api: u32| {
        let i = api as usize;
        a.end.get(i).saturating_sub(a.start.get(i))
    };

    // Pass 1: counts per (function, device).
    let mut slot_of_name: Vec<u32> = vec![NONE; m.strings.len()];
    let mut accs: Vec<Acc> = Vec::new();
    let mut total_kernel_ns = 0u64;
    let rows = k
        .start
        .iter()
        .zip(k.end.iter())
        .zip(m.kernel_names())
        .zip(k.dev.iter())
        .enumerate();
    let mut acc_of: Vec<u32> = Vec::with_capacity(nk);
    for (i, (((s, e), name), dev)) in rows {
        let d = e.saturating_sub(s);
        total_kernel_ns = total_kernel_ns.saturating_add(d);
        let ai = acc_index(&mut slot_of_name, &mut accs, name, dev);
        acc_of.push(ai);
        let acc = &mut accs[ai as usize];
        acc.gpu_ns = acc.gpu_ns.saturating_add(d);
        acc.first = acc.first.min(s);
        acc.last = acc.last.max(e.max(s));
        if api_of[i] != NONE {
            acc.launches += 1;
            if d < launch_ns(api_of[i]) {
                acc.short += 1;
                acc.short_gpu_ns += d;
            }
        }
    }
    drop(slot_of_name);
    for a in accs.iter_mut() {
        a.comm = crate::comm::is_comm_kernel(m.str(gpufl_trace::StrId(a.name)));
    }
    let candidate = |a: &Acc| {
        !a.comm
            && a.launches >= MIN_LAUNCHES
            && a.short * 100 >= a.launches * MIN_SHORT_PCT
            && a.last > a.first
    };
    if !accs.iter().any(candidate) {
        return Vec::new();
    }

    // The device's busy share over each candidate's span, from the merged busy intervals the
    // analysis already has (one device: all records count, as in the totals).
    let single = m.devices().len() == 1;
    let mut busy: Vec<(u32, BusyIndex)> = Vec::new();
    for a in accs.iter().filter(|a| candidate(a)) {
        if !busy.iter().any(|b| b.0 == a.dev) {
            let dev = (!single).then_some(a.dev);
            busy.push((
                a.dev,
                BusyIndex::from_merged(cx.busy.intervals(dev).to_vec()),
            ));
        }
    }
    let busy_of =
        |dev: u32| -> Option<&BusyIndex> { busy.iter().find(|b| b.0 == dev).map(|b| &b.1) };
    let mut fired: Vec<Fired> = Vec::new();
    for acc in accs.iter_mut() {
        if !candidate(acc) {
            continue;
        }
        let Some(b) = busy_of(acc.dev) else { continue };
        let span = acc.last - acc.first;
        let busy = b.busy_in(acc.first, acc.last);
        acc.busy_share = share(busy, span);
        if (busy as u128) * 100 < (span as u128) * MAX_BUSY_PCT as u128 {
            acc.fired = fired.len() as u32;
            fired.push(Fired::default());
        }
    }
    if fired.is_empty() {
        return Vec::new();
    }

    // Pass 2: latencies, recoverable time and call-site votes of the fired functions.
    let locator = Locator::new(cx);
    let has_sites = !m.callsites.is_empty();
    let keep_gaps = m.has_host_records();
    for (i, &ai) in acc_of.iter().enumerate() {
        let acc = &accs[ai as usize];
        if acc.fired == NONE || api_of[i] == NONE {
            continue;
        }
        let f = &mut fired[acc.fired as usize];
        let (s, e) = (k.start.get(i), k.end.get(i));
        let d = e.saturating_sub(s);
        let api = m.api(api_of[i] as usize);
        let l = api.duration_ns();
        f.kernel.push(sat_u32(d));
        f.launch.push(sat_u32(l));
        f.queue.push(sat_u32(s.saturating_sub(api.end)));
        if d < l {
            let idle = busy_of(acc.dev).map_or(0, |b| b.idle_before(s));
            f.recoverable += (l - d).min(idle);
            if keep_gaps && idle > 0 {
                f.gaps.push(HostGap {
                    start: s - idle,
                    end: s,
                    tid: Some(api.tid),
                });
            }
        }
        if has_sites {
            if let Some(loc) = cx.callsite_loc(api.corr) {
                f.site_votes.push((0, loc));
            }
        }
    }
    // Functions without a sampled call site: the next sync of the launching thread.
    for (i, &ai) in acc_of.iter().enumerate() {
        let acc = &accs[ai as usize];
        if acc.fired == NONE
            || api_of[i] == NONE
            || !fired[acc.fired as usize].site_votes.is_empty()
        {
            continue;
        }
        let api = m.api(api_of[i] as usize);
        if let Some(loc) = locator.next_sync(Some(api.tid), api.start) {
            fired[acc.fired as usize].sync_votes.push((0, loc));
        }
    }
    drop(acc_of);
    drop(api_of);

    // One insight per line.
    let mut by_line: Vec<LineFn> = Vec::new();
    for acc in accs.iter().filter(|a| a.fired != NONE) {
        let f = &mut fired[acc.fired as usize];
        let (loc, src) = if !f.site_votes.is_empty() {
            let v = most_frequent_per_key(std::mem::take(&mut f.site_votes));
            (Some(v[0].1), LocationSource::Callsite)
        } else if !f.sync_votes.is_empty() {
            let v = most_frequent_per_key(std::mem::take(&mut f.sync_votes));
            (Some(v[0].1), LocationSource::NextSync)
        } else {
            (None, LocationSource::None)
        };
        let stat = |v: &mut Vec<u32>| {
            let (median_ns, p99_ns) = median_p99(v);
            Stat { median_ns, p99_ns }
        };
        let kl = KernelLaunches {
            name: m.str(gpufl_trace::StrId(acc.name)).to_string(),
            device: acc.dev,
            launches: acc.launches,
            short_launches: acc.short,
            kernel: stat(&mut f.kernel),
            launch: stat(&mut f.launch),
            queue: stat(&mut f.queue),
            gpu_ns: acc.gpu_ns,
            short_gpu_ns: acc.short_gpu_ns,
            short_share_of_kernel_time: share(acc.short_gpu_ns, total_kernel_ns),
            span_ns: acc.last - acc.first,
            busy_share: acc.busy_share,
            recoverable_ns: f.recoverable,
        };
        by_line.push((
            loc,
            src,
            kl,
            acc.first,
            acc.last,
            std::mem::take(&mut f.gaps),
        ));
    }
    // The lines in order, the functions without one last.
    by_line.sort_by_key(|x| (x.0.is_none(), x.0));
    by_line
        .chunk_by(|a, b| a.0 == b.0)
        .map(|line| insight(cx, &locator, line))
        .collect()
}

/// A fired function at its line: (line, how found, its figures, first start, last end, the idle
/// gaps before its short launches).
type LineFn = (
    Option<LocIx>,
    LocationSource,
    KernelLaunches,
    u64,
    u64,
    Vec<HostGap>,
);

fn acc_index(slot_of_name: &mut [u32], accs: &mut Vec<Acc>, name: u32, dev: u32) -> u32 {
    let new = |accs: &mut Vec<Acc>| {
        accs.push(Acc {
            name,
            dev,
            next: NONE,
            launches: 0,
            short: 0,
            first: u64::MAX,
            last: 0,
            gpu_ns: 0,
            short_gpu_ns: 0,
            fired: NONE,
            comm: false,
            busy_share: 0.0,
        });
        (accs.len() - 1) as u32
    };
    let Some(head) = slot_of_name.get_mut(name as usize) else {
        // A name id beyond the string table (never written by the model): its own slot each time.
        return new(accs);
    };
    if *head == NONE {
        let a = new(accs);
        *head = a;
        return a;
    }
    let mut a = *head;
    loop {
        if accs[a as usize].dev == dev {
            return a;
        }
        match accs[a as usize].next {
            NONE => {
                let b = new(accs);
                accs[a as usize].next = b;
                return b;
            }
            n => a = n,
        }
    }
}

use crate::kernels::short_name as short_kernel;

/// Names for prose: [`short_kernel`], or the signature (clipped) where two functions of the list
/// would read the same (template instantiations), told apart where those would read the same
/// clipped ([`crate::kernels::distinct_names`]).
fn display_names(kernels: &[KernelLaunches]) -> Vec<String> {
    const WIDTH: usize = 100;
    let shorts: Vec<&str> = kernels.iter().map(|k| short_kernel(&k.name)).collect();
    let mut names: Vec<String> = shorts.iter().map(|s| s.to_string()).collect();
    // The rows that share their short name, shown by their signatures, clipped.
    let shared: Vec<usize> = (0..kernels.len())
        .filter(|&i| shorts.iter().filter(|x| **x == shorts[i]).count() > 1)
        .collect();
    let shown: Vec<String> = shared
        .iter()
        .map(|&i| {
            let f = short_function(&kernels[i].name);
            f.strip_prefix("void ").unwrap_or(f).to_string()
        })
        .collect();
    let full: Vec<&str> = shared.iter().map(|&i| kernels[i].name.as_str()).collect();
    let distinct = crate::kernels::distinct_names(&shown, &full, WIDTH);
    for (&i, f) in shared.iter().zip(distinct) {
        names[i] = match f.char_indices().nth(WIDTH) {
            Some((i, _)) => format!("{}…", &f[..i]),
            None => f,
        };
    }
    names
}

fn insight(cx: &Ctx, locator: &Locator, group: &[LineFn]) -> Insight {
    let loc = group[0].0;
    let src = group
        .iter()
        .map(|g| g.1)
        .max()
        .unwrap_or(LocationSource::None);
    let mut kernels: Vec<KernelLaunches> = group.iter().map(|g| g.2.clone()).collect();
    kernels.sort_by(|a, b| {
        b.recoverable_ns
            .cmp(&a.recoverable_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    let launches: u64 = kernels.iter().map(|k| k.launches).sum();
    let short: u64 = kernels.iter().map(|k| k.short_launches).sum();
    let impact: u64 = kernels.iter().map(|k| k.recoverable_ns).sum();
    let first = group.iter().map(|g| g.3).min().unwrap_or(0);
    let last = group.iter().map(|g| g.4).max().unwrap_or(0);
    let window = cx.gpu_span(first, last).max(impact);
    let location = locator.source_loc(loc);
    let at = if loc.is_none() {
        String::new()
    } else {
        format!(" @ {}", location.short())
    };
    let top = &kernels[0];
    let title = if kernels.len() == 1 {
        format!(
            "Launch-bound × {launches}{at} · {} runs {} but takes {} to launch · ~{} recoverable",
            short_kernel(&top.name),
            fmt_duration(top.kernel.median_ns),
            fmt_duration(top.launch.median_ns),
            fmt_duration(impact)
        )
    } else {
        format!(
            "Launch-bound × {launches}{at} · {} kernels mostly shorter than their launch · ~{} recoverable",
            kernels.len(),
            fmt_duration(impact)
        )
    };
    let display = display_names(&kernels);
    let names: Vec<String> = kernels
        .iter()
        .zip(&display)
        .take(3)
        .map(|(k, name)| {
            format!(
                "{name} ({} of {} short; median kernel {}, launch {}, queue {}; p99 launch {}; GPU busy {:.0}% of its span)",
                k.short_launches,
                k.launches,
                fmt_duration(k.kernel.median_ns),
                fmt_duration(k.launch.median_ns),
                fmt_duration(k.queue.median_ns),
                fmt_duration(k.launch.p99_ns),
                k.busy_share * 100.0
            )
        })
        .collect();
    let more = if kernels.len() > 3 {
        format!(" and {} more", kernels.len() - 3)
    } else {
        String::new()
    };
    let short_share: f64 = kernels.iter().map(|k| k.short_share_of_kernel_time).sum();
    let where_ = if loc.is_none() {
        String::new()
    } else {
        format!(" at {}{}", location.short(), in_function(&location))
    };
    let mut detail = format!(
        "{short} of {launches} launches{where_} ran shorter than their launch call, so the GPU waits for the host: {}{more}; \
         {:.1}% of all kernel time is in these short kernels. ~{} is launch overhead not hidden by GPU work (launch − \
         kernel time, at most the idle time before each kernel){}",
        names.join("; "),
        short_share.min(1.0) * 100.0,
        fmt_duration(impact),
        location_note(src, "these launches")
    );
    // What the host was doing in the idle before the short launches' kernels.
    let (mut location, mut title, mut fix) = (location, title, cx.fix(&FIX).to_string());
    let mut gap_ended_at = None;
    let h = cx.host();
    let host = (!h.is_empty()).then(|| {
        let gaps: Vec<HostGap> = group.iter().flat_map(|g| g.5.iter().copied()).collect();
        h.explain(cx, locator, &gaps, loc)
    });
    if let Some(j) = &host {
        detail += &format!(
            "; in the idle before the short launches' kernels, {}",
            j.activity.sentence("the launching thread")
        );
        if let Some(t) = j.line.as_ref().filter(|t| Some(t.loc) != loc) {
            let new_loc = locator.source_loc(t.loc);
            title = format!(
                "Launch-bound × {launches} @ {} · the GPU waited {} between short kernels while the launching thread was {} ({:.0}% of that time)",
                new_loc.short(),
                fmt_duration(j.activity.gap_ns),
                t.phrase,
                t.share * 100.0
            );
            detail += &format!(
                "; located at the host line that holds {:.0}% of that time, the launches at {}",
                t.share * 100.0,
                location.short()
            );
            gap_ended_at = Some(std::mem::replace(&mut location, new_loc));
            if let Some(f) = j.fix(cx.program) {
                fix = f;
            }
        }
    }
    Insight::new(RULE, location, title, detail, fix)
        .count(launches)
        .impact(impact, window, cx.wall_ns)
        .gpu_idle(impact)
        .data(Data {
            launches,
            short_launches: short,
            recoverable_ns: impact,
            kernels,
            location_source: src,
            host: host.map(|j| j.activity),
            gap_ended_at,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_for_titles() {
        assert_eq!(
            short_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"),
            "at::native::vectorized_elementwise_kernel"
        );
        assert_eq!(
            short_kernel("saxpy(int, float, float const*, float*)"),
            "saxpy"
        );
        assert_eq!(short_kernel("k"), "k");
        assert_eq!(
            short_kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3"),
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3"
        );
    }
}
