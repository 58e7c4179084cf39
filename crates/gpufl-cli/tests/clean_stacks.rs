//! Issue 37, clean stacks, over every bundled session (testdata/sessions) and run (testdata/runs),
//! through the `gpufl` binary: no stack that `dump`, `report` or `export` shows starts with a
//! frame of the recorder, CUPTI, the driver or the CUDA runtime's internals unless `--all-frames`;
//! with `--all-frames` every recorded frame is there, the recorded first one first.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;
use common::root;

fn bundled() -> Vec<PathBuf> {
    common::bundled_all()
}

fn gpufl(args: &[&str], dir: &Path) -> Vec<u8> {
    common::gpufl_on(args, dir)
}

/// A frame as `dump` and the exports describe it (`func [module+0xoff]` or `func (file:line)`)
/// that must not lead a shown stack: the recorder's, CUPTI's, the driver's, or an unnamed frame of
/// the CUDA runtime.
fn is_cuda_internal(frame: &str) -> bool {
    ["[libcupti.", "[libcuda.so", "[libgpufl_capture"]
        .iter()
        .any(|m| frame.contains(m))
        || frame.starts_with("?? [libcudart")
}

/// The `stack` of each dumped record of the types that carry one, in order.
fn dumped_stacks(dir: &Path, all: bool) -> Vec<Vec<String>> {
    let mut args = vec!["dump", "--type", "sync,callsite,hostcall,hsample"];
    if all {
        args.push("--all-frames");
    }
    let out = String::from_utf8(gpufl(&args, dir)).expect("utf-8");
    out.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .map(|v| match &v["stack"] {
            Value::Array(a) => a
                .iter()
                .map(|f| f.as_str().expect("frame").to_string())
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Every bundled session directory (a run's sessions one by one).
fn sessions() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in bundled() {
        if d.join("run.json").exists() {
            for e in std::fs::read_dir(&d).expect("run") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    v.push(p);
                }
            }
        } else {
            v.push(d);
        }
    }
    v.sort();
    v
}

/// The frame count of each stack of the records above, from the raw dump (stack id → its
/// `stack` record's frames); 0 for a record without a stack.
fn raw_lengths(dir: &Path) -> Vec<usize> {
    let out = String::from_utf8(gpufl(
        &[
            "dump",
            "--raw",
            "--type",
            "stack,sync,callsite,hostcall,hsample",
        ],
        dir,
    ))
    .expect("utf-8");
    let mut stacks: HashMap<u64, usize> = HashMap::new();
    let mut lens = Vec::new();
    for l in out.lines() {
        let v: Value = serde_json::from_str(l).expect("json");
        if v["t"] == "stack" {
            let n = v["frames"].as_array().map_or(0, Vec::len);
            stacks.insert(v["id"].as_u64().expect("id"), n);
            continue;
        }
        lens.push(
            v["stack"]
                .as_u64()
                .map_or(0, |id| stacks.get(&id).copied().unwrap_or(0)),
        );
    }
    lens
}

#[test]
fn dump_shows_stacks_from_the_programs_call_unless_all_frames() {
    let mut trimmed = 0usize;
    let mut stacks = 0usize;
    for dir in sessions() {
        let shown = dumped_stacks(&dir, false);
        let all = dumped_stacks(&dir, true);
        assert_eq!(shown.len(), all.len(), "{}", dir.display());
        for (s, a) in shown.iter().zip(&all) {
            if let Some(first) = s.first() {
                assert!(
                    !is_cuda_internal(first),
                    "{}: a stack starts with {first}",
                    dir.display()
                );
            }
            // The shown stack is the recorded one without some of its leading frames, which are
            // all CUDA's or the recorder's.
            assert!(
                a.ends_with(s),
                "{}: shown {s:?} not a tail of {a:?}",
                dir.display()
            );
            let hidden = &a[..a.len() - s.len()];
            assert!(
                hidden.iter().all(|f| is_cuda_internal(f)
                    || f.contains("[libcuda")
                    || f.contains("[libcudart")),
                "{}: hid {hidden:?}",
                dir.display()
            );
            stacks += 1;
            trimmed += usize::from(!hidden.is_empty());
        }
        // With --all-frames, every recorded frame: as many as the raw stack record holds.
        let lens = raw_lengths(&dir);
        let all_lens: Vec<usize> = all.iter().map(Vec::len).collect();
        assert_eq!(all_lens, lens, "{}", dir.display());
    }
    // The recordings begin their CUDA calls' stacks inside CUPTI: ~20,000 of the ~98,000 stacks
    // (most are host samples' Python stacks) lose frames.
    assert!(stacks > 50_000, "{stacks} stacks");
    assert!(trimmed > 10_000, "{trimmed} of {stacks} stacks trimmed");
}

#[test]
fn dump_all_frames_starts_with_the_recorded_cupti_frames() {
    let dir = root().join("testdata/sessions/hf_trainer-1609-20261124T064244Z");
    let all = dumped_stacks(&dir, true);
    let shown = dumped_stacks(&dir, false);
    let first = &all.iter().find(|s| !s.is_empty()).expect("a stack")[0];
    assert!(first.starts_with("?? [libcupti.so"), "{first}");
    // The first sync of hf_trainer: recorded under CUPTI and the driver, shown from the runtime's
    // entry point that names the call.
    let i = all.iter().position(|s| !s.is_empty()).expect("a stack");
    assert!(
        shown[i][0].starts_with("cudaMemcpyAsync [libcudart.so"),
        "{:?}",
        shown[i]
    );
    assert_eq!(
        all[i].len() - shown[i].len(),
        7,
        "6 CUPTI frames and the driver's"
    );
}

/// Every `args.stack` of a Chrome export.
fn chrome_stacks(v: &Value) -> Vec<Vec<String>> {
    v["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter_map(|e| e.pointer("/args/stack").and_then(Value::as_array))
        .map(|a| {
            a.iter()
                .map(|f| f.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn exports_write_stacks_from_the_programs_call_unless_all_frames() {
    let tmp = std::env::temp_dir().join(format!("gpufl-clean-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let (chrome, pf) = (tmp.join("t.json"), tmp.join("t.pftrace"));
    let (mut cut, mut total) = (0usize, 0usize);
    for dir in bundled() {
        let export = |format: &str, out: &Path, all: bool| -> Vec<u8> {
            let o = out.to_str().expect("utf-8 path");
            let mut args = vec!["export", "-q", "--insights-max-records", "0"];
            args.extend(["--format", format, "-o", o]);
            if all {
                args.push("--all-frames");
            }
            gpufl(&args, &dir);
            std::fs::read(out).expect("export written")
        };
        let shown: Value = serde_json::from_slice(&export("chrome", &chrome, false)).expect("json");
        let all: Value = serde_json::from_slice(&export("chrome", &chrome, true)).expect("json");
        let (shown, all) = (chrome_stacks(&shown), chrome_stacks(&all));
        assert_eq!(shown.len(), all.len(), "{}", dir.display());
        for (s, a) in shown.iter().zip(&all) {
            if let Some(first) = s.first() {
                assert!(!is_cuda_internal(first), "{}: {first}", dir.display());
            }
            assert!(a.ends_with(s), "{}: {s:?} of {a:?}", dir.display());
            total += 1;
            cut += usize::from(a.len() > s.len());
        }
        // Perfetto: the CUPTI and driver frames, which only ever lead a stack, are not written.
        let bytes = export("perfetto", &pf, false);
        for needle in [&b"[libcupti."[..], b"[libcuda.so"] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{}: perfetto export holds {}",
                dir.display(),
                String::from_utf8_lossy(needle)
            );
        }
        let leads_cupti = all
            .iter()
            .any(|s| s.first().is_some_and(|f| is_cuda_internal(f)));
        if leads_cupti {
            let bytes = export("perfetto", &pf, true);
            assert!(
                bytes.windows(10).any(|w| w == b"[libcupti."),
                "{}: --all-frames writes the recorded frames",
                dir.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        total > 10_000 && cut * 4 > total,
        "{cut} of {total} stacks cut"
    );
}

#[test]
fn reports_print_no_cuda_internal_frame() {
    for dir in bundled() {
        for args in [&["report"][..], &["report", "--json"]] {
            let out = String::from_utf8(gpufl(args, &dir)).expect("utf-8");
            for needle in [
                "[libcupti.",
                "[libcuda.so",
                "?? [libcudart",
                "libgpufl_capture",
            ] {
                assert!(
                    !out.contains(needle),
                    "{} {args:?} prints {needle}",
                    dir.display()
                );
            }
        }
    }
}
