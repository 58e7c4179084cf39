//! The upload API of the capture library (`gpufl_upload_logs`, include/gpufl/gpufl.h) against a
//! real server: a C program compiled with `cc` and linked with the debug `libgpufl_capture.so`
//! uploads a copy of a bundled session from its log directory to `gpufl serve`, and the server's
//! read API answers it with `gpufl info`'s kernel count; a wrong key, no configuration and an empty
//! directory give the documented results; `gpufl_init`'s options and the environment are the
//! fallbacks. No GPU needed (`gpufl_init` without CUDA writes a scopes-only session).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::{Server, GPUFL};
const SESSION: &str = "cpp_api-639-20261122T061858Z";

use common::root;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufl-upapi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn serve(data: &Path) -> Server {
    let mut cmd = Command::new(GPUFL);
    cmd.arg("serve")
        .arg("--data")
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--rate-limit", "0"]);
    common::spawn_serve(cmd)
}

/// (upload key, read key) of a new project.
fn project(data: &Path, name: &str) -> (String, String) {
    let mut admin = Command::new(GPUFL);
    admin.arg("admin").arg("--data").arg(data);
    common::create_project(admin, name)
}

fn get(url: &str, key: &str, path: &str) -> (u16, Value) {
    let resp = match ureq::get(&format!("{url}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .call()
    {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let status = resp.status();
    let body = resp.into_string().unwrap_or_default();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `gpufl info`'s kernel count of a session directory.
fn info_kernels(dir: &Path) -> i64 {
    let out = Command::new(GPUFL).arg("info").arg(dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // The headline line: `… · 114 kernels · …`.
            let i = w.iter().position(|x| *x == "kernels")?;
            w.get(i.checked_sub(1)?)?.parse::<i64>().ok()
        })
        .unwrap_or_else(|| panic!("no kernel count in gpufl info {}:\n{text}", dir.display()))
}

/// The session's summary once analysed.
fn wait_ready(url: &str, rd: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, v) = get(url, rd, &format!("/api/v1/sessions/{id}"));
        if st == 200 && (v["ingest"] == "ready" || v["ingest"] == "corrupt") {
            return v;
        }
        assert!(Instant::now() < deadline, "{id} not analysed: {st} {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The capture library built with this test (as a dependency: deps/; or by
/// `cargo build -p gpufl-capture`: next to the binary).
fn capture_lib_dir() -> PathBuf {
    let bin = Path::new(GPUFL).parent().unwrap();
    [bin.join("deps"), bin.to_path_buf()]
        .into_iter()
        .find(|d| d.join("libgpufl_capture.so").exists())
        .expect("libgpufl_capture.so (built as gpufl-cli's dev-dependency)")
}

const PROGRAM: &str = r#"
#include <stdio.h>
#include <string.h>
#include <gpufl/gpufl.h>

static const char* arg(char** argv, int i) { return strcmp(argv[i], "-") ? argv[i] : NULL; }

/* prog explicit LOG SERVER KEY | prog null | prog init LOG SERVER KEY */
int main(int argc, char** argv) {
    if (argc >= 5 && !strcmp(argv[1], "explicit")) {
        gpufl_upload_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.log_path = arg(argv, 2);
        o.backend_url = arg(argv, 3);
        o.api_key = arg(argv, 4);
        printf("rc=%d\n", gpufl_upload_logs(&o));
    } else if (argc >= 5 && !strcmp(argv[1], "init")) {
        gpufl_options io;
        memset(&io, 0, sizeof io);
        io.struct_size = sizeof io;
        io.app_name = "upload_api";
        io.log_path = argv[2];
        io.enable_synchronization = 1;
        io.backend_url = argv[3];
        io.api_key = argv[4];
        gpufl_init(&io);
        gpufl_scope_push("work");
        gpufl_scope_pop();
        gpufl_shutdown();
        printf("rc=%d\n", gpufl_upload_logs(NULL));
    } else {
        printf("rc=%d\n", gpufl_upload_logs(NULL));
    }
    return 0;
}
"#;

fn compile(dir: &Path) -> PathBuf {
    let src = dir.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("prog");
    let lib = capture_lib_dir();
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-g"])
        .arg(format!(
            "-I{}",
            root().join("crates/gpufl-capture/include").display()
        ))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg("-lgpufl_capture")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Run the program with a clean gpufl environment plus `env`; (its rc line's value, stderr).
fn run(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for k in [
        "CUDA_INJECTION64_PATH",
        "GPUFL_SERVER",
        "GPUFL_API_KEY",
        "GPUFL_BACKEND_URL",
        "GPUFL_LOG_PATH",
        "GPUFL_QUIET",
        "GPUFL_APP_NAME",
    ] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(status.success(), "{args:?}: {status}\n{stdout}\n{stderr}");
    let rc = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rc="))
        .unwrap_or_else(|| panic!("no rc in {stdout:?}; stderr {stderr}"))
        .trim()
        .parse()
        .unwrap();
    (rc, stderr)
}

#[test]
fn a_c_program_uploads_its_log_directory() {
    let tmp = tmpdir("c");
    let data = tmp.join("data");
    let (up, rd) = project(&data, "team");
    let srv = serve(&data);
    let exe = compile(&tmp);

    // The log directory: a copy of a bundled session.
    let logs = tmp.join("logs");
    let src = root().join("testdata/sessions").join(SESSION);
    std::fs::create_dir_all(logs.join(SESSION)).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), logs.join(SESSION).join(e.file_name())).unwrap();
    }
    let logs_s = logs.to_str().unwrap();

    // A wrong key: nothing stored, one session failed, the server's reason on stderr.
    let (rc, err) = run(&exe, &["explicit", logs_s, &srv.url, "gfl_up_wrong"], &[]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains(&format!("gpufl: upload of {SESSION} failed:")) && err.contains("unknown_key"),
        "{err}"
    );
    assert_eq!(
        get(&srv.url, &rd, &format!("/api/v1/sessions/{SESSION}")).0,
        404
    );

    // The right key: stored, analysed, with gpufl info's kernel count.
    let (rc, err) = run(&exe, &["explicit", logs_s, &srv.url, &up], &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.contains(&format!("gpufl: uploaded {SESSION} (new, 1 file,")),
        "{err}"
    );
    let v = wait_ready(&srv.url, &rd, SESSION);
    assert_eq!(v["ingest"], "ready", "{v}");
    let kernels = info_kernels(&src);
    assert!(kernels > 0);
    assert_eq!(v["kernels"].as_i64(), Some(kernels), "{v}");

    // Nothing configured; an empty directory; an address that is not http(s).
    let (rc, err) = run(&exe, &["null"], &[]);
    assert_eq!(rc, -1, "{err}");
    assert!(err.contains("gpufl: upload: no server"), "{err}");
    let empty = tmp.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (rc, err) = run(
        &exe,
        &["explicit", empty.to_str().unwrap(), &srv.url, &up],
        &[],
    );
    assert_eq!(rc, -3, "{err}");
    let (rc, _) = run(&exe, &["explicit", logs_s, "ftp://x", &up], &[]);
    assert_eq!(rc, -2);

    // Everything from the environment (NULL options): the session is there already.
    let (rc, err) = run(
        &exe,
        &["null"],
        &[
            ("GPUFL_SERVER", &srv.url),
            ("GPUFL_API_KEY", &up),
            ("GPUFL_LOG_PATH", logs_s),
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.contains(&format!("uploaded {SESSION} (unchanged")),
        "{err}"
    );
    // GPUFL_QUIET: nothing printed for a session stored.
    let (rc, err) = run(
        &exe,
        &["null"],
        &[
            ("GPUFL_SERVER", &srv.url),
            ("GPUFL_API_KEY", &up),
            ("GPUFL_LOG_PATH", logs_s),
            ("GPUFL_QUIET", "1"),
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(!err.contains("uploaded"), "{err}");

    // gpufl_init's options are the fallbacks: its own session (scopes only, no GPU here) and the
    // copy already there both go up; each stored once.
    let (rc, err) = run(&exe, &["init", logs_s, &srv.url, &up], &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.contains(&format!("uploaded {SESSION} (unchanged")),
        "{err}"
    );
    let own: Vec<String> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("upload_api-"))
        .collect();
    assert_eq!(own.len(), 1, "{own:?}");
    assert!(err.contains(&format!("uploaded {} (new", own[0])), "{err}");
    let v = wait_ready(&srv.url, &rd, &own[0]);
    assert_eq!(v["ingest"], "ready", "{v}");
    let _ = std::fs::remove_dir_all(&tmp);
}
