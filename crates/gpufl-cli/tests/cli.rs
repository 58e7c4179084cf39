//! End-to-end tests of the `gpufl` binary over the sessions recorded on the H100 (testdata/), and of
//! `gpufl record` on machines without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

fn gpufl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufl"))
}

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions")
}

/// The one session directory whose name starts with `prefix`.
fn session(prefix: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(testdata())
        .expect("testdata/sessions")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no testdata session {prefix}*"))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run gpufl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sync records of a session, decoded by `gpufl dump`, as JSON values.
fn sync_records(dir: &Path) -> Vec<serde_json::Value> {
    let (code, out, err) = run(gpufl().arg("dump").arg(dir).args(["--type", "sync"]));
    assert_eq!(code, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// The innermost frame of `stack` whose text contains `file`.
fn user_frame<'a>(stack: &'a serde_json::Value, file: &str) -> Option<&'a str> {
    stack
        .as_array()?
        .iter()
        .filter_map(|f| f.as_str())
        .find(|f| f.contains(file))
}

#[test]
fn pytorch_session_matches_torch_profiler_and_names_the_python_line() {
    let dir = session("pytorch_train_sync-");
    let (code, out, err) = run(gpufl().arg("info").arg(&dir));
    assert_eq!(code, 0, "{err}");
    // torch.profiler counted 2862 kernels for the same script and steps (see testdata/README.md).
    assert!(out.contains("2862 kernels"), "{out}");
    assert!(out.contains("Python 3.12"), "{out}");
    let syncs = sync_records(&dir);
    assert!(
        syncs.len() >= 55,
        "one sync per step at least, got {}",
        syncs.len()
    );
    let in_loop: Vec<_> = syncs
        .iter()
        .filter(|s| s["kind"] == "context_synchronize")
        .filter_map(|s| user_frame(&s["stack"], "pytorch_train_sync.py"))
        .collect();
    assert_eq!(
        in_loop.len(),
        55,
        "5 warmup + 50 steps of torch.cuda.synchronize()"
    );
    let line = in_loop[0];
    assert!(line.starts_with("train_step ("), "{line}");
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pytorch_train_sync.py"),
    )
    .unwrap();
    let lineno: usize = line
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert!(
        src.lines()
            .nth(lineno - 1)
            .unwrap()
            .contains("torch.cuda.synchronize()"),
        "line {lineno} of the example is the planted sync"
    );
}

#[test]
fn cuda_cpp_session_names_the_cu_line_and_function() {
    let dir = session("stream_sync_loop-1427");
    let syncs = sync_records(&dir);
    assert_eq!(syncs.len(), 200);
    for s in &syncs {
        assert_eq!(s["kind"], "stream_synchronize");
        let f = user_frame(&s["stack"], "stream_sync_loop.cu").expect("a .cu frame");
        assert!(f.starts_with("step("), "{f}");
        assert!(f.ends_with("stream_sync_loop.cu:54)"), "{f}");
        assert!(s["stream"].as_u64().is_some(), "stream id resolved");
    }
}

#[test]
fn two_stream_and_cpp_api_sessions_decode() {
    let dir = session("two_stream_overlap-1453-");
    let syncs = sync_records(&dir);
    assert!(syncs.iter().any(|s| s["kind"] == "context_synchronize"
        && user_frame(&s["stack"], "two_stream_overlap.cu")
            .is_some_and(|f| f.starts_with("main ("))));
    assert!(syncs.iter().any(|s| s["kind"] == "event_synchronize"
        && user_frame(&s["stack"], "two_stream_overlap.cu")
            .is_some_and(|f| f.starts_with("run_sequential("))));
    let (code, out, _) = run(gpufl().arg("dump").arg(&dir).args(["--type", "memcpy"]));
    assert_eq!(code, 0);
    assert!(
        out.contains("\"src_kind\":\"pinned\""),
        "overlapped copies use pinned memory"
    );

    let dir = session("cpp_api-");
    let (code, out, _) = run(gpufl().arg("info").arg(&dir));
    assert_eq!(code, 0);
    assert!(out.contains("started_by=api"), "{out}");
    let syncs = sync_records(&dir);
    assert!(syncs.iter().any(
        |s| user_frame(&s["stack"], "cpp_api.cu").is_some_and(|f| f.starts_with("wait_for ("))
    ));
}

#[test]
fn disabled_session_says_why() {
    let dir = session("stream_sync_loop-665");
    let (code, out, _) = run(gpufl().arg("info").arg(&dir));
    assert_eq!(code, 0);
    assert!(
        out.contains("capture disabled: CUPTI library not found"),
        "{out}"
    );
}

#[test]
fn not_a_session_is_a_one_line_error() {
    let (code, _, err) = run(gpufl().arg("info").arg(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("is not a gpufl session directory"), "{err}");
}

#[test]
fn record_passes_output_and_exit_code_through_without_a_gpu() {
    let out_dir = std::env::temp_dir().join(format!("gpufl-cli-test-{}", std::process::id()));
    let lib = PathBuf::from(env!("CARGO_BIN_EXE_gpufl")).with_file_name("libgpufl_capture.so");
    let mut cmd = gpufl();
    cmd.arg("record").arg("-o").arg(&out_dir);
    if lib.exists() {
        cmd.arg("--lib").arg(&lib);
    } else {
        cmd.arg("--lib").arg("/bin/true"); // only its existence matters without CUDA
    }
    cmd.args(["--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    let (code, out, err) = run(&mut cmd);
    assert_eq!(code, 7);
    assert_eq!(out, "out\n");
    assert!(err.starts_with("err\n"), "{err}");
    assert!(err.contains("no session recorded"), "{err}");
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `gpufl report` (text, no colours) and `gpufl report --json` over every bundled session,
/// compared with the snapshots in tests/snapshots/.
#[test]
fn report_snapshots() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs: Vec<String> = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| format!("testdata/sessions/{}", e.file_name().to_string_lossy()))
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5);
    for dir in dirs {
        let name = dir.rsplit('/').next().unwrap().to_string();
        let (code, text, err) = run(gpufl()
            .current_dir(&root)
            .args(["report", "--color", "never", &dir]));
        assert_eq!(code, 0, "{err}");
        insta::assert_snapshot!(format!("report_text_{name}"), text);
        let (code, json, err) = run(gpufl().current_dir(&root).args(["report", "--json", &dir]));
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert!(v["sessions"][0]["totals"]["kernels"].is_u64());
        insta::assert_snapshot!(format!("report_json_{name}"), json);
    }
}

#[test]
fn report_of_a_truncated_session_warns_and_reports_what_is_readable() {
    let src = session("stream_sync_loop-1427").join("trace-0000.ndjson.zst");
    let bytes = std::fs::read(&src).unwrap();
    let dir = std::env::temp_dir().join(format!("gpufl-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("trace-0000.ndjson.zst"),
        &bytes[..bytes.len() * 2 / 3],
    )
    .unwrap();
    let (code, out, err) = run(gpufl().args(["report", "--color", "never"]).arg(&dir));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("warning:"), "{out}");
    assert!(out.contains("kernels"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
