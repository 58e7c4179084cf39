//! `gpufl record`'s host-time options (`--host-samples`, `--no-host-samples`, `--hostcall-us`)
//! and `gpufl dump` of `hostcall` / `hsample` records, without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// What the recorded command sees of the host-time variables under `gpufl record ARGS`.
fn seen_with(tag: &str, args: &[&str]) -> String {
    let out_dir = std::env::temp_dir().join(format!("gpufl-hostcap-{tag}-{}", std::process::id()));
    let mut cmd = gpufl();
    cmd.arg("record").arg("-q").arg("-o").arg(&out_dir);
    cmd.args(["--lib", "/bin/true"]); // only its existence matters without CUDA
    cmd.args(args);
    cmd.args([
        "--",
        "sh",
        "-c",
        "echo \"${GPUFL_HOST_SAMPLES-unset} ${GPUFL_HOSTCALL_US-unset}\"",
    ]);
    let (code, out, err) = run(&mut cmd);
    let _ = std::fs::remove_dir_all(&out_dir);
    assert_eq!(code, 0, "{err}");
    out.trim().to_string()
}

#[test]
fn record_passes_the_host_time_options_to_the_command() {
    assert_eq!(seen_with("default", &[]), "unset unset");
    assert_eq!(
        seen_with("rate", &["--host-samples", "250", "--hostcall-us", "50"]),
        "250 50"
    );
    assert_eq!(
        seen_with("off", &["--no-host-samples", "--hostcall-us", "0"]),
        "0 0"
    );
    let (code, _, err) = run(gpufl().args([
        "record",
        "--host-samples",
        "10",
        "--no-host-samples",
        "--",
        "true",
    ]));
    assert_eq!(code, 2, "the two conflict: {err}");
    let (_, help, _) = run(gpufl().args(["record", "--help"]));
    for opt in [
        "--host-samples <HZ>",
        "--no-host-samples",
        "--hostcall-us <US>",
    ] {
        assert!(help.contains(opt), "{opt} in {help}");
    }
}

/// A session with one `hostcall` and two `hsample` records.
fn write_session(root: &Path) -> PathBuf {
    use gpufl_trace::*;
    let name = "hostcap_demo-4343-20261127T120000Z";
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut header = Header {
        session_id: name.into(),
        app_name: "hostcap_demo".into(),
        ..Header::default()
    };
    header.options.host_samples_hz = Some(100);
    header.options.hostcall_us = Some(20);
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let free = w.intern_str("cudaFree").unwrap();
    let file_id = w.intern_str("/work/examples/malloc_free_loop.cu").unwrap();
    let func = w.intern_str("main").unwrap();
    let frame = w
        .intern_frame(FrameData {
            kind: FrameKind::Native,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(file_id),
            line: Some(17),
            inlined: false,
            text: None,
        })
        .unwrap();
    let stack = w.intern_stack(&[frame]).unwrap();
    w.write(&Record::Hostcall(Hostcall {
        domain: ApiDomain::Runtime,
        name: free,
        cbid: 22,
        start: 1_000,
        end: 91_000,
        tid: 77,
        corr: 5,
        ctx: Some(1),
        bytes: None,
        ret: 0,
        stack: Some(stack),
    }))
    .unwrap();
    for (ts, state, call) in [
        (2_000, HostState::Cuda, Some(free)),
        (12_000, HostState::Cpu, None),
    ] {
        w.write(&Record::Hsample(Hsample {
            ts,
            tid: 77,
            state,
            period_ns: 10_000_000,
            stack: Some(stack),
            call,
        }))
        .unwrap();
    }
    w.finish(1, "exit").unwrap();
    dir
}

#[test]
fn dump_resolves_the_names_and_stacks_of_hostcall_and_hsample_records() {
    let root = std::env::temp_dir().join(format!("gpufl-hostcap-dump-{}", std::process::id()));
    let dir = write_session(&root);
    let (code, out, err) = run(gpufl()
        .arg("dump")
        .arg(&dir)
        .args(["--type", "hostcall,hsample"]));
    let (_, header, _) = run(gpufl().arg("dump").arg(&dir).args(["--type", "header"]));
    let _ = std::fs::remove_dir_all(&root);
    let header: serde_json::Value = serde_json::from_str(header.trim()).unwrap();
    assert_eq!(header["options"]["host_samples_hz"], 100, "{header}");
    assert_eq!(header["options"]["hostcall_us"], 20, "{header}");
    assert_eq!(code, 0, "{err}");
    let recs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 3, "{out}");
    assert_eq!(recs[0]["t"], "hostcall");
    assert_eq!(recs[0]["name"], "cudaFree");
    assert_eq!(recs[0]["end"], 91_000);
    let frame = recs[0]["stack"][0].as_str().unwrap();
    assert!(frame.contains("malloc_free_loop.cu:17"), "{frame}");
    assert_eq!(recs[1]["t"], "hsample");
    assert_eq!(
        (&recs[1]["state"], &recs[1]["call"]),
        (&"cuda".into(), &"cudaFree".into())
    );
    assert!(recs[1]["stack"][0].as_str().unwrap().contains(":17"));
    assert_eq!(recs[2]["state"], "cpu");
    assert!(recs[2].get("call").is_none(), "{}", recs[2]);
}
