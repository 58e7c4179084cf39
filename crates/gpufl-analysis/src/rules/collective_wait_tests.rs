//! Rule `collective-wait` over always-on runs: two ranks of one synthetic job, built record by
//! record, each recording GPU activity only inside its own windows.
//!
//! Each step `s` starts at `s × PERIOD` (host wall clock, from `UNIX0`): rank 0 reaches the
//! step's collective 1 ms in, rank 1 `late` after it; the kernel starts on each rank when it
//! arrives and ends on both 100 µs after the last arrival (with `two_buckets`, a second one of the
//! same name follows, 150 µs after the first). Each kernel is launched 50 µs before it starts, and
//! a rank records it when that launch falls inside one of its windows (a kernel still running when
//! the window closes is kept, as the recorder keeps it).
//! Rank 1's CUPTI clock is offset from rank 0's: its header's clock pair maps it back.

use super::*;
use crate::model::Model;
use gpufl_trace::*;

const NCCL: &str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
const GEMM: &str = "sm90_gemm";
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const PERIOD: u64 = 10 * MS;
const UNIX0: u64 = 1_795_000_000_000_000_000;
const TRACE0: [u64; 2] = [5_000_000_000_000, 5_000_777_000_000];
/// Rank 1's host per step: a synchronization `PRE_SYNC_AHEAD` before its forward launch, which
/// comes `FORWARD_AFTER` past the step's start and its lateness; another after the step's last
/// collective (`SYNC_AFTER` after its end). Syncs are `SYNC_LEN` long.
const FORWARD_AFTER: u64 = 200 * US;
const PRE_SYNC_AHEAD: u64 = 100 * US;
const SYNC_AFTER: u64 = 20 * US;
const SYNC_LEN: u64 = 10 * US;
/// Launch to kernel start.
const LAUNCH_AHEAD: u64 = 50 * US;

#[derive(Clone)]
struct Plan {
    steps: u64,
    /// Rank 1 reaches each collective this long after rank 0, ns.
    late: u64,
    /// Each rank's windows (ns from `UNIX0`), and their reason.
    windows: [Vec<(u64, u64)>; 2],
    reason: &'static str,
    hosts: [&'static str; 2],
    /// A second collective of the same name, 150 µs after the first, each step.
    two_buckets: bool,
    /// (rank, step): that rank did not record the step's first collective (launched before its
    /// window opened).
    dropped: Option<(usize, u64)>,
    /// Rank 1's synchronizations (one after each step's last collective), recorded throughout.
    syncs: bool,
    /// Rank 1's API records of its launches (a forward launch and its collectives), inside its
    /// windows: what full-detail windows record.
    apis: bool,
    always_on: bool,
    /// Both ranks run the same `GEMM` kernel 6 ms into each step.
    gemm: bool,
}

impl Plan {
    /// Rank 1 late by 4 ms; rank 0's windows open 55 ms after rank 1's, so that the n-th kernel
    /// each rank recorded belong to different steps.
    fn offset_windows() -> Plan {
        Plan {
            steps: 130,
            late: 4 * MS,
            windows: [
                vec![(105 * MS, 305 * MS), (1005 * MS, 1205 * MS)],
                vec![(50 * MS, 250 * MS), (950 * MS, 1150 * MS)],
            ],
            reason: "sampled",
            hosts: ["node01", "node01"],
            two_buckets: false,
            dropped: None,
            syncs: false,
            apis: false,
            always_on: true,
            gemm: false,
        }
    }

    /// Rank 1 (the late rank) opens its windows 55 ms after rank 0, in full-detail windows with
    /// its API records; its syncs recorded throughout.
    fn late_rank_opens_last() -> Plan {
        let p = Plan::offset_windows();
        Plan {
            windows: [p.windows[1].clone(), p.windows[0].clone()],
            reason: "trigger",
            syncs: true,
            apis: true,
            ..p
        }
    }

    /// Each rank's kernels of step `s` (start, end) on the wall clock: the first collective and,
    /// with two buckets, the second.
    fn step(&self, s: u64) -> [Vec<(u64, u64)>; 2] {
        let base = s * PERIOD;
        let arrive = [base + MS, base + MS + self.late];
        let end = arrive[0].max(arrive[1]) + 100 * US;
        let mut out = [vec![(arrive[0], end)], vec![(arrive[1], end)]];
        if self.two_buckets {
            for k in out.iter_mut() {
                k.push((end + 10 * US, end + 150 * US));
            }
        }
        out
    }

    /// Whether rank `r` had a window open at `t` (wall clock).
    fn sees(&self, r: usize, t: u64) -> bool {
        self.windows[r].iter().any(|w| w.0 <= t && t < w.1)
    }

    /// The steps whose first collective both ranks recorded whole inside windows they both
    /// had open (what matching by time should find), counted here from the plan alone.
    fn shared_steps(&self) -> Vec<u64> {
        (0..self.steps)
            .filter(|&s| {
                let k = self.step(s);
                let (lo, hi) = (k[0][0].0.min(k[1][0].0), k[0][0].1.max(k[1][0].1));
                self.dropped.is_none_or(|d| d.1 != s)
                    && (0..2).all(|r| self.sees(r, k[r][0].0 - LAUNCH_AHEAD))
                    && self.windows[0].iter().any(|a| {
                        self.windows[1]
                            .iter()
                            .any(|b| a.0.max(b.0) <= lo && hi <= a.1.min(b.1))
                    })
            })
            .collect()
    }

    fn model(&self, r: usize) -> Model {
        Model::load(self.records(r))
    }

    fn records(&self, r: usize) -> Vec<Record> {
        let to_trace = |t: u64| t + TRACE0[r];
        let mut recs = vec![Record::Header(Box::new(Header {
            session_id: format!("ddp-{}-20261128T000000Z", 500 + r),
            app_name: "ddp".into(),
            host: self.hosts[r].into(),
            pid: 500 + r as u32,
            rank: Some(r as u32),
            clock: ClockSync {
                trace_ns: TRACE0[r],
                unix_ns: UNIX0,
            },
            options: CaptureOptions {
                mode: self.always_on.then(|| "always-on".to_string()),
                ..CaptureOptions::default()
            },
            ..Header::default()
        }))];
        let strs = [NCCL, "cudaLaunchKernel", GEMM];
        for (i, s) in strs.iter().enumerate() {
            recs.push(Record::Str(StrRecord {
                id: StrId(i as u32),
                s: (*s).into(),
            }));
        }
        if self.always_on {
            for &(s, e) in &self.windows[r] {
                recs.push(Record::Window(Window {
                    start: to_trace(s),
                    end: to_trace(e),
                    reason: self.reason.into(),
                }));
            }
        }
        let mut corr = 0u32;
        for s in 0..self.steps {
            let base = s * PERIOD;
            let kernels = self.step(s);
            let forward = base + self.late + FORWARD_AFTER;
            if self.syncs && r == 1 {
                corr += 1;
                recs.push(sync(to_trace(forward - PRE_SYNC_AHEAD), corr));
            }
            if self.apis && r == 1 && self.sees(r, forward) {
                corr += 1;
                recs.push(api(to_trace(forward), corr));
            }
            for (b, &(ks, ke)) in kernels[r].iter().enumerate() {
                let launch = ks - LAUNCH_AHEAD;
                if !self.sees(r, launch) || (b == 0 && self.dropped == Some((r, s))) {
                    continue;
                }
                corr += 1;
                if self.apis && r == 1 {
                    recs.push(api(to_trace(launch), corr));
                }
                recs.push(Record::Kernel(Kernel {
                    name: StrId(0),
                    start: to_trace(ks),
                    end: to_trace(ke),
                    dev: r as u32,
                    ctx: 1,
                    stream: 20,
                    corr,
                    ..Kernel::default()
                }));
            }
            let g = base + 6 * MS;
            if self.gemm && self.sees(r, g - LAUNCH_AHEAD) {
                corr += 1;
                recs.push(Record::Kernel(Kernel {
                    name: StrId(2),
                    start: to_trace(g),
                    end: to_trace(g + 500 * US),
                    dev: r as u32,
                    ctx: 1,
                    stream: 7,
                    corr,
                    ..Kernel::default()
                }));
            }
            if self.syncs && r == 1 {
                let end = kernels[r].last().unwrap().1;
                corr += 1;
                recs.push(sync(to_trace(end + SYNC_AFTER), corr));
            }
        }
        recs
    }

    fn models(&self) -> [Model; 2] {
        [self.model(0), self.model(1)]
    }
}

fn sync(start: u64, corr: u32) -> Record {
    Record::Sync(Sync {
        kind: SyncKind::StreamSynchronize,
        start,
        end: start + SYNC_LEN,
        ctx: 1,
        stream: Some(7),
        event: None,
        corr,
        tid: Some(10),
        stack: None,
    })
}

fn api(start: u64, corr: u32) -> Record {
    Record::Api(Api {
        domain: ApiDomain::Runtime,
        name: StrId(1),
        cbid: 211,
        start,
        end: start + 5 * US,
        tid: 10,
        corr,
        ret: 0,
    })
}

fn ranks(ms: &[Model; 2]) -> Vec<Rank<'_>> {
    ms.iter()
        .enumerate()
        .map(|(r, m)| Rank::new(m, r as u32, format!("ddp-{}", 500 + r)))
        .collect()
}

type Outcome = (Vec<Insight>, Option<ClockAlignment>, Vec<String>);

fn run_plan(p: &Plan) -> Outcome {
    let ms = p.models();
    run(ranks(&ms), &Config::default())
}

fn data(i: &Insight) -> &Data {
    match &i.data {
        Some(crate::rules::RuleData::CollectiveWait(d)) => d,
        _ => panic!("no collective-wait data: {i:?}"),
    }
}

#[test]
fn offset_windows_are_matched_by_time_and_name_the_late_rank() {
    let p = Plan::offset_windows();
    let want = p.shared_steps();
    assert!(want.len() >= 20, "{want:?}");
    let (ins, clock, warnings) = run_plan(&p);
    let clock = clock.expect("clock");
    assert_eq!(clock.method, ClockMethod::SameHost);
    assert_eq!(clock.collectives, want.len() as u64, "{warnings:?}");
    assert_eq!(
        clock.end_spread_ns,
        Some(0),
        "the same collectives are paired"
    );
    let w = clock.windows.as_ref().expect("shared windows");
    assert_eq!((w.windows, w.with_collectives), (2, 2));
    // [105, 250) and [1005, 1150) ms.
    assert_eq!(w.observed_ns, 2 * 145 * MS);
    assert_eq!(ins.len(), 1, "{warnings:?}");
    let d = data(&ins[0]);
    assert_eq!(d.late_rank, 1);
    assert_eq!(d.waiting_ranks, vec![0]);
    assert_eq!(d.late_collectives, want.len() as u64);
    assert_eq!(d.median_late_ns, p.late);
    assert_eq!(d.windows.as_ref(), Some(w));
    // Rank 0 waits `late` in each: its kernel is `late` + 100 µs long.
    assert_eq!(d.wait_ns, p.late * want.len() as u64);
    // Sampled windows hold no API records: the host is not placed.
    assert_eq!(d.host_gap_median_ns, None);
    let i = &ins[0];
    assert!(
        i.title.contains("rank 1 arrives 4.00ms late"),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains(&format!(
            "always-on: {} collectives matched by end time in 2 of the 2 windows every rank had open",
            want.len()
        )),
        "{}",
        i.detail
    );
    assert!(
        i.detail.contains("host time cannot be placed"),
        "{}",
        i.detail
    );
    let b = i.basis.expect("basis");
    assert_eq!(b.kind, crate::sampling::BasisKind::Estimated);
    assert_eq!(b.observed_ns, w.observed_ns);
}

/// In an always-on run a lateness under `MIN_SAMPLED_P90_NS` (what opening a window costs a rank
/// by itself) raises nothing; from 1 ms it does.
#[test]
fn sub_millisecond_lateness_in_sampled_windows_raises_nothing() {
    let mut p = Plan::offset_windows();
    p.late = 600_000;
    let (ins, clock, warnings) = run_plan(&p);
    assert!(clock.expect("clock").collectives >= 20, "{warnings:?}");
    assert!(
        ins.is_empty(),
        "{:?}",
        ins.iter().map(|i| &i.title).collect::<Vec<_>>()
    );
    p.late = MIN_SAMPLED_P90_NS;
    assert_eq!(run_plan(&p).0.len(), 1);
}

#[test]
fn the_same_kernels_matched_by_order_pair_different_steps() {
    // The recorded kernels of the test above, read as default-mode sessions (order matching):
    // rank 0's n-th kernel is 6 steps after rank 1's, so rank 0 looks late. What the time
    // matching avoids.
    let p = Plan {
        always_on: false,
        ..Plan::offset_windows()
    };
    let ms = p.models();
    let mut ps = ranks(&ms);
    let mut warnings = Vec::new();
    let (_, colls) = match_collectives(&ps, &mut warnings);
    assert!(warnings.is_empty(), "{warnings:?}");
    align_clocks(&mut ps, &colls, &mut warnings);
    let mut sp = Spread::of(&ps, &colls);
    assert!(median_of(&mut sp.end_spreads) > 50 * MS as i128);
    assert!(
        sp.late_sum[0] > 0 && sp.late_sum[1] == 0,
        "{:?}",
        sp.late_sum
    );
}

#[test]
fn windows_that_never_overlap_raise_nothing_and_say_why() {
    let p = Plan {
        windows: [
            vec![(0, 200 * MS), (600 * MS, 800 * MS)],
            vec![(300 * MS, 500 * MS), (900 * MS, 1100 * MS)],
        ],
        ..Plan::offset_windows()
    };
    let ms = p.models();
    assert!(ms.iter().all(|m| m.kernel_count() > 0));
    let (ins, clock, warnings) = run(ranks(&ms), &Config::default());
    assert!(ins.is_empty());
    assert!(clock.is_none());
    assert!(
        warnings.iter().any(|w| w.contains("never overlapped")),
        "{warnings:?}"
    );
}

#[test]
fn always_on_ranks_on_two_hosts_raise_nothing_and_say_why() {
    let p = Plan {
        hosts: ["node01", "node02"],
        ..Plan::offset_windows()
    };
    let (ins, clock, warnings) = run_plan(&p);
    assert!(ins.is_empty() && clock.is_none());
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("2 hosts") && w.contains("not matched")),
        "{warnings:?}"
    );
}

#[test]
fn a_collective_one_rank_did_not_record_is_not_matched() {
    // Rank 0's first window outlasts rank 1's by 20 ms: the steps there are recorded by rank 0
    // only. Two buckets 150 µs apart (under MAX_END_DIFF_NS): in step 15, inside the shared
    // window, rank 1 lost its first bucket, whose nearest kernel of that name on rank 1 is then
    // the second bucket.
    let p = Plan {
        windows: [
            vec![(50 * MS, 270 * MS), (950 * MS, 1150 * MS)],
            vec![(50 * MS, 250 * MS), (950 * MS, 1150 * MS)],
        ],
        two_buckets: true,
        dropped: Some((1, 15)),
        ..Plan::offset_windows()
    };
    let ms = p.models();
    let mut ps = ranks(&ms);
    let mut warnings = Vec::new();
    let (_, colls, _, sampled) = match_in_windows(&mut ps, &mut warnings).expect("matched");
    // Every second bucket is matched too: twice the shared steps, and the second bucket of
    // step 15.
    let want = p.shared_steps();
    assert!(!want.contains(&15) && !want.contains(&25), "{want:?}");
    assert_eq!(colls.len(), 2 * want.len() + 1);
    for c in &colls {
        let e: Vec<i128> = (0..2).map(|q| ps[q].at(c.k[q]).1).collect();
        assert_eq!(e[0], e[1], "paired kernels end together");
    }
    // Rank 0's step 25 (recorded by it alone, at the edge of its window) is not matched.
    let step25 = ps[0].offset + (TRACE0[0] + p.step(25)[0][0].1) as i128;
    assert!(ps[0]
        .m
        .kernels()
        .any(|k| k.end as i128 + ps[0].offset == step25));
    assert!(colls.iter().all(|c| ps[0].at(c.k[0]).1 != step25));
    assert_eq!(sampled.summary.windows, 2);
}

/// Rank 1's host stretches over a plan's matched collectives: bounded by the windows with API
/// records that every rank shared (`bounded`), or as the default mode reads them.
fn stretches_of(p: &Plan, bounded: bool) -> (Vec<Stretch>, usize) {
    let ms = p.models();
    let mut ps = ranks(&ms);
    let mut warnings = Vec::new();
    let (_, colls, _, sampled) = match_in_windows(&mut ps, &mut warnings).expect("matched");
    let w = Waits::of(&ps, &colls, 1);
    let busy = DeviceBusy::new(ps[1].m);
    let cx = Ctx::new(ps[1].m, &Config::default(), &busy, 1);
    let locator = Locator::new(&cx);
    let h = HostCalls::new(&cx, &locator);
    let cover = intersect(&sampled.shared.iv, &api_cover(&ps[1]));
    let gaps = stretches(&h, &ps[1], (1, &colls), &w, bounded.then_some(&cover[..]));
    (gaps, w.late_colls.len())
}

#[test]
fn host_stretches_keep_to_shared_windows_with_api_records() {
    let p = Plan::late_rank_opens_last();
    let (gaps, late) = stretches_of(&p, true);
    assert_eq!(late, p.shared_steps().len());
    // One stretch per late collective but the first of each shared window (the collective
    // before it was launched outside): from the previous step's last sync to this step's first.
    assert_eq!(gaps.len(), late - 2);
    let expect = PERIOD + FORWARD_AFTER - PRE_SYNC_AHEAD - (MS + 100 * US + SYNC_AFTER + SYNC_LEN);
    assert!(gaps.iter().all(|g| g.2 == expect), "{gaps:?}");
    // Unbounded, those two run through time without API records too (from the session's start,
    // and from rank 1's last collective of its first window), split by the syncs alone.
    let (all, _) = stretches_of(&p, false);
    assert_eq!(all.len(), late);
    // The insight: host-bound, with that stretch.
    let (ins, _, _) = run_plan(&p);
    let d = data(&ins[0]);
    assert_eq!(d.late_rank, 1);
    assert!(d.host_bound);
    assert_eq!(d.host_gap_median_ns, Some(expect));
}

#[test]
fn sampled_windows_do_not_read_unrecorded_launches_as_host_time() {
    // The same host in sampled windows: no API records, the syncs alone.
    let p = Plan {
        reason: "sampled",
        apis: false,
        ..Plan::late_rank_opens_last()
    };
    let (ins, _, _) = run_plan(&p);
    let d = data(&ins[0]);
    assert_eq!(d.late_rank, 1);
    assert_eq!(d.host_gap_median_ns, None);
    assert!(!d.host_bound);
    assert!(
        ins[0].detail.contains("host time cannot be placed"),
        "{}",
        ins[0].detail
    );
    // Read as the default mode reads them, the syncs alone would give a stretch before each.
    let (bounded, _) = stretches_of(&p, true);
    assert!(bounded.is_empty());
    let (all, late) = stretches_of(&p, false);
    assert_eq!(all.len(), late);
}

#[test]
fn gpu_work_is_compared_over_the_shared_windows_only() {
    // Both ranks run the same GEMM each step; rank 1's second window opens 105 ms before rank
    // 0's, so over the matched collectives' whole span it recorded more of them.
    let p = Plan {
        windows: [
            vec![(105 * MS, 305 * MS), (1005 * MS, 1205 * MS)],
            vec![(50 * MS, 250 * MS), (900 * MS, 1150 * MS)],
        ],
        gemm: true,
        ..Plan::offset_windows()
    };
    let ms = p.models();
    let mut ps = ranks(&ms);
    let mut warnings = Vec::new();
    let (_, colls, _, sampled) = match_in_windows(&mut ps, &mut warnings).expect("matched");
    let spread = Spread::of(&ps, &colls);
    let late = Waits::of(&ps, &colls, 1).late_colls.len() as u64;
    let cfg = Config::default();
    let whole = [(spread.first, spread.last)];
    let unbounded = extra_kernels(&ps, 1, (&whole, false), late, &cfg);
    assert!(
        unbounded
            .iter()
            .any(|k| k.name == GEMM && k.launches > k.others_launches),
        "{unbounded:?}"
    );
    assert_eq!(sampled.spans.len(), 2);
    let bounded = extra_kernels(&ps, 1, (&sampled.spans, true), late, &cfg);
    assert!(bounded.is_empty(), "{bounded:?}");
}

/// The title's lateness: where most of the late time lies. DDP's buckets (one collective a step
/// late by the whole delay, three by a little) put the plain median on the little ones; a few
/// set-up outliers holding half the total do not set it (the count floor); none gives 0.
#[test]
fn lateness_where_most_late_time_lies() {
    let mut buckets: Vec<u64> = (0..40)
        .flat_map(|_| [4 * MS, 300 * US, 250 * US, 220 * US])
        .collect();
    buckets.sort_unstable();
    assert_eq!(pct(&buckets, 50), 250 * US);
    assert_eq!(lateness_weighted_median(&buckets), 4 * MS);

    // 4 outliers of 100 ms hold more than half of all lateness, but are under 5 % of the 100.
    let mut outliers: Vec<u64> = (0..96).map(|_| 4 * MS).chain([100 * MS; 4]).collect();
    outliers.sort_unstable();
    let top: u64 = outliers[96..].iter().sum();
    assert!(
        top * 2 > outliers.iter().sum::<u64>(),
        "the outliers hold more than half"
    );
    assert_eq!(lateness_weighted_median(&outliers), 4 * MS);
    // Outliers that are 6 % of the values (and hold half the total) do set it.
    let mut common: Vec<u64> = (0..94).map(|_| 4 * MS).chain([70 * MS; 6]).collect();
    common.sort_unstable();
    assert_eq!(lateness_weighted_median(&common), 70 * MS);

    assert_eq!(lateness_weighted_median(&[]), 0);
    assert_eq!(lateness_weighted_median(&[5 * MS]), 5 * MS);
}
