//! The recorder's side of kernel detail offline (issue 19): CUPTI's per-PC SASS-metrics records of
//! one launch of each kernel of examples/kernel_detail.cu (testdata/kdetail/probe-pcs.tsv, read on
//! the H100 by scripts/probe/sassmetrics.cu) folded by `kernel_detail::fold` with gpufl's own line
//! table of the cubin CUPTI handed over (testdata/cubin/kernel_detail.sm_90.cubin): the counters
//! land on the planted lines with Nsight Compute's figures.

use gpufl_capture::cubin_lines::LineTable;
use gpufl_capture::kernel_detail::{fold, KernelCounts, PcValues};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// One PC of the probe: its function, offset, and (metric id, value) pairs.
type PcRow = (String, u32, Vec<(u64, u64)>);

fn folded() -> Vec<KernelCounts> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let cubin = std::fs::read(root.join("cubin/kernel_detail.sm_90.cubin")).unwrap();
    let tsv = std::fs::read_to_string(root.join("kdetail/probe-pcs.tsv")).unwrap();
    // Metric ids as CUPTI would give them: any distinct non-zero numbers, in METRICS order.
    let ids: [u64; 12] = std::array::from_fn(|i| 1000 + i as u64);
    let rows: Vec<PcRow> = tsv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("function\t"))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            // One record per (PC, metric), as CUPTI gives them at GPU granularity.
            let vals = (0..12)
                .map(|i| (ids[i], f[3 + i].parse::<u64>().unwrap()))
                .collect();
            (f[0].to_string(), f[1].parse().unwrap(), vals)
        })
        .collect();
    let mut tables = BTreeMap::new();
    tables.insert(0xc33b_b5d5u32, Arc::new(LineTable::parse(&cubin).unwrap()));
    let recs = rows.iter().flat_map(|(function, pc, vals)| {
        vals.iter().map(move |v| PcValues {
            crc: 0xc33b_b5d5,
            function,
            pc: *pc,
            values: std::slice::from_ref(v),
        })
    });
    fold(&ids, recs, &tables)
}

fn kernel<'a>(k: &'a [KernelCounts], name: &str) -> &'a KernelCounts {
    k.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn probe_counters_fold_onto_the_planted_lines() {
    let k = folded();
    assert_eq!(k.len(), 6);
    for c in &k {
        assert!(c.lineinfo, "{} has line info", c.name);
        assert!(c.unmapped.inst == 0, "{}: every PC on a line", c.name);
        assert!(c.lines.keys().all(|(f, _)| f.ends_with("kernel_detail.cu")));
    }
    let at = |c: &KernelCounts, line: u32| {
        c.lines
            .iter()
            .find(|((_, l), _)| *l == line)
            .map(|(_, v)| *v)
            .unwrap_or_default()
    };
    // divergent: 16.18 lanes (Nsight Compute 16.18); every divergent branch at the planted `if`.
    let d = kernel(&k, "_Z9divergentPKfPf");
    let lanes = d.totals.thread_inst as f64 / d.totals.inst as f64;
    assert!((lanes - 16.18).abs() < 0.01, "{lanes}");
    assert_eq!(at(d, 56).branch_divergent, d.totals.branch_divergent);
    assert!(d.totals.branch_divergent > 0);
    let eff = d.totals.branch_uniform as f64
        / (d.totals.branch_uniform + d.totals.branch_divergent) as f64;
    assert!((eff * 100.0 - 99.27).abs() < 0.1, "{eff}");
    // uniform: no divergent branch at all, 32 lanes.
    let u = kernel(&k, "_Z7uniformPKfPf");
    assert_eq!(u.totals.branch_divergent, 0);
    assert_eq!(u.totals.thread_inst, 32 * u.totals.inst);
    // strided_load: the load at :81 takes 32 sectors a request (ideal 4); its store 4.
    let s = at(kernel(&k, "_Z12strided_loadPKfPf"), 81);
    assert_eq!(s.gld_sectors, 32 * s.gld_inst);
    assert_eq!(s.gld_sectors_ideal, 4 * s.gld_inst);
    assert_eq!(s.gst_sectors, 4 * s.gst_inst);
    let c = kernel(&k, "_Z14coalesced_loadPKfPf").totals;
    assert_eq!(c.gld_sectors, 4 * c.gld_inst);
    // bank_conflict: the load at :102 takes 8x its ideal wavefronts (Nsight Compute: 29.4 M
    // conflicts of 33.6 M wavefronts); padded_shared none extra.
    let b = at(kernel(&k, "_Z13bank_conflictPKfPf"), 102);
    assert_eq!(b.shared_wavefronts - b.shared_wavefronts_ideal, 29_360_128);
    let p = kernel(&k, "_Z13padded_sharedPKfPf").totals;
    assert_eq!(p.shared_wavefronts, p.shared_wavefronts_ideal);
}

/// PC-sampling stall samples fold onto the cubin's lines: strided_load's samples as the H100
/// probe saw them (scripts/probe/pcstartstop.cu: mostly `long_scoreboard` at its load, line 81)
/// land on :81 through gpufl's own line table; the `_not_issued` subset and other functions'
/// PCs are not counted.
#[test]
fn stall_samples_land_on_the_load_line() {
    use gpufl_capture::kernel_stall::{fold as fold_stalls, reason_name, PcSample};
    use std::collections::HashMap;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let cubin = std::fs::read(root.join("cubin/kernel_detail.sm_90.cubin")).unwrap();
    let golden = std::fs::read_to_string(root.join("cubin/kernel_detail.sm_90.lines.tsv")).unwrap();
    // The strided load's PCs by line, from the golden table (CUPTI's own mapping).
    let pcs_at = |line: u32| -> Vec<u64> {
        golden
            .lines()
            .filter(|l| l.starts_with("_Z12strided_loadPKfPf\t"))
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[2].parse::<u32>().ok()? == line).then(|| f[1].parse().unwrap())
            })
            .collect()
    };
    let names: HashMap<u32, Option<String>> = [
        (0, "smsp__pcsamp_warps_issue_stalled_long_scoreboard"),
        (
            1,
            "smsp__pcsamp_warps_issue_stalled_long_scoreboard_not_issued",
        ),
        (2, "smsp__pcsamp_warps_issue_stalled_drain"),
        (3, "smsp__pcsamp_warps_issue_stalled_wait"),
    ]
    .into_iter()
    .map(|(i, n)| (i, reason_name(n)))
    .collect();
    let load = pcs_at(81);
    let store = pcs_at(82);
    assert!(!load.is_empty() && !store.is_empty());
    let at_load = [(0u32, 1700u32), (1, 1490), (3, 10)];
    let at_store = [(2u32, 246u32), (3, 4)];
    let mut samples = vec![PcSample {
        crc: 7,
        function: b"_Z12strided_loadPKfPf",
        pc: load[0],
        reasons: &at_load,
    }];
    samples.push(PcSample {
        crc: 7,
        function: b"_Z12strided_loadPKfPf",
        pc: store[0],
        reasons: &at_store,
    });
    samples.push(PcSample {
        crc: 7,
        function: b"_Z9divergentPKfPf",
        pc: 0,
        reasons: &at_load,
    });
    let mut tables = BTreeMap::new();
    tables.insert(7u32, Arc::new(LineTable::parse(&cubin).unwrap()));
    let key = gpufl_capture::kernel_detail::key(b"_Z12strided_loadPKfPf");
    let s = fold_stalls(key, &names, samples, &tables).unwrap();
    assert_eq!(s.total, 1700 + 10 + 246 + 4);
    assert_eq!(s.unmapped, 0);
    let (file, line) = s.lines.keys().next().unwrap().clone();
    assert!(file.ends_with("kernel_detail.cu"), "{file}");
    let l81 = &s.lines[&(file.clone(), 81)];
    assert_eq!(l81.0, 1710);
    assert_eq!(l81.1["long_scoreboard"], 1700);
    assert!(!l81.1.contains_key("long_scoreboard_not_issued"));
    assert_eq!(s.lines[&(file, 82)].1["drain"], 246);
    assert_eq!(line, 81);
}
