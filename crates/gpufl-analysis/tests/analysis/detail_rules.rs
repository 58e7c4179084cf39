//! Tests of what the recorder sees inside kernels (`kdetail`, `kstall`; issue 19): the merged
//! model, the rules `warp-divergence`, `uncoalesced-access`, `bank-conflicts`, `stall-reasons`,
//! and the kernel table's figures, on a synthetic session shaped like `examples/kernel_detail.cu`
//! (its lines, launch lines and Nsight Compute's figures in docs/kernel-detail.md).

use super::*;
use gpufl_analysis::kdetail::DetailSummary;
use std::collections::BTreeMap;

const US: u64 = 1_000;
const SRC: &str = "/work/main/examples/kernel_detail.cu";
const RULES: [&str; 4] = [
    "warp-divergence",
    "uncoalesced-access",
    "bank-conflicts",
    "stall-reasons",
];

macro_rules! data {
    ($i:expr, $v:ident) => {
        match &$i.data {
            Some(RuleData::$v(d)) => d,
            other => panic!("expected {} data, got {:?}", stringify!($v), other),
        }
    };
}

/// Counters of one line: (inst, thread_inst), then the rest through `f`.
fn m(inst: u64, thread_inst: u64) -> SassCounts {
    SassCounts {
        inst: Some(inst),
        thread_inst: Some(thread_inst),
        ..SassCounts::default()
    }
}

/// Global loads and stores at a line: (requests, sectors, ideal) each.
fn global(c: SassCounts, ld: (u64, u64, Option<u64>), st: (u64, u64, Option<u64>)) -> SassCounts {
    SassCounts {
        gld_inst: Some(ld.0),
        gld_sectors: Some(ld.1),
        gld_sectors_ideal: ld.2,
        gst_inst: Some(st.0),
        gst_sectors: Some(st.1),
        gst_sectors_ideal: st.2,
        ..c
    }
}

fn shared(c: SassCounts, inst: u64, wavefronts: u64, ideal: Option<u64>) -> SassCounts {
    SassCounts {
        shared_inst: Some(inst),
        shared_wavefronts: Some(wavefronts),
        shared_wavefronts_ideal: ideal,
        ..c
    }
}

/// The sum of lines' counters (every key present: a recorder's totals).
fn total(lines: &[(u32, SassCounts)]) -> SassCounts {
    let mut t = SassCounts::default();
    let add = |a: &mut Option<u64>, b: Option<u64>| {
        *a = Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0)));
    };
    for (_, c) in lines {
        add(&mut t.inst, c.inst);
        add(&mut t.thread_inst, c.thread_inst);
        add(&mut t.gld_inst, c.gld_inst);
        add(&mut t.gld_sectors, c.gld_sectors);
        add(&mut t.gst_inst, c.gst_inst);
        add(&mut t.gst_sectors, c.gst_sectors);
        add(&mut t.shared_inst, c.shared_inst);
        add(&mut t.shared_wavefronts, c.shared_wavefronts);
        // An ideal is in the totals when every line with the access has it.
        let ideal = |a: &mut Option<u64>, b: Option<u64>, actual: Option<u64>| match (b, actual) {
            (Some(v), _) => *a = a.map(|x| x.saturating_add(v)).or(Some(v)),
            (None, Some(n)) if n > 0 => *a = Some(u64::MAX),
            _ => {}
        };
        ideal(&mut t.gld_sectors_ideal, c.gld_sectors_ideal, c.gld_sectors);
        ideal(&mut t.gst_sectors_ideal, c.gst_sectors_ideal, c.gst_sectors);
        ideal(
            &mut t.shared_wavefronts_ideal,
            c.shared_wavefronts_ideal,
            c.shared_wavefronts,
        );
    }
    for x in [
        &mut t.gld_sectors_ideal,
        &mut t.gst_sectors_ideal,
        &mut t.shared_wavefronts_ideal,
    ] {
        if *x == Some(u64::MAX) {
            *x = None;
        }
    }
    t
}

/// A `kdetail` record of `kernel` with `lines` in `SRC` (their sum as totals).
fn kdetail(b: &mut B, kernel: &str, launches: u64, lines: &[(u32, SassCounts)]) {
    let name = b.s(kernel);
    let file = b.s(SRC);
    let recs = lines
        .iter()
        .map(|&(line, m)| KdetailLine { file, line, m })
        .collect();
    b.recs.push(Record::Kdetail(Box::new(Kdetail {
        name,
        dev: 0,
        start: 0,
        end: 1,
        launches,
        lineinfo: true,
        totals: total(lines),
        lines: recs,
        unmapped: None,
    })));
}

/// A `kstall` record of `kernel`: per line, (samples per reason).
fn kstall(b: &mut B, kernel: &str, lines: &[(u32, &[(&str, u64)])], unmapped: u64) {
    let name = b.s(kernel);
    let file = b.s(SRC);
    let mut all = unmapped;
    let recs = lines
        .iter()
        .map(|&(line, reasons)| {
            let stalls: BTreeMap<String, u64> =
                reasons.iter().map(|&(r, n)| (r.to_string(), n)).collect();
            let samples = stalls.values().sum();
            all += samples;
            KstallLine {
                file,
                line,
                samples,
                stalls,
            }
        })
        .collect();
    b.recs.push(Record::Kstall(Box::new(Kstall {
        name,
        dev: 0,
        start: 0,
        end: 1,
        launches: 10,
        period_log2: Some(17),
        lines: recs,
        unmapped,
        // The unmapped samples, all waiting on memory.
        unmapped_stalls: if unmapped > 0 {
            [("long_scoreboard".to_string(), unmapped)].into()
        } else {
            BTreeMap::new()
        },
        total: all,
    })));
}

/// `n` launches of `kernel`, `len` ns each, from `t` on; the first has a call-site stack at
/// `kernel_detail.cu:host_line` in main. Returns the end.
fn run_kernel(b: &mut B, kernel: &str, host_line: u32, n: u64, t: u64, len: u64) -> u64 {
    let st = b.user_stack(SRC, host_line, "main");
    let name = b.s(kernel);
    for i in 0..n {
        let corr = b.next_corr();
        b.recs.push(Record::Kernel(Kernel {
            name,
            start: t + i * len,
            end: t + (i + 1) * len,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr,
            grid: [16384, 1, 1],
            block: [256, 1, 1],
            regs: 32,
            ..Kernel::default()
        }));
        if i == 0 {
            let api = b.s("cudaLaunchKernel");
            b.recs.push(Record::Callsite(Callsite {
                corr,
                api,
                tid: 1,
                ts: t,
                stack: st,
                weight: None,
            }));
        }
    }
    t + n * len
}

/// Warps of one launch (4M threads).
const W: u64 = 131_072;

fn divergent_lines() -> Vec<(u32, SassCounts)> {
    vec![
        (43, m(40_000_000, 640_000_000)),
        (48, m(80_000_000, 1_280_000_000)),
        (56, m(1_000_000, 32_000_000)),
        (60, m(500_000, 16_000_000)),
    ]
}

fn uniform_lines() -> Vec<(u32, SassCounts)> {
    vec![
        (43, m(20_000_000, 640_000_000)),
        (48, m(40_000_000, 1_279_000_000)),
        (66, m(1_000_000, 32_000_000)),
    ]
}

fn strided_lines(ideal: bool) -> Vec<(u32, SassCounts)> {
    let i = |n: u64| ideal.then_some(n);
    vec![
        (79, m(2_000_000, 64_000_000)),
        (
            81,
            global(
                m(600_000, 19_200_000),
                (W, 32 * W, i(4 * W)),
                (W, 4 * W, i(4 * W)),
            ),
        ),
    ]
}

fn coalesced_lines() -> Vec<(u32, SassCounts)> {
    vec![(
        88,
        global(
            m(600_000, 19_200_000),
            (W, 4 * W, Some(4 * W)),
            (W, 4 * W, Some(4 * W)),
        ),
    )]
}

fn bank_lines() -> Vec<(u32, SassCounts)> {
    vec![
        (
            99,
            shared(m(4_000_000, 16_000_000), 524_288, 16_777_216, Some(524_288)),
        ),
        (
            102,
            shared(
                m(30_000_000, 960_000_000),
                2_097_152,
                33_637_554,
                Some(4_194_304),
            ),
        ),
    ]
}

fn padded_lines() -> Vec<(u32, SassCounts)> {
    vec![
        (
            114,
            shared(m(4_000_000, 16_000_000), 524_288, 524_288, Some(524_288)),
        ),
        (
            117,
            shared(
                m(30_000_000, 960_000_000),
                2_097_152,
                4_242_873,
                Some(4_194_304),
            ),
        ),
    ]
}

/// The kernels of `examples/kernel_detail.cu all`, 20 iterations, with the counters Nsight
/// Compute measured, and PC samples of `divergent` and `strided_load` (the probe's lines).
fn example() -> B {
    let mut b = B::new();
    let mut t = 0;
    for (k, line, len) in [
        ("divergent(float const*, float*)", 143, 350),
        ("uniform(float const*, float*)", 144, 200),
        ("strided_load(float const*, float*)", 145, 37),
        ("coalesced_load(float const*, float*)", 146, 12),
        ("bank_conflict(float const*, float*)", 147, 150),
        ("padded_shared(float const*, float*)", 148, 25),
    ] {
        t = run_kernel(&mut b, k, line, 20, t, len * US);
    }
    kdetail(
        &mut b,
        "divergent(float const*, float*)",
        1,
        &divergent_lines(),
    );
    kdetail(&mut b, "uniform(float const*, float*)", 1, &uniform_lines());
    kdetail(
        &mut b,
        "strided_load(float const*, float*)",
        1,
        &strided_lines(true),
    );
    kdetail(
        &mut b,
        "coalesced_load(float const*, float*)",
        1,
        &coalesced_lines(),
    );
    kdetail(
        &mut b,
        "bank_conflict(float const*, float*)",
        1,
        &bank_lines(),
    );
    kdetail(
        &mut b,
        "padded_shared(float const*, float*)",
        1,
        &padded_lines(),
    );
    kstall(
        &mut b,
        "divergent(float const*, float*)",
        &[
            (
                43,
                &[
                    ("mio_throttle", 150_000),
                    ("selected", 30_000),
                    ("wait", 18_126),
                ],
            ),
            (48, &[("wait", 50_000), ("branch_resolving", 35_525)]),
        ],
        0,
    );
    kstall(
        &mut b,
        "strided_load(float const*, float*)",
        &[(
            81,
            &[
                ("long_scoreboard", 30_012),
                ("selected", 512),
                ("wait", 2_516),
            ],
        )],
        60,
    );
    b
}

fn of<'a>(a: &'a Analysis, rule_name: &str, kernel: &str) -> Vec<&'a Insight> {
    rule(a, rule_name)
        .into_iter()
        .filter(|i| {
            let k = match &i.data {
                Some(RuleData::WarpDivergence(d)) => &d.site.kernel,
                Some(RuleData::UncoalescedAccess(d)) => &d.site.kernel,
                Some(RuleData::BankConflicts(d)) => &d.site.kernel,
                Some(RuleData::StallReasons(d)) => &d.site.kernel,
                _ => return false,
            };
            k.starts_with(kernel)
        })
        .collect()
}

fn js<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The planted examples
// ---------------------------------------------------------------------------------------------

#[test]
fn the_planted_kernels_are_named_at_their_lines() {
    let a = example().analyze();
    // warp-divergence: divergent, at the line with most lost lane-slots (path_b's loop).
    let v = of(&a, "warp-divergence", "divergent");
    assert_eq!(v.len(), 1, "{:#?}", rule(&a, "warp-divergence"));
    let i = v[0];
    assert_eq!(i.location.file, SRC);
    assert_eq!(i.location.line, Some(48));
    assert_eq!(i.location.origin, FrameOrigin::Native);
    assert!(
        i.title.contains(
            "@ kernel_detail.cu:48 · divergent: 16 of 32 lanes active there (16.2 over the kernel)"
        ),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("kernel_detail.cu:43 (16 lanes)"),
        "{}",
        i.detail
    );
    assert!(
        i.detail
            .contains("Launched at kernel_detail.cu:143 in main()"),
        "{}",
        i.detail
    );
    assert!(i.detail.contains("upper bound"), "{}", i.detail);
    assert!(i.fix.contains("sort or bin"), "{}", i.fix);
    let d = data!(i, WarpDivergence);
    assert!((d.lanes - 16.198).abs() < 0.01, "{}", d.lanes);
    assert_eq!(d.site.launch.as_ref().and_then(|l| l.line), Some(143));
    assert_eq!(js(d.site.location_source), "kernel_callsites");
    assert_eq!(d.lines.len(), 2, "lines with lost lanes: {:?}", d.lines);
    let expect = ((20 * 350 * US) as f64 * (1.0 - d.lanes / 32.0)) as u64;
    assert_eq!(i.impact_ns, expect);
    assert_eq!(i.severity, Severity::Medium);

    // uncoalesced-access: strided_load at its load line.
    let v = of(&a, "uncoalesced-access", "strided_load");
    assert_eq!(v.len(), 1, "{:#?}", rule(&a, "uncoalesced-access"));
    let i = v[0];
    assert_eq!(i.location.line, Some(81));
    assert!(
        i.title.contains(
            "@ kernel_detail.cu:81 · strided_load: loads take 32.0 sectors per request, 4.0 ideal"
        ),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("Launched at kernel_detail.cu:145"),
        "{}",
        i.detail
    );
    let d = data!(i, UncoalescedAccess);
    assert!(d.proven);
    assert_eq!(d.excess_sectors, 28 * W);
    assert_eq!(d.sectors, 36 * W);
    assert_eq!(d.line_kind, Some("load"));
    assert_eq!(i.impact_ns, ((20 * 37 * US) as f64 * 28.0 / 36.0) as u64);

    // bank-conflicts: bank_conflict at its read loop (more extra wavefronts than the fill's).
    let v = of(&a, "bank-conflicts", "bank_conflict");
    assert_eq!(v.len(), 1, "{:#?}", rule(&a, "bank-conflicts"));
    let i = v[0];
    assert_eq!(i.location.line, Some(102));
    assert!(
        i.title.contains(
            "@ kernel_detail.cu:102 · bank_conflict: 16.0 wavefronts per shared access there, 2.0 without conflicts"
        ),
        "{}",
        i.title
    );
    assert!(i.fix.contains("[32][33]"), "{}", i.fix);
    let d = data!(i, BankConflicts);
    assert_eq!(d.line_extra_wavefronts, Some(33_637_554 - 4_194_304));
    assert!((d.conflict_share - 45_696_178.0 / 50_414_770.0).abs() < 1e-9);

    // stall-reasons: divergent's samples (informational), strided_load's kernel is too small.
    let v = of(&a, "stall-reasons", "divergent");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].location.line, Some(43));
    assert_eq!(v[0].severity, Severity::Low);
    assert_eq!(v[0].impact_ns, 0);
    assert!(
        v[0].title.contains(
            "mostly waiting for the shared-memory/special-math queue (mio_throttle 75.7%)"
        ),
        "{}",
        v[0].title
    );
    assert!(
        v[0].fix.contains("fewer shared-memory instructions"),
        "{}",
        v[0].fix
    );
    assert!(of(&a, "stall-reasons", "strided_load").is_empty());
}

#[test]
fn the_clean_twins_raise_nothing() {
    let a = example().analyze();
    for twin in ["uniform", "coalesced_load", "padded_shared"] {
        for r in RULES {
            assert!(
                of(&a, r, twin).is_empty(),
                "{r} on {twin}: {:#?}",
                of(&a, r, twin)
            );
        }
    }
    // Nor do the planted kernels raise another detail rule's insight.
    for (k, own) in [
        ("divergent", "warp-divergence"),
        ("strided_load", "uncoalesced-access"),
        ("bank_conflict", "bank-conflicts"),
    ] {
        for r in RULES
            .iter()
            .filter(|r| **r != own && **r != "stall-reasons")
        {
            assert!(of(&a, r, k).is_empty(), "{r} on {k}");
        }
    }
}

#[test]
fn the_kernel_table_carries_the_counters() {
    let a = example().analyze();
    let row = |k: &str| {
        a.kernels
            .rows
            .iter()
            .find(|r| r.name.starts_with(k))
            .unwrap()
    };
    let d: &DetailSummary = row("divergent").detail.as_ref().unwrap();
    assert!((d.lanes.unwrap() - 16.198).abs() < 0.01);
    assert!(d.lineinfo);
    let d = row("strided_load").detail.as_ref().unwrap();
    assert_eq!(d.load_sectors_per_request, Some(32.0));
    assert_eq!(d.load_ideal_per_request, Some(4.0));
    assert!(!d.load_ideal_assumed);
    assert_eq!(d.store_sectors_per_request, Some(4.0));
    let d = row("bank_conflict").detail.as_ref().unwrap();
    assert!((d.bank_conflict_share.unwrap() - 0.906).abs() < 0.001);
    let j = js(&a.kernels);
    let padded = j["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"].as_str().unwrap().starts_with("padded"))
        .unwrap();
    assert!(padded["detail"]["bank_conflict_share"].as_f64().unwrap() < 0.02);
    assert_eq!(padded["detail"]["launches"], 1);
    // A session without kdetail records has no detail anywhere.
    let mut b = B::new();
    run_kernel(&mut b, "k", 10, 3, 0, 100 * US);
    let a = b.analyze();
    assert!(a.kernels.rows.iter().all(|r| r.detail.is_none()));
    assert!(!serde_json::to_string(&a.kernels)
        .unwrap()
        .contains("detail"));
    assert!(b.model().kernel_details().is_empty() && b.model().kernel_stalls().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Merging, line info, assumed ideals
// ---------------------------------------------------------------------------------------------

/// Counters by line.
type Lines = Vec<(u32, SassCounts)>;

/// Half of each counter (rounded down; the other half is the rest).
fn halves(lines: &[(u32, SassCounts)]) -> (Lines, Lines) {
    let split = |c: &SassCounts, first: bool| {
        let h = |v: Option<u64>| v.map(|x| if first { x / 2 } else { x - x / 2 });
        SassCounts {
            inst: h(c.inst),
            thread_inst: h(c.thread_inst),
            gld_inst: h(c.gld_inst),
            gld_sectors: h(c.gld_sectors),
            gld_sectors_ideal: h(c.gld_sectors_ideal),
            gst_inst: h(c.gst_inst),
            gst_sectors: h(c.gst_sectors),
            gst_sectors_ideal: h(c.gst_sectors_ideal),
            shared_inst: h(c.shared_inst),
            shared_wavefronts: h(c.shared_wavefronts),
            shared_wavefronts_ideal: h(c.shared_wavefronts_ideal),
            branch_uniform: h(c.branch_uniform),
            branch_divergent: h(c.branch_divergent),
        }
    };
    (
        lines.iter().map(|(l, c)| (*l, split(c, true))).collect(),
        lines.iter().map(|(l, c)| (*l, split(c, false))).collect(),
    )
}

#[test]
fn records_of_two_windows_and_two_trace_files_merge() {
    let one = {
        let mut b = B::new();
        run_kernel(
            &mut b,
            "divergent(float const*, float*)",
            143,
            20,
            0,
            350 * US,
        );
        kdetail(
            &mut b,
            "divergent(float const*, float*)",
            2,
            &divergent_lines(),
        );
        b
    };
    let two = {
        let mut b = B::new();
        run_kernel(
            &mut b,
            "divergent(float const*, float*)",
            143,
            20,
            0,
            350 * US,
        );
        let (x, y) = halves(&divergent_lines());
        kdetail(&mut b, "divergent(float const*, float*)", 1, &x);
        // A second trace file: ids start again, another string id for the same texts.
        b.recs.push(header());
        b.strs.clear();
        b.s("padding so the ids differ");
        kdetail(&mut b, "divergent(float const*, float*)", 1, &y);
        b
    };
    let (m1, m2) = (one.model(), two.model());
    assert_eq!(m2.files(), 2);
    let (d1, d2) = (m1.kernel_details(), m2.kernel_details());
    assert_eq!((d1.len(), d2.len()), (1, 1), "{d2:#?}");
    assert_eq!(d2[0].records, 2);
    assert_eq!(d2[0].launches, 2);
    assert_eq!(d1[0].totals, d2[0].totals);
    assert_eq!(d1[0].lines, d2[0].lines);
    assert_eq!(d2[0].lines.len(), 4);
    let (a1, a2) = (one.analyze(), two.analyze());
    let (i1, i2) = (rule(&a1, "warp-divergence"), rule(&a2, "warp-divergence"));
    assert_eq!(i1.len(), 1);
    assert_eq!(i2.len(), 1);
    assert_eq!(i1[0].title, i2[0].title);
    assert_eq!(i1[0].impact_ns, i2[0].impact_ns);
    assert!(
        i2[0].detail.contains("2 instrumented launch(es)"),
        "{}",
        i2[0].detail
    );

    // PC samples of two windows merge too.
    let mut b = B::new();
    run_kernel(
        &mut b,
        "strided_load(float const*, float*)",
        145,
        20,
        0,
        37 * US,
    );
    kstall(
        &mut b,
        "strided_load(float const*, float*)",
        &[(81, &[("long_scoreboard", 100)])],
        5,
    );
    kstall(
        &mut b,
        "strided_load(float const*, float*)",
        &[
            (81, &[("long_scoreboard", 50), ("wait", 10)]),
            (79, &[("wait", 7)]),
        ],
        0,
    );
    let m = b.model();
    let s = &m.kernel_stalls()[0];
    assert_eq!((s.records, s.total, s.unmapped), (2, 172, 5));
    assert_eq!(s.unmapped_reasons["long_scoreboard"], 5);
    assert_eq!(s.lines[0].line, 81);
    assert_eq!(s.lines[0].samples, 160);
    assert_eq!(
        s.lines[0].stalls,
        vec![
            ("long_scoreboard".to_string(), 150),
            ("wait".to_string(), 10)
        ]
    );
}

#[test]
fn a_kernel_without_line_info_is_located_at_its_launch_line() {
    let mut b = B::new();
    run_kernel(
        &mut b,
        "divergent(float const*, float*)",
        143,
        20,
        0,
        350 * US,
    );
    let name = b.s("divergent(float const*, float*)");
    b.recs.push(Record::Kdetail(Box::new(Kdetail {
        name,
        dev: 0,
        start: 0,
        end: 1,
        launches: 1,
        lineinfo: false,
        totals: total(&divergent_lines()),
        lines: Vec::new(),
        unmapped: Some(total(&divergent_lines())),
    })));
    let a = b.analyze();
    let v = rule(&a, "warp-divergence");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert_eq!(i.location.line, Some(143), "the launch line");
    assert!(
        i.title.contains(
            "@ kernel_detail.cu:143 · divergent: 16.2 of 32 lanes active per warp instruction"
        ),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("build with `nvcc -lineinfo`"),
        "{}",
        i.detail
    );
    let d = data!(i, WarpDivergence);
    assert!(!d.site.lineinfo);
    assert_eq!(d.site.line, None);
    let row = &a.kernels.rows[0];
    assert!(!row.detail.as_ref().unwrap().lineinfo);
}

#[test]
fn without_the_recorders_ideal_four_sectors_a_request_are_assumed() {
    // The strided load without ideals: 32 sectors a request is more than any coalesced access
    // of up to 16 bytes a lane takes: proven.
    let mut b = B::new();
    run_kernel(
        &mut b,
        "strided_load(float const*, float*)",
        145,
        20,
        0,
        37 * US,
    );
    kdetail(
        &mut b,
        "strided_load(float const*, float*)",
        1,
        &strided_lines(false),
    );
    let a = b.analyze();
    let v = rule(&a, "uncoalesced-access");
    assert_eq!(v.len(), 1);
    assert!(
        v[0].title
            .contains("32.0 sectors per request, 4.0 ideal (assumed: 4-byte accesses)"),
        "{}",
        v[0].title
    );
    assert!(data!(v[0], UncoalescedAccess).proven);
    assert!(v[0].impact_ns > 0);

    // 8 sectors a request without an ideal: a coalesced double load looks like this. LOW, no time.
    let doubles = vec![(
        90,
        global(m(600_000, 19_200_000), (W, 8 * W, None), (W, 8 * W, None)),
    )];
    let mut b = B::new();
    run_kernel(
        &mut b,
        "scale_double(double const*, double*)",
        150,
        20,
        0,
        50 * US,
    );
    kdetail(&mut b, "scale_double(double const*, double*)", 1, &doubles);
    let a = b.analyze();
    let v = rule(&a, "uncoalesced-access");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].severity, Severity::Low);
    assert_eq!(v[0].impact_ns, 0);
    assert!(
        v[0].title.starts_with("Possible uncoalesced access"),
        "{}",
        v[0].title
    );
    assert!(!data!(v[0], UncoalescedAccess).proven);
    // With the recorder's ideal (8 a request), nothing.
    let doubles = vec![(
        90,
        global(
            m(600_000, 19_200_000),
            (W, 8 * W, Some(8 * W)),
            (W, 8 * W, Some(8 * W)),
        ),
    )];
    let mut b = B::new();
    run_kernel(
        &mut b,
        "scale_double(double const*, double*)",
        150,
        20,
        0,
        50 * US,
    );
    kdetail(&mut b, "scale_double(double const*, double*)", 1, &doubles);
    assert!(rule(&b.analyze(), "uncoalesced-access").is_empty());
}

// ---------------------------------------------------------------------------------------------
// stall-reasons: MEDIUM only for a heavy kernel waiting on memory at one line
// ---------------------------------------------------------------------------------------------

#[test]
fn a_heavy_kernel_waiting_on_memory_at_one_line_claims_its_time() {
    let strided = |coalesced: bool, with_detail: bool| {
        let mut b = B::new();
        let k = "strided_load(float const*, float*)";
        run_kernel(&mut b, k, 145, 20, 0, 37 * US);
        if with_detail {
            let lines = if coalesced {
                vec![(81, coalesced_lines()[0].1)]
            } else {
                strided_lines(true)
            };
            kdetail(&mut b, k, 1, &lines);
        }
        kstall(
            &mut b,
            k,
            &[(
                81,
                &[
                    ("long_scoreboard", 30_012),
                    ("selected", 512),
                    ("wait", 2_516),
                ],
            )],
            60,
        );
        b.analyze()
    };
    let a = strided(false, true);
    let v = rule(&a, "stall-reasons");
    assert_eq!(v.len(), 1);
    let i = v[0];
    // Its estimated time is most of this one-kernel session.
    assert_eq!(i.severity, Severity::High);
    assert_eq!(i.location.line, Some(81));
    assert!(
        i.title
            .contains("mostly waiting on memory (long_scoreboard 90.8%)"),
        "{}",
        i.title
    );
    assert!(i.fix.contains("coalesce"), "{}", i.fix);
    let d = data!(i, StallReasons);
    assert!(d.memory_bound_line);
    assert_eq!(d.samples, 33_100);
    assert_eq!(
        i.impact_ns,
        ((20 * 37 * US) as f64 * 30_012.0 / 33_100.0) as u64
    );
    // Without counters, the same.
    assert_eq!(
        rule(&strided(false, false), "stall-reasons")[0].severity,
        Severity::High
    );
    // Its accesses coalesced (the counters say so): waiting on bandwidth, LOW.
    let a = strided(true, true);
    let v = rule(&a, "stall-reasons");
    assert_eq!(v[0].severity, Severity::Low);
    assert_eq!(v[0].impact_ns, 0);

    // A light kernel: LOW. Too few samples: nothing.
    let mut b = B::new();
    let k = "strided_load(float const*, float*)";
    run_kernel(&mut b, k, 145, 20, 0, 37 * US);
    run_kernel(&mut b, "big(float*)", 150, 20, 740 * US, 300 * US);
    kstall(&mut b, k, &[(81, &[("long_scoreboard", 30_012)])], 0);
    kstall(
        &mut b,
        "big(float*)",
        &[(200, &[("long_scoreboard", 49)])],
        0,
    );
    let a = b.analyze();
    let v = rule(&a, "stall-reasons");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].severity, Severity::Low);
}

// ---------------------------------------------------------------------------------------------
// Damaged and odd values
// ---------------------------------------------------------------------------------------------

#[test]
fn odd_counts_never_panic_nor_divide_by_zero() {
    let mut b = B::new();
    let k = "odd(float*)";
    run_kernel(&mut b, k, 10, 5, 0, 100 * US);
    let lines = vec![
        // No instructions but threads; more threads than 32 lanes a warp can have.
        (1, m(0, 1_000)),
        (2, m(10, 1_000)),
        // Ideal above the actual count; sectors without requests.
        (3, global(m(5, 160), (10, 10, Some(1_000)), (0, 500, None))),
        // Shared ideal above the wavefronts; wavefronts without instructions.
        (4, shared(m(5, 160), 0, 10, Some(50))),
        // Saturating sums.
        (5, m(u64::MAX, u64::MAX)),
        (5, m(u64::MAX, 3)),
    ];
    kdetail(&mut b, k, u64::MAX, &lines);
    kdetail(&mut b, k, u64::MAX, &lines);
    // Totals of zeros and absent keys.
    let name = b.s(k);
    b.recs.push(Record::Kdetail(Box::new(Kdetail {
        name,
        ..Kdetail::default()
    })));
    // A damaged kstall: total 0 under lines with samples; a line of no samples.
    let file = b.s(SRC);
    b.recs.push(Record::Kstall(Box::new(Kstall {
        name,
        dev: 0,
        total: 0,
        lines: vec![
            KstallLine {
                file,
                line: 1,
                samples: 100,
                stalls: BTreeMap::new(),
            },
            KstallLine {
                file,
                line: 2,
                samples: 0,
                stalls: [("long_scoreboard".to_string(), u64::MAX)].into(),
            },
        ],
        ..Kstall::default()
    })));
    // Records of a kernel never launched, of another device, with undefined string ids.
    b.recs.push(Record::Kdetail(Box::new(Kdetail {
        name: StrId(9_999),
        dev: 3,
        lines: vec![KdetailLine {
            file: StrId(12_345),
            line: 7,
            m: m(10, 100),
        }],
        totals: m(10, 100),
        ..Kdetail::default()
    })));
    let model = b.model();
    let a = analyze(&model, &Config::default());
    assert!(model.kernel_details().iter().any(|d| d.name == "?"));
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("referenced but never defined")),
        "{:?}",
        a.warnings
    );
    let d = model.kernel_detail(k, 0).unwrap();
    assert_eq!(d.records, 3);
    assert_eq!(d.launches, u64::MAX);
    // Lanes are capped at 32.
    let lanes = d.totals.lanes().unwrap();
    assert!((0.0..=32.0).contains(&lanes), "{lanes}");
    let s = model.kernel_stall(k, 0).unwrap();
    assert!(s.total >= 100, "the total is at least the lines' samples");
    let row = a.kernels.rows.iter().find(|r| r.name == k).unwrap();
    let sum = row.detail.as_ref().unwrap();
    assert!(sum.lanes.is_some_and(|l| l <= 32.0));
    // Whatever the rules said, the figures are finite and shares at most 100 %.
    for i in &a.insights {
        assert!(
            !i.detail.contains("e+") && !i.title.contains("NaN"),
            "{}",
            i.detail
        );
        for pct in i
            .detail
            .split('%')
            .filter_map(|p| p.rsplit(' ').next()?.parse::<f64>().ok())
        {
            assert!(pct <= 100.0, "{pct} in {}", i.detail);
        }
        assert!(i.share_of_window.is_finite() && i.share_of_wall.is_finite());
    }
}

#[test]
fn kdetail_records_read_back_from_a_written_trace() {
    // Written by the trace writer and read by the session reader: the same model.
    let b = example();
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    for r in &b.recs[1..] {
        w.write(r).unwrap();
    }
    let bytes = w.finish(1, "exit").unwrap();
    let mut rd = TraceReader::from_bytes(bytes, "mem").unwrap();
    let m = Model::load(rd.by_ref());
    assert!(rd.warnings().is_empty(), "{:?}", rd.warnings());
    assert_eq!(m.kernel_details(), b.model().kernel_details());
    assert_eq!(m.kernel_stalls(), b.model().kernel_stalls());
    assert_eq!(m.kernel_details().len(), 6);
}

#[test]
fn mutated_kdetail_and_kstall_lines_never_panic() {
    // The example session as plain NDJSON; its kdetail and kstall lines mutated byte by byte
    // (seeded), each mutant read, loaded and analysed.
    let b = example();
    let mut lines: Vec<String> = b
        .recs
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let targets: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("{\"t\":\"kdetail\"") || l.starts_with("{\"t\":\"kstall\""))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(targets.len(), 8);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let bytes = b"0123456789-.,:{}[]\"e ";
    for _ in 0..300 {
        let i = targets[(next() % targets.len() as u64) as usize];
        let orig = lines[i].clone();
        let mut m = orig.clone().into_bytes();
        for _ in 0..1 + next() % 4 {
            let at = (next() % m.len() as u64) as usize;
            m[at] = bytes[(next() % bytes.len() as u64) as usize];
        }
        lines[i] = String::from_utf8_lossy(&m).into_owned();
        let text = lines.join("\n") + "\n";
        let mut rd = TraceReader::from_bytes(text.into_bytes(), "mut").unwrap();
        let model = Model::load(rd.by_ref());
        let a = analyze(&model, &Config::default());
        for ins in &a.insights {
            assert!(ins.share_of_window.is_finite());
        }
        lines[i] = orig;
    }
}

/// A kernel built without line info (PyTorch's, cuBLAS's): its samples are on no line, but their
/// reasons still say what its warps wait on — named in the title, with that reason's fix and the
/// advice to build with `-lineinfo`, at the launch line, LOW.
#[test]
fn stall_reasons_without_line_info_name_the_kernels_dominant_reason() {
    let mut b = B::new();
    let k = "reduce_kernel(float const*, float*)";
    run_kernel(&mut b, k, 143, 20, 0, 350 * US);
    kstall(&mut b, k, &[], 900);
    let a = b.analyze();
    let v = rule(&a, "stall-reasons");
    assert_eq!(v.len(), 1, "{v:?}");
    let i = v[0];
    assert_eq!(i.location.line, Some(143), "the launch line");
    assert_eq!(i.severity, Severity::Low);
    assert!(
        i.title
            .contains("no line inside the kernel; mostly waiting on memory (long_scoreboard 100.0% of 900 samples)"),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("Over the kernel: long_scoreboard 100.0%"),
        "{}",
        i.detail
    );
    assert!(
        i.fix.contains("`long_scoreboard`") && i.fix.contains("-lineinfo"),
        "{}",
        i.fix
    );
    match &i.data {
        Some(RuleData::StallReasons(d)) => {
            assert_eq!(d.dominant.as_deref(), Some("long_scoreboard"));
            assert_eq!(d.dominant_samples, 900);
            assert!(!d.memory_bound_line, "no line: never MEDIUM");
        }
        other => panic!("{other:?}"),
    }
}

/// The recorder's debug notices (kernel detail's diagnostics) stay out of the report's warnings;
/// its warnings do not.
#[test]
fn debug_notices_are_not_report_warnings() {
    let mut b = B::new();
    run_kernel(
        &mut b,
        "divergent(float const*, float*)",
        143,
        2,
        0,
        350 * US,
    );
    for (level, message) in [
        ("debug", "kernel detail: first stall sample: enable 0.1 ms"),
        (
            "warning",
            "kernel detail stopped: cuptiSassMetricsEnable failed",
        ),
        ("info", "kernel detail on: the top 5 kernels"),
    ] {
        b.recs.push(Record::Notice(gpufl_trace::Notice {
            level: level.into(),
            message: message.into(),
        }));
    }
    let model = b.model();
    let a = analyze(&model, &Config::default());
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("kernel detail stopped")),
        "{:?}",
        a.warnings
    );
    assert!(
        !a.warnings
            .iter()
            .any(|w| w.contains("first stall sample") || w.contains("kernel detail on")),
        "{:?}",
        a.warnings
    );
}
