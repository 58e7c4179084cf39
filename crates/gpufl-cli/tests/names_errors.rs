//! Wrong input is an error that says what is accepted: unknown record types and option values,
//! paths that do not exist, a machine without the CUDA driver, a server that cannot be reached.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn gpufl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufl"))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run gpufl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn a_session() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("stream_sync_loop-1427")
        })
        .collect();
    found.sort();
    found.pop().expect("testdata session")
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn dump_of_an_unknown_record_type_lists_the_types() {
    let s = a_session();
    for types in ["nosuchtype", "sync,nosuchtype"] {
        let (code, out, err) = run(gpufl().arg("dump").arg(&s).args(["--type", types]));
        assert_eq!(code, 2, "{types}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("'nosuchtype'"), "{err}");
        for t in gpufl_trace::RECORD_TYPES {
            assert!(err.contains(t), "{t} not listed: {err}");
        }
    }
    // Every type a session holds is accepted.
    let (code, out, err) = run(gpufl().arg("dump").arg(&s).arg("--raw"));
    assert_eq!(code, 0, "{err}");
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = v["t"].as_str().unwrap();
        assert!(gpufl_trace::RECORD_TYPES.contains(&t), "{t}");
    }
    let (code, out, err) = run(gpufl().arg("dump").arg(&s).args(["--type", "kernel,end"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() > 1);
}

#[test]
fn enumerated_options_list_their_values() {
    let (code, _, err) = run(gpufl().args(["record", "--api-records", "bogus", "--", "true"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("'bogus'"), "{err}");
    assert!(
        err.contains("[possible values: none, sync, default, all]"),
        "{err}"
    );
    let s = a_session();
    let (code, _, err) = run(gpufl().args(["report", "--color", "sometimes"]).arg(&s));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("[possible values: auto, always, never]"),
        "{err}"
    );
    let (code, _, err) = run(gpufl()
        .args(["export", "--format", "svg", "-o", "/dev/null"])
        .arg(&s));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("[possible values: perfetto, chrome]"), "{err}");
    let (code, _, err) = run(gpufl().args(["upload", "--connect-timeout-s", "soon"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not a number of seconds"), "{err}");
}

#[test]
fn a_path_that_does_not_exist_says_so() {
    let s = a_session();
    let s = s.to_str().unwrap();
    let missing = "/no/such/dir";
    let cases: Vec<Vec<&str>> = vec![
        vec!["info", missing],
        vec!["report", missing],
        vec!["report", "--json", s, missing],
        vec!["dump", missing],
        vec!["export", "-o", "/dev/null", missing],
        vec!["diff", s, missing],
        vec!["diff", missing, s],
        vec![
            "upload",
            "--server",
            "http://127.0.0.1:9",
            "--api-key",
            "gfl_up_x",
            missing,
        ],
    ];
    for args in cases {
        let (code, _, err) = run(gpufl().args(&args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(
            err.trim(),
            "gpufl: error: /no/such/dir does not exist",
            "{args:?}"
        );
    }
    // An existing directory without sessions is still "not a session directory".
    let (code, _, err) = run(gpufl().args(["report", env!("CARGO_MANIFEST_DIR")]));
    assert_eq!(code, 2);
    assert!(err.contains("is not a gpufl session directory"), "{err}");
}

/// Without a loadable libcuda.so.1 (CI machines, this one): the command runs, its status passes
/// through, one line says why nothing was recorded, and no empty run directory is left.
#[test]
fn record_without_the_driver_says_so_and_leaves_nothing() {
    let out_dir = temp("nodriver");
    let lib = PathBuf::from(env!("CARGO_BIN_EXE_gpufl")).with_file_name("libgpufl_capture.so");
    let lib = if lib.exists() {
        lib
    } else {
        PathBuf::from("/bin/true") // only its existence matters without CUDA
    };
    let (code, out, err) = run(gpufl()
        .arg("record")
        .arg("-o")
        .arg(&out_dir)
        .arg("--lib")
        .arg(&lib)
        .args(["--", "sh", "-c", "echo hi; exit 3"]));
    assert_eq!(code, 3, "{err}");
    assert_eq!(out, "hi\n");
    if !err.contains("libcuda.so.1") {
        // A machine with the driver: the command made no CUDA call.
        assert!(err.contains("the command made no CUDA call"), "{err}");
        let _ = std::fs::remove_dir_all(&out_dir);
        return;
    }
    assert_eq!(
        err.trim(),
        "gpufl: no session recorded: libcuda.so.1 could not be loaded (not found: no NVIDIA \
         driver on this machine?): the command ran without recording"
    );
    assert!(!out_dir.exists(), "left behind: {out_dir:?}");
    // An output directory that was there stays, empty.
    std::fs::create_dir_all(&out_dir).unwrap();
    let (code, _, _) = run(gpufl()
        .args(["record", "-q", "-o"])
        .arg(&out_dir)
        .arg("--lib")
        .arg(&lib)
        .args(["--", "true"]));
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_dir(&out_dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn an_upload_to_a_closed_port_gives_up_at_the_connect_timeout() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    let (code, out, err) = run(gpufl()
        .args([
            "upload",
            "--api-key",
            "gfl_up_x",
            "--connect-timeout-s",
            "1",
        ])
        .arg("--server")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(a_session()));
    let took = t.elapsed();
    assert_eq!(code, 1, "{out}{err}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert!(out.contains("failed"), "{out}");
    assert!(out.contains("connect timeout 1 s"), "{out}");
}
