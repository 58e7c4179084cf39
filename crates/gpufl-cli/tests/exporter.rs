//! `gpufl exporter` end to end, no GPU: Prometheus (Debian's `prometheus`) scrapes a running
//! exporter fed by a real recorder (the capture library in scopes-only mode, in a child process)
//! and by a second child sending a status with syncs, GPU figures and a top line; the series it
//! stores must be what was fed. Also `promtool check rules` / `promtool test rules` on
//! deploy/prometheus, and every query of deploy/grafana/gpufl.json names a metric the exporter
//! exports.
//!
//! Without `prometheus`/`promtool` on PATH these tests say so and pass, unless
//! `GPUFL_REQUIRE_PROMETHEUS=1` (set by .ci/run once it installed them), where they fail.

use gpufl_trace::feed::{CallStatus, GpuStatus, LineStatus, Status, FEED_VERSION};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Child processes (see [`child_process_entry`]) and what they feed.
const CHILD_ENV: &str = "GPUFL_TEST_EXPORTER_CHILD";
const SCOPES_FED: usize = 21;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The tool, or None after saying why this test does not run (a failure when CI requires it).
fn need(name: &str) -> Option<PathBuf> {
    let t = tool(name);
    if t.is_none() {
        assert!(
            std::env::var("GPUFL_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "{name} is required (GPUFL_REQUIRE_PROMETHEUS=1) but not on PATH"
        );
        eprintln!("SKIPPED: {name} not found (apt-get install prometheus provides it)");
    }
    t
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufl-exp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Kills and reaps a child when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `gpufl exporter` on a free port; its port.
fn start_exporter(dir: &Path) -> (Running, u16, PathBuf) {
    let sock = dir.join("exporter.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufl"))
        .args(["exporter", "--listen", "127.0.0.1:0", "--stale-secs", "600"])
        .arg("--socket")
        .arg(&sock)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpufl exporter");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in the exporter's first line: {line}"));
    (Running(child), port, sock)
}

/// GET `path` from 127.0.0.1:`port`: status code and body.
fn get(port: u16, path: &str) -> std::io::Result<(u32, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Ok((code, body))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child of this test binary running [`child_process_entry`] in `mode`.
fn child(mode: &str, sock: &Path, dir: &Path) -> Running {
    let c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .env("GPUFL_EXPORTER_SOCKET", sock)
        .env("GPUFL_TEST_DIR", dir)
        .env("GPUFL_LOG_PATH", dir.join("sessions"))
        .env("GPUFL_APP_NAME", "feedtest")
        .env("GPUFL_JOB", "job-7")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    Running(c)
}

/// The status the `synthetic` child sends (a process with syncs on one GPU).
fn synthetic_status(seq: u64) -> Status {
    Status {
        v: FEED_VERSION,
        pid: std::process::id(),
        app: "train".into(),
        job: "job-8".into(),
        session: "train-synthetic".into(),
        status: "recording".into(),
        seq,
        uptime_s: 10.0 + seq as f64,
        sync_s: 3.25,
        syncs: 40,
        scopes: 0,
        gpus: vec![GpuStatus {
            dev: 0,
            uuid: "GPU-test-0".into(),
            busy_s: 4.5,
            kernels: 1234,
            copies: 6,
            sync_s: 3.25,
            syncs: 40,
            mem_bytes: Some(3 << 30),
            mem_peak_bytes: Some(5 << 30),
        }],
        top: vec![
            LineStatus {
                line: "train.py:42".into(),
                sync_s: 2.5,
                syncs: 30,
            },
            LineStatus {
                line: "train.py:7".into(),
                sync_s: 0.75,
                syncs: 10,
            },
        ],
        hostcalls: vec![CallStatus {
            call: "cudaFree".into(),
            blocked_s: 1.5,
            calls: 298,
        }],
    }
}

/// Not a test of its own: the body of the child processes (does nothing unless spawned as one).
/// `recorder`: the real recorder (scopes-only without a GPU) with [`SCOPES_FED`] scopes, until
/// `stop` appears in the test directory; `synthetic`: [`synthetic_status`] twice a second.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var("GPUFL_TEST_DIR").unwrap());
    let deadline = Instant::now() + Duration::from_secs(300);
    let stop = || dir.join("stop").exists() || Instant::now() > deadline;
    match mode.as_str() {
        "recorder" => {
            let opts = gpufl_capture::options::Options::default();
            let _ = gpufl_capture::recorder::start(opts, gpufl_capture::recorder::StartedBy::Api);
            for _ in 0..SCOPES_FED {
                // SAFETY: a NUL-terminated name.
                unsafe { gpufl_capture::ffi::gpufl_scope_push(c"step".as_ptr()) };
                gpufl_capture::ffi::gpufl_scope_pop();
            }
            while !stop() {
                std::thread::sleep(Duration::from_millis(50));
            }
            gpufl_capture::ffi::gpufl_shutdown();
        }
        "synthetic" => {
            let sock = std::os::unix::net::UnixDatagram::unbound().unwrap();
            let to = std::env::var("GPUFL_EXPORTER_SOCKET").unwrap();
            let mut seq = 0;
            while !stop() {
                let _ = sock.send_to(&synthetic_status(seq).encode(), &to);
                seq += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// One instant-query result: labels and value.
fn query(port: u16, q: &str) -> Vec<(serde_json::Value, f64)> {
    let Ok((200, body)) = get(port, &format!("/api/v1/query?query={}", urlencode(q))) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    let val = r["value"][1].as_str().and_then(|s| s.parse().ok());
                    (r["metric"].clone(), val.unwrap_or(f64::NAN))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Poll `q` until `ok` holds for its result (Prometheus needs a few scrapes); fail with the last
/// result after a generous deadline.
fn wait_for(port: u16, q: &str, ok: impl Fn(&[(serde_json::Value, f64)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = query(port, q);
        if ok(&r) {
            return;
        }
        assert!(Instant::now() < deadline, "query {q} never matched: {r:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn one_value(expect: f64) -> impl Fn(&[(serde_json::Value, f64)]) -> bool {
    move |r| r.len() == 1 && (r[0].1 - expect).abs() < 1e-9
}

#[test]
fn prometheus_scrapes_what_the_recorders_fed() {
    let Some(prometheus) = need("prometheus") else {
        return;
    };
    let dir = tmpdir("prom");
    let (_exporter, port, sock) = start_exporter(&dir);
    let recorder = child("recorder", &sock, &dir);
    let synthetic = child("synthetic", &sock, &dir);
    let (rec_pid, syn_pid) = (recorder.0.id(), synthetic.0.id());

    let prom_port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: gpufl\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
            repo().join("deploy/prometheus/alerts.yml").display()
        ),
    )
    .unwrap();
    let _prom = Running(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus"),
    );

    wait_for(prom_port, "up{job=\"gpufl\"}", one_value(1.0));
    // The real recorder: its scope records, its status, its job id, under the kernel's pid.
    let r = format!("pid=\"{rec_pid}\",app=\"feedtest\",job_id=\"job-7\"");
    wait_for(
        prom_port,
        &format!("gpufl_process_scope_records_total{{{r}}}"),
        one_value(2.0 * SCOPES_FED as f64),
    );
    wait_for(
        prom_port,
        &format!("gpufl_process_recording{{{r},status=~\"scopes-only|recording\"}}"),
        one_value(1.0),
    );
    wait_for(
        prom_port,
        &format!("gpufl_process_syncs_total{{{r}}}"),
        one_value(0.0),
    );
    // The synthetic process: every figure as sent.
    let s = format!("pid=\"{syn_pid}\",app=\"train\",job_id=\"job-8\"");
    let g = format!("{s},gpu=\"0\",UUID=\"GPU-test-0\"");
    for (q, v) in [
        (format!("gpufl_process_sync_seconds_total{{{s}}}"), 3.25),
        (format!("gpufl_process_syncs_total{{{s}}}"), 40.0),
        (
            format!("gpufl_process_top_sync_seconds{{{s},line=\"train.py:42\"}}"),
            2.5,
        ),
        (
            format!("gpufl_process_sync_line_seconds_total{{{s},line=\"train.py:7\"}}"),
            0.75,
        ),
        (
            format!("gpufl_process_sync_line_syncs_total{{{s},line=\"train.py:42\"}}"),
            30.0,
        ),
        (
            format!("gpufl_process_kernel_launches_total{{{g}}}"),
            1234.0,
        ),
        (format!("gpufl_process_gpu_busy_seconds_total{{{g}}}"), 4.5),
        (format!("gpufl_process_copies_total{{{g}}}"), 6.0),
        (format!("gpufl_process_gpu_sync_seconds_total{{{g}}}"), 3.25),
        (
            format!("gpufl_process_memory_allocated_bytes{{{g}}}"),
            (3u64 << 30) as f64,
        ),
        (
            format!("gpufl_process_memory_allocated_peak_bytes{{{g}}}"),
            (5u64 << 30) as f64,
        ),
        (
            format!("gpufl_process_host_blocked_seconds_total{{{s},call=\"cudaFree\"}}"),
            1.5,
        ),
        (
            format!("gpufl_process_host_blocked_calls_total{{{s},call=\"cudaFree\"}}"),
            298.0,
        ),
        // The same totals each time: no busy time in the last ~10 s.
        (format!("gpufl_process_gpu_busy_ratio{{{g}}}"), 0.0),
        (format!("count(gpufl_process_top_sync_seconds{{{s}}})"), 1.0),
        (
            format!("count(gpufl_process_sync_line_seconds_total{{{s}}})"),
            2.0,
        ),
        ("gpufl_exporter_processes".to_string(), 2.0),
    ] {
        wait_for(prom_port, &q, one_value(v));
    }
    // Device metrics: from NVML where there is one, else 0 with the reason.
    wait_for(prom_port, "gpufl_exporter_device_metrics", |r| {
        r.len() == 1 && {
            let reason = r[0].0["reason"].as_str().unwrap_or("");
            (reason.is_empty() && r[0].1 == 1.0) || (reason.contains("NVML") && r[0].1 == 0.0)
        }
    });
    // The alert rules loaded into a running Prometheus.
    let (code, rules) = get(prom_port, "/api/v1/rules").unwrap();
    assert_eq!(code, 200);
    let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
    let n: usize = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().map_or(0, |r| r.len()))
        .sum();
    assert_eq!(n, 9, "{rules}");

    // The recorder ends: its last status says so.
    std::fs::write(dir.join("stop"), b"").unwrap();
    wait_for(
        prom_port,
        &format!("gpufl_process_recording{{{r},status=\"ended\"}}"),
        one_value(1.0),
    );
    drop(recorder);
    drop(synthetic);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn promtool_checks_and_tests_the_alert_rules() {
    let Some(promtool) = need("promtool") else {
        return;
    };
    let d = repo().join("deploy/prometheus");
    let out = Command::new(&promtool)
        .args(["check", "rules", "alerts.yml"])
        .current_dir(&d)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 9 rules found"), "{text}");
    let out = Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(&d)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// Metric names in a PromQL expression: the exporter's prefixes.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let w = &expr[s..i];
            if w.starts_with("DCGM_FI_") || w.starts_with("gpufl_") || w.starts_with("process_") {
                out.insert(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn grafana_board_queries_only_exported_metrics() {
    let dir = tmpdir("grafana");
    let (_exporter, port, _) = start_exporter(&dir);
    let (code, page) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    let exported: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(
        exported.contains("DCGM_FI_DEV_GPU_UTIL")
            && exported.contains("gpufl_process_top_sync_seconds")
    );
    let board: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/gpufl.json")).unwrap(),
    )
    .expect("gpufl.json parses");
    let panels = board["panels"].as_array().expect("panels");
    let mut queried = BTreeSet::new();
    let mut graphs = 0;
    for p in panels {
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "panel {}: {expr} names no metric",
                p["title"]
            );
            for n in names {
                assert!(
                    exported.contains(&n),
                    "panel {}: {n} is not exported",
                    p["title"]
                );
                queried.insert(n);
            }
        }
    }
    for v in board["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            for n in metric_names(q) {
                assert!(
                    exported.contains(&n),
                    "variable {}: {n} is not exported",
                    v["name"]
                );
            }
        }
    }
    assert!(graphs >= 10, "{graphs} panels");
    // Both halves of the board: device panels and per-process sync panels.
    assert!(
        queried.contains("DCGM_FI_DEV_FB_USED")
            && queried.contains("gpufl_process_sync_seconds_total")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metric_names_of_an_expression() {
    let n = metric_names(
        "rate(gpufl_process_sync_seconds_total{Hostname=~\"$Hostname\"}[1m]) / DCGM_FI_DEV_FB_USED",
    );
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["DCGM_FI_DEV_FB_USED", "gpufl_process_sync_seconds_total"]
    );
}
