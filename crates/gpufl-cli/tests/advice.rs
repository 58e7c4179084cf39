//! Issue 37, advice for this program, over every bundled session (testdata/sessions) and run
//! (testdata/runs), through the `gpufl` binary: the fix texts of `report --json` (findings and
//! their facets) are in the words of the program recorded. A session without Python frames gets
//! no PyTorch, JAX, CuPy or DataLoader advice; a PyTorch session's gpu-idle fix speaks of
//! DataLoader or torch, a JAX session's of jax. What a session is comes from its recorded frames,
//! read here from `gpufl dump --all-frames`.

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;

fn bundled() -> Vec<PathBuf> {
    common::bundled_all()
}

fn gpufl(args: &[&str], dir: &Path) -> String {
    String::from_utf8(common::gpufl_on(args, dir)).expect("utf-8")
}

/// What a session's recorded frames say it is.
#[derive(Debug, Default)]
struct Frames {
    python: bool,
    torch: bool,
    jax: bool,
}

/// The Python source file a described frame names (`func (/x/train.py:12)`), if it is one.
fn python_file(frame: &str) -> Option<&str> {
    let inner = frame.strip_suffix(')')?;
    let open = inner.rfind(" (")?;
    let loc = &inner[open + 2..];
    let file = &loc[..loc.rfind(':')?];
    (file.ends_with(".py") || file.starts_with("<frozen ")).then_some(file)
}

/// What a session directory's recorded frames say it is.
fn frames_of(dir: &Path) -> Frames {
    let out = gpufl(
        &[
            "dump",
            "--all-frames",
            "--type",
            "sync,callsite,hostcall,hsample",
        ],
        dir,
    );
    let mut f = Frames::default();
    for l in out.lines() {
        let r: Value = serde_json::from_str(l).expect("json");
        for frame in r["stack"].as_array().into_iter().flatten() {
            if let Some(file) = frame.as_str().and_then(python_file) {
                f.python = true;
                f.torch |= file.contains("/site-packages/torch/");
                f.jax |= file.contains("/site-packages/jax/");
            }
        }
    }
    f
}

/// (rule, fix) of every finding of an insight list, facets included.
fn fixes(list: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for i in list {
        out.push((
            i["rule"].as_str().unwrap_or_default().to_string(),
            i["fix"].as_str().expect("fix").to_string(),
        ));
        out.extend(fixes(i["facets"].as_array().map_or(&[][..], Vec::as_slice)));
    }
    out
}

/// The fixes of gpu-idle that name no program's tool (the host waited on a sync; work was queued
/// but did not start): the same in every program.
fn framework_neutral(fix: &str) -> bool {
    fix.starts_with("The host waited while the GPU had nothing to do")
        || fix.starts_with("The next work was already queued")
}

#[test]
fn fixes_are_in_the_words_of_the_program_recorded() {
    let frameworks = ["pytorch", "torch", "dataloader", "jax", "cupy"];
    let (mut native, mut torch_idle, mut jax_idle) = (0, 0, 0);
    for dir in bundled() {
        let report: Value =
            serde_json::from_str(&gpufl(&["report", "--json"], &dir)).expect("json");
        for s in report["sessions"].as_array().expect("sessions") {
            // The session's directory (as given, relative to the working directory).
            let id = s["session"].as_str().expect("session");
            let f = &frames_of(Path::new(id));
            let all = fixes(s["insights"].as_array().expect("insights"));
            let said = |rule: &str, fix: &str, words: &[&str]| -> Option<String> {
                let low = fix.to_lowercase();
                words
                    .iter()
                    .find(|w| low.contains(*w))
                    .map(|w| format!("{id}: {rule}'s fix says {w}: {fix}"))
            };
            if !f.python {
                native += 1;
                for (rule, fix) in &all {
                    assert_eq!(said(rule, fix, &frameworks), None);
                }
                continue;
            }
            let idle: Vec<&String> = all
                .iter()
                .filter(|(r, fix)| r == "gpu-idle" && !framework_neutral(fix))
                .map(|(_, fix)| fix)
                .collect();
            if f.jax && !f.torch {
                for (rule, fix) in &all {
                    assert_eq!(
                        said(rule, fix, &["pytorch", "torch", "dataloader", "cupy"]),
                        None
                    );
                }
                for fix in &idle {
                    assert!(fix.contains("jax"), "{id}: gpu-idle's fix: {fix}");
                }
                jax_idle += idle.len();
            } else if f.torch && !f.jax {
                for (rule, fix) in &all {
                    assert_eq!(said(rule, fix, &["jax", "cupy"]), None);
                }
                for fix in &idle {
                    assert!(
                        fix.contains("DataLoader") || fix.contains("torch"),
                        "{id}: gpu-idle's fix: {fix}"
                    );
                }
                torch_idle += idle.len();
            }
        }
    }
    // The bundled recordings hold C/C++ programs and PyTorch and JAX ones with idle findings.
    assert!(native >= 15, "{native} C/C++ sessions");
    assert!(torch_idle >= 20, "{torch_idle} PyTorch gpu-idle findings");
    assert!(jax_idle >= 2, "{jax_idle} JAX gpu-idle findings");
}
