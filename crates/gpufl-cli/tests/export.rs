//! `gpufl export` from the command line: both formats on a testdata session, a run directory,
//! and a clear error for something that is not a session. The content is checked in
//! `crates/gpufl-export/tests`.

use std::path::Path;
use std::process::Command;

fn gpufl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufl"))
}

fn session() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/sessions/nvtx_ranges-580-20261124T064027Z")
}

#[test]
fn exports_both_formats() {
    let dir = std::env::temp_dir().join(format!("gpufl-cli-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pf = dir.join("t.pftrace");
    let out = gpufl()
        .args(["export", "--format", "perfetto", "-o"])
        .arg(&pf)
        .arg(session())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("flows") && stderr.contains("wrote"),
        "{stderr}"
    );
    let bytes = std::fs::read(&pf).unwrap();
    assert_eq!(bytes[0], 0x0a, "a Trace starts with packet field 1");
    let js = dir.join("t.json");
    let out = gpufl()
        .args(["export", "--format", "chrome", "-q", "-o"])
        .arg(&js)
        .arg(session())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stderr.is_empty());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&js).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 100);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn not_a_session_is_a_clear_error() {
    let out = gpufl()
        .args(["export", "-o", "/dev/null", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a gpufl session directory"), "{err}");
}
