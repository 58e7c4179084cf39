//! SASS PC → source line of real cubins (`gpufl_capture::cubin_lines`).
//!
//! Two kinds of check:
//! - `GOLDEN`: single PCs with the line an independent decoder gives (extend it with each new
//!   cubin, e.g. CUPTI's own PC → line mapping);
//! - `CUBINS`: every instruction of every kernel maps to a line of the kernel's source file that
//!   lies in that kernel's body or in a `__device__` function the body calls (read from the `.cu`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpufl_capture::cubin_lines::LineTable;
use object::{Object, ObjectSection};

/// SASS instructions are 16 bytes on sm_70 and later.
const INSTRUCTION: u64 = 16;

const PITFALLS: &str = "kernel_pitfalls.sm_90.cubin";

/// (cubin under testdata/cubin, mangled function, PC offset, file name suffix, line).
///
/// kernel_pitfalls.sm_90.cubin: from `readelf --debug-dump=decodedline` (binutils 2.42). At 0x60
/// of spills and regs_heavy readelf lists the kernel's line (74, 67) then, at the same address,
/// the line of the inlined `relax` (53): the innermost is expected.
#[rustfmt::skip]
const GOLDEN: &[(&str, &str, u64, &str, u32)] = &[
    (PITFALLS, "_Z10small_gridPfi", 0x0, "kernel_pitfalls.cu", 78),
    (PITFALLS, "_Z10small_gridPfi", 0x10, "kernel_pitfalls.cu", 79),
    (PITFALLS, "_Z10small_gridPfi", 0x20, "kernel_pitfalls.cu", 81),
    (PITFALLS, "_Z10small_gridPfi", 0x30, "kernel_pitfalls.cu", 79),
    (PITFALLS, "_Z10small_gridPfi", 0x40, "kernel_pitfalls.cu", 79),
    (PITFALLS, "_Z10small_gridPfi", 0x50, "kernel_pitfalls.cu", 80),
    (PITFALLS, "_Z10small_gridPfi", 0xb0, "kernel_pitfalls.cu", 81),
    (PITFALLS, "_Z10small_gridPfi", 0x480, "kernel_pitfalls.cu", 81),
    (PITFALLS, "_Z10small_gridPfi", 0x490, "kernel_pitfalls.cu", 82),
    (PITFALLS, "_Z10small_gridPfi", 0x4a0, "kernel_pitfalls.cu", 83),
    (PITFALLS, "_Z10small_gridPfi", 0x570, "kernel_pitfalls.cu", 83),
    (PITFALLS, "_Z6spillsPKfPfi", 0x0, "kernel_pitfalls.cu", 72),
    (PITFALLS, "_Z6spillsPKfPfi", 0x50, "kernel_pitfalls.cu", 73),
    (PITFALLS, "_Z6spillsPKfPfi", 0x60, "kernel_pitfalls.cu", 53),
    (PITFALLS, "_Z6spillsPKfPfi", 0x4110, "kernel_pitfalls.cu", 54),
    (PITFALLS, "_Z6spillsPKfPfi", 0x4290, "kernel_pitfalls.cu", 56),
    (PITFALLS, "_Z6spillsPKfPfi", 0x5d50, "kernel_pitfalls.cu", 60),
    (PITFALLS, "_Z6spillsPKfPfi", 0x6530, "kernel_pitfalls.cu", 74),
    (PITFALLS, "_Z6spillsPKfPfi", 0x6540, "kernel_pitfalls.cu", 60),
    (PITFALLS, "_Z6spillsPKfPfi", 0x68e0, "kernel_pitfalls.cu", 75),
    (PITFALLS, "_Z6spillsPKfPfi", 0x6970, "kernel_pitfalls.cu", 75),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x0, "kernel_pitfalls.cu", 65),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x60, "kernel_pitfalls.cu", 53),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x3520, "kernel_pitfalls.cu", 56),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x4450, "kernel_pitfalls.cu", 60),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x4490, "kernel_pitfalls.cu", 67),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x4c00, "kernel_pitfalls.cu", 68),
    (PITFALLS, "_Z10regs_heavyPKfPfi", 0x4cf0, "kernel_pitfalls.cu", 68),
];

/// (cubin under testdata/cubin, its source, relative to the repository root).
const CUBINS: &[(&str, &str)] = &[(PITFALLS, "examples/kernel_pitfalls.cu")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cubin(name: &str) -> Vec<u8> {
    let p = repo().join("testdata/cubin").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A function of a `.cu` file: its name, whether `__global__`, and its lines (first..=last).
#[derive(Debug)]
struct SourceFn {
    name: String,
    global: bool,
    first: u32,
    last: u32,
    body: String,
}

/// The `__global__` and `__device__` function definitions of a `.cu` file (lines from 1).
fn source_functions(src: &str) -> Vec<SourceFn> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        if t.starts_with("//") || !(t.contains("__global__") || t.contains("__device__")) {
            continue;
        }
        // The text from here to the end of the function, braces counted.
        let rest: String = lines[i..].join("\n");
        let Some(open) = rest.find('{') else { continue };
        if rest[..open].contains(';') {
            continue; // a declaration
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.expect("unbalanced braces");
        // Name: the identifier before the first '(' that is not an attribute.
        let head = &rest[..open];
        let name = head
            .match_indices('(')
            .map(|(p, _)| {
                let before = head[..p].trim_end();
                let start = before
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |s| s + 1);
                before[start..].to_string()
            })
            .find(|n| !n.is_empty() && !n.starts_with("__"))
            .expect("function name");
        let first = i as u32 + 1;
        let last = first + rest[..close].matches('\n').count() as u32;
        out.push(SourceFn {
            name,
            global: t.contains("__global__"),
            first,
            last,
            body: rest[open..=close].to_string(),
        });
    }
    out
}

/// `_Z10small_gridPfi` → `small_grid` (plain Itanium names only).
fn plain(mangled: &str) -> &str {
    let rest = mangled.strip_prefix("_Z").unwrap_or(mangled);
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let n: usize = rest[..digits].parse().expect("mangled length");
    &rest[digits..digits + n]
}

/// Sizes of the `.text.<function>` sections, read with the `object` crate.
fn text_sizes(data: &[u8]) -> Vec<(String, u64)> {
    let file = object::File::parse(data).expect("ELF");
    file.sections()
        .filter_map(|s| {
            let name = s.name().ok()?.strip_prefix(".text.")?.to_string();
            Some((name, s.size()))
        })
        .collect()
}

#[test]
fn golden_pcs() {
    let mut failures = Vec::new();
    for &(name, function, pc, file, line) in GOLDEN {
        let table = LineTable::parse(&cubin(name)).expect("parse");
        match table.lookup(function, pc) {
            Some((f, l)) if f.ends_with(file) && l == line => {}
            got => failures.push(format!(
                "{name} {function}+{pc:#x}: want {file}:{line}, got {got:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_pc_maps_into_its_kernel() {
    for &(name, source) in CUBINS {
        let data = cubin(name);
        let src = std::fs::read_to_string(repo().join(source)).expect("source");
        let file_name = Path::new(source).file_name().unwrap().to_str().unwrap();
        let nlines = src.lines().count() as u32;
        let fns = source_functions(&src);
        let table = LineTable::parse(&data).expect("parse");
        assert!(table.has_lines(), "{name}: no lines");

        // The functions with lines are exactly the file's kernels.
        let kernels: BTreeSet<&str> = fns
            .iter()
            .filter(|f| f.global)
            .map(|f| f.name.as_str())
            .collect();
        let with_lines: BTreeSet<&str> = table.functions().map(plain).collect();
        assert_eq!(with_lines, kernels, "{name}");
        let sizes = text_sizes(&data);
        assert_eq!(sizes.len(), kernels.len(), "{name}: .text sections");

        for (mangled, size) in &sizes {
            let kernel = fns
                .iter()
                .find(|f| f.global && f.name == plain(mangled))
                .unwrap_or_else(|| panic!("{name}: {mangled} not in {source}"));
            // Lines allowed: the kernel's, and those of the device functions its body calls.
            let calls = |f: &SourceFn| {
                kernel.body.contains(&format!("{}(", f.name))
                    || kernel.body.contains(&format!("{}<", f.name))
            };
            let callees: Vec<&SourceFn> = fns.iter().filter(|f| !f.global && calls(f)).collect();
            let in_kernel = |l: u32| (kernel.first..=kernel.last).contains(&l);
            let in_callee = |l: u32| callees.iter().any(|c| (c.first..=c.last).contains(&l));
            assert!(table.has_lines_for(mangled));
            assert_eq!(size % INSTRUCTION, 0, "{mangled}: size {size}");

            let mut lines = BTreeSet::new();
            for pc in (0..*size).step_by(INSTRUCTION as usize) {
                let (f, l) = table
                    .lookup(mangled, pc)
                    .unwrap_or_else(|| panic!("{name} {mangled}+{pc:#x}: no line"));
                if f.ends_with(".h") || f.ends_with(".hpp") || f.contains("/cuda") {
                    continue; // a CUDA header
                }
                assert!(
                    f.ends_with(&format!("/{file_name}")) || f == file_name,
                    "{mangled}+{pc:#x}: file {f}"
                );
                assert!((1..=nlines).contains(&l), "{mangled}+{pc:#x}: line {l}");
                assert!(
                    in_kernel(l) || in_callee(l),
                    "{mangled}+{pc:#x}: line {l} outside {}() ({}-{}) and its callees",
                    kernel.name,
                    kernel.first,
                    kernel.last
                );
                lines.insert(l);
            }
            // The first instruction is the kernel's own (its signature or body).
            let (_, first) = table.lookup(mangled, 0).unwrap();
            assert!(in_kernel(first), "{mangled}: first PC at line {first}");
            // The last instruction too (the return at the closing brace).
            let (_, last) = table.lookup(mangled, size - INSTRUCTION).unwrap();
            assert!(in_kernel(last), "{mangled}: last PC at line {last}");
            // Several lines of the body, and of an inlined callee where there is one.
            let own = lines.iter().filter(|&&l| in_kernel(l)).count();
            assert!(
                own >= 3,
                "{mangled}: only {own} lines of its own: {lines:?}"
            );
            if !callees.is_empty() {
                assert!(
                    lines.iter().any(|&l| in_callee(l) && !in_kernel(l)),
                    "{mangled}: no line of {:?}",
                    callees.iter().map(|c| &c.name).collect::<Vec<_>>()
                );
            }
            // Past the end, and unknown functions: nothing.
            assert_eq!(table.lookup(mangled, *size), None);
            assert_eq!(table.lookup(mangled, u64::MAX), None);
        }
        assert_eq!(table.lookup("_Z7missingv", 0), None);
        assert!(!table.has_lines_for("_Z7missingv"));
    }
}

#[test]
fn source_functions_of_kernel_pitfalls() {
    // The test's own .cu reader, checked against the file.
    let src = std::fs::read_to_string(repo().join("examples/kernel_pitfalls.cu")).unwrap();
    let fns = source_functions(&src);
    let got: Vec<(&str, bool, u32, u32)> = fns
        .iter()
        .map(|f| (f.name.as_str(), f.global, f.first, f.last))
        .collect();
    assert_eq!(
        got,
        [
            ("input_value", false, 45, 45),
            ("relax", false, 50, 62),
            ("regs_heavy", true, 65, 68),
            ("spills", true, 71, 75),
            ("small_grid", true, 78, 83),
        ]
    );
}

#[test]
fn many_lookups_are_fast() {
    // Tens of thousands of PCs, as a PC-sampling session hands over: well under a second.
    let table = LineTable::parse(&cubin(PITFALLS)).unwrap();
    let start = std::time::Instant::now();
    let mut found = 0usize;
    for i in 0..100_000u64 {
        let pc = (i * 7 * INSTRUCTION) % 0x6980;
        found += table.lookup("_Z6spillsPKfPfi", pc).is_some() as usize;
    }
    assert_eq!(found, 100_000);
    assert!(start.elapsed().as_secs_f64() < 2.0, "{:?}", start.elapsed());
}

/// Every (function, PC) CUPTI's SASS metrics reported for examples/kernel_detail.cu's six kernels
/// on the H100, with the line CUPTI's own `cuptiGetSassToSourceCorrelation` gave for it on the
/// same cubin (testdata/README.md): gpufl's line table must give the same line for each.
#[test]
fn kernel_detail_cubin_maps_every_pc_like_cupti() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cubin");
    let cubin = std::fs::read(root.join("kernel_detail.sm_90.cubin")).unwrap();
    let golden = std::fs::read_to_string(root.join("kernel_detail.sm_90.lines.tsv")).unwrap();
    let table = LineTable::parse(&cubin).unwrap();
    assert!(table.has_lines());
    let (mut checked, mut wrong) = (0, Vec::new());
    for l in golden
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = l.split('\t').collect();
        let (function, pc, line): (&str, u64, u32) =
            (f[0], f[1].parse().unwrap(), f[2].parse().unwrap());
        let got = table.lookup(function, pc);
        checked += 1;
        match got {
            Some((file, n)) if file.ends_with("kernel_detail.cu") && n == line => {}
            other => wrong.push(format!("{function}+{pc}: CUPTI {line}, gpufl {other:?}")),
        }
    }
    assert!(checked > 1500, "{checked} PCs in the golden file");
    assert!(
        wrong.is_empty(),
        "{} of {checked} PCs differ, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
}
