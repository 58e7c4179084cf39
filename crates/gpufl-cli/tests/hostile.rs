//! Untrusted sessions (issue 13): each row of the issue's table as a regression test of the
//! `gpufl` binary, with the limit it now meets. Memory is the child's peak resident set
//! (`wait4`'s `ru_maxrss`), measured per child so tests running in parallel do not disturb it; no
//! test asserts a time (a hang guard only kills a child that would block the suite).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A child that is still running after this is killed and the test fails (it blocked).
const HANG_GUARD: Duration = Duration::from_secs(120);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "gpufl-hostile-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident set of the child, bytes.
    max_rss: u64,
}

/// Run `gpufl ARGS` with extra environment, stdout and stderr to files; wait with `wait4` to get
/// the child's own peak memory.
fn gpufl(args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let tmp = TempDir::new("out");
    let (o, e) = (tmp.join("stdout"), tmp.join("stderr"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpufl"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn gpufl");
    let (status, max_rss) = wait_measured(child, args);
    Outcome {
        code: if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        },
        stdout: String::from_utf8_lossy(&std::fs::read(&o).unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&std::fs::read(&e).unwrap()).into_owned(),
        max_rss,
    }
}

/// Reap `child` (polling, so a blocked child is killed after [`HANG_GUARD`]): its wait status and
/// peak resident set in bytes.
fn wait_measured(child: std::process::Child, what: &[&str]) -> (i32, u64) {
    let pid = child.id() as libc::pid_t;
    let t0 = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: plain syscall on our own child, with valid out-pointers.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            std::mem::forget(child); // already reaped
            return (status, ru.ru_maxrss as u64 * 1024);
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        if t0.elapsed() > HANG_GUARD {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("gpufl {what:?} blocked: killed after {HANG_GUARD:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn testdata_session(prefix: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    v.sort();
    v.pop().unwrap()
}

fn header(extra: Value) -> Value {
    let mut h = json!({
        "t": "header", "format": "gpufl-trace", "version": 1, "gpufl_version": "0.1.0",
        "session_id": "hostile-1-20260101T000000Z", "app_name": "hostile", "host": "h",
        "pid": 1, "ppid": 0, "command_line": ["python", "train.py"], "start_unix_ns": 0,
        "clock": {"trace_ns": 0, "unix_ns": 0}, "gpus": [],
        "options": {"enable_synchronization": true, "enable_stack_trace": true,
                    "api_records": "sync", "log_path": "/tmp", "started_by": "test"},
        "capture": {"status": "ok"}
    });
    if let (Some(h), Some(x)) = (h.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            h.insert(k.clone(), v.clone());
        }
    }
    h
}

/// A session directory holding one plain NDJSON trace of these lines.
fn plain_session(dir: &Path, lines: &[String]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(dir.join("trace-0000.ndjson"), text).unwrap();
    dir.to_path_buf()
}

const MB: u64 = 1 << 20;

// Row 1: a huge interned id allocated a dense table up to it (103 GB, abort).
#[test]
fn row1_huge_interned_ids_stay_small() {
    let tmp = TempDir::new("row1");
    let lines: Vec<String> = [
        json!({"t":"str","id":4294967295u32,"s":"x"}),
        json!({"t":"str","id":200000000,"s":"step"}),
        json!({"t":"frame","id":200000000,"kind":"python","func":200000000,"file":4294967295u32,"line":7}),
        json!({"t":"stack","id":4294967295u32,"frames":[200000000]}),
        json!({"t":"sync","kind":"context_synchronize","start":10,"end":20,"ctx":1,"corr":1,"tid":1,"stack":4294967295u32}),
        json!({"t":"kernel","name":4294967295u32,"start":1,"end":5,"dev":0,"ctx":1,"stream":7,"corr":2,"grid":[1,1,1],"block":[1,1,1],"regs":8,"smem_static":0,"smem_dynamic":0,"local_mem":0}),
    ]
    .iter()
    .map(|v| v.to_string())
    .collect();
    let dir = plain_session(&tmp.join("d"), &lines);
    let d = dir.to_str().unwrap();
    for args in [
        vec!["dump", d],
        vec!["dump", "--raw", d],
        vec!["report", d],
        vec!["report", "--json", d],
        vec!["info", d],
    ] {
        let o = gpufl(&args, &[]);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        assert!(o.max_rss <= 50 * MB, "{args:?}: {} MB", o.max_rss / MB);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
    // The ids resolve: the sync's stack names the frame and its file.
    let o = gpufl(&["dump", d, "--type", "sync"], &[]);
    let v: Value = serde_json::from_str(o.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(v["stack"][0], "step (x:7)", "{v}");
    let o = gpufl(&["dump", d, "--type", "kernel"], &[]);
    let v: Value = serde_json::from_str(o.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(v["name"], "x");
}

fn nested_scopes(dir: &Path, levels: u64) -> PathBuf {
    let mut lines = vec![
        header(json!({})).to_string(),
        json!({"t":"str","id":0,"s":"s"}).to_string(),
    ];
    for i in 0..levels {
        lines.push(
            json!({"t":"scope","ts":i + 1,"tid":1,"name":0,"depth":i,"source":"api"}).to_string(),
        );
    }
    for i in (0..levels).rev() {
        lines.push(
            json!({"t":"scope","ts":2 * levels - i,"tid":1,"name":0,"depth":i,"end":true,"source":"api"})
                .to_string(),
        );
    }
    plain_session(dir, &lines)
}

// Row 2: nested scopes copied their parent's whole path (10,000 levels: 2.9 GB).
#[test]
fn row2_deep_scope_nesting_is_bounded() {
    let tmp = TempDir::new("row2");
    let dir = nested_scopes(&tmp.join("d"), 100_000);
    let d = dir.to_str().unwrap();
    let o = gpufl(&["report", d], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.max_rss <= 200 * MB, "report: {} MB", o.max_rss / MB);
    assert!(
        o.stdout.contains("nested deeper than 256 levels"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.lines().all(|l| l.len() < 300),
        "indentation bounded"
    );
    let o = gpufl(&["report", "--json", d], &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.max_rss <= 200 * MB,
        "report --json: {} MB",
        o.max_rss / MB
    );
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let scopes = v["sessions"][0]["scopes"].as_array().unwrap();
    assert_eq!(scopes.len(), 256);
    for (i, s) in scopes.iter().enumerate() {
        assert_eq!(s["depth"], i as u64);
        assert_eq!(s["parent"], if i == 0 { Value::Null } else { json!(i - 1) });
        assert_eq!(s["count"], 1);
    }
    // The innermost tracked scope holds everything folded into it: its wall time spans the
    // deepest scopes' open and close (ts 256 .. 2 * 100000 - 255).
    assert_eq!(scopes[255]["wall_ns"], json!(2 * 100_000 - 255 - 256));
}

// Row 3: a FIFO named like a trace file blocked every command in open().
#[test]
fn row3_fifos_are_refused_not_opened() {
    let tmp = TempDir::new("row3");
    let dir = tmp.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("trace-0000.ndjson.zst");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // A readable file beside it is still read.
    let good = testdata_session("stream_sync_loop-1427");
    std::fs::copy(
        good.join("trace-0000.ndjson.zst"),
        dir.join("trace-0001.ndjson.zst"),
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    for args in [vec!["report", d], vec!["info", d], vec!["dump", d]] {
        let o = gpufl(&args, &[]);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        let all = format!("{}{}", o.stdout, o.stderr);
        assert!(
            all.contains("a FIFO, not a regular file: refused"),
            "{args:?}: {all}"
        );
    }
    let o = gpufl(&["info", d], &[]);
    assert!(o.stdout.contains("600 kernels"), "{}", o.stdout);
}

// Row 4: a closed stdout pipe panicked ("failed printing to stdout", rc 101).
#[test]
fn row4_a_closed_pipe_ends_every_command_quietly() {
    let s = testdata_session("pytorch_train_sync-");
    let d = s.to_str().unwrap();
    for args in [
        vec!["report", d],
        vec!["report", "--json", d],
        vec!["info", d],
        vec!["dump", d],
        vec!["dump", "--raw", d],
        vec!["diff", d, d],
        vec!["diff", "--json", d, d],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpufl"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before gpufl writes anything.
        drop(child.stdout.take());
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let (status, _) = wait_measured(child, &args);
        assert!(libc::WIFEXITED(status), "{args:?}: killed by a signal");
        assert_eq!(libc::WEXITSTATUS(status), 0, "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: nothing on stderr, got {err}");
    }
}

/// A zstd frame of `total` bytes of `byte` made of RLE blocks (4 bytes per 128 KiB): 1 GiB in
/// 32 KB. With `declare`, the frame header states its content size.
fn rle_frame(byte: u8, total: u64, declare: bool) -> Vec<u8> {
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
    if declare {
        f.extend([0xc0, 0x38]);
        f.extend(total.to_le_bytes());
    } else {
        f.extend([0x00, 0x38]); // no content size; window 128 KiB
    }
    let mut left = total;
    while left > 0 {
        let n = left.min(128 << 10);
        left -= n;
        let hdr = u32::from(left == 0) | (1 << 1) | ((n as u32) << 3);
        f.extend(&hdr.to_le_bytes()[..3]);
        f.push(byte);
    }
    f
}

// Row 5: one zstd frame of 1 GiB (a 33 KB file) was held whole: 2.2 GB.
#[test]
fn row5_decompression_is_capped_per_block_and_per_session() {
    let tmp = TempDir::new("row5");
    let good = testdata_session("stream_sync_loop-1427");
    let head = std::fs::read(good.join("trace-0000.ndjson.zst")).unwrap();
    // Without a declared size, the bomb decodes until the limit per file (1000 times its size,
    // at least 64 MiB); with the ratio raised, until the limit per block (256 MiB), streamed; with
    // a declared size over the block limit, it is refused before decoding.
    let per_file =
        "the limit per file (1000 times its size, at least 64 MiB; GPUFL_MAX_RATIO raises it)";
    let per_block = "the limit per block (GPUFL_MAX_BLOCK_MB raises it)";
    let raised = [("GPUFL_MAX_RATIO", "1000000")];
    for (name, byte, declare, env, warning) in [
        ("zeros", 0u8, false, &[][..], per_file),
        ("newlines", b'\n', false, &[][..], per_file),
        ("ratio", b'x', false, &raised[..], per_block),
        ("declared", b'x', true, &[][..], per_block),
    ] {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        // A real session's blocks, then the bomb: what comes before it is still reported.
        let mut bytes = head.clone();
        bytes.extend(rle_frame(byte, 1 << 30, declare));
        std::fs::write(dir.join("trace-0000.ndjson.zst"), &bytes).unwrap();
        assert!(bytes.len() < head.len() + 40_000);
        let d = dir.to_str().unwrap();
        for args in [vec!["info", d], vec!["report", d]] {
            let o = gpufl(&args, env);
            assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
            assert!(
                o.max_rss <= 100 * MB,
                "{name} {args:?}: {} MB",
                o.max_rss / MB
            );
            assert!(o.stdout.contains(warning), "{name} {args:?}: {}", o.stdout);
        }
        let o = gpufl(&["info", d], &[]);
        assert!(o.stdout.contains("600 kernels"), "{}", o.stdout);
    }
    // The per-session limit, lowered: a real session stops with a warning, keeping what it read.
    let o = gpufl(
        &["info", good.to_str().unwrap()],
        &[("GPUFL_MAX_SESSION_MB", "1")],
    );
    let decoded = {
        let mut r = gpufl_trace::TraceReader::open(&good.join("trace-0000.ndjson.zst")).unwrap();
        r.by_ref().count();
        r.decompressed_bytes()
    };
    if decoded > MB {
        assert!(
            o.stdout
                .contains("limit per session (GPUFL_MAX_SESSION_MB raises it)"),
            "{}",
            o.stdout
        );
    } else {
        assert!(!o.stdout.contains("limit per session"), "{}", o.stdout);
    }
}

/// True for a character that must not reach a terminal raw.
fn unsafe_char(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}'
        )
        || ('\u{202A}'..='\u{202E}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

// Row 6: control characters in names were printed raw: a crafted path printed a fake `fix:` line.
#[test]
fn row6_strings_from_a_trace_are_escaped_on_the_terminal_and_exact_in_json() {
    let tmp = TempDir::new("row6");
    let kernel = "k\u{1b}[2J\u{1b}]0;owned\u{7}";
    let file = "/src/tr\nfix: rm -rf ~\r.py";
    let func = "step\u{202e}dcba";
    let scope = "fwd\u{9b}31m\u{2066}";
    let mut lines = vec![
        header(json!({
            "command_line": ["python", "x\u{1b}[31m.py", "a\nfix: rm -rf /"],
            "host": "h\u{1b}]0;t\u{7}",
            "gpufl_version": "0.1\u{1b}[1m",
            "python_version": "3.12\r",
            "gpus": [{"index":0,"name":"GPU\nfix: rm","uuid":"GPU-\u{202e}x","sm_count":132,
                      "cc_major":9,"cc_minor":0,"total_mem_bytes":1}],
            "capture": {"status":"partial","reason":"why\u{1b}[2K\rfix: rm"}
        }))
        .to_string(),
        json!({"t":"str","id":0,"s":kernel}).to_string(),
        json!({"t":"str","id":1,"s":file}).to_string(),
        json!({"t":"str","id":2,"s":func}).to_string(),
        json!({"t":"str","id":3,"s":scope}).to_string(),
        json!({"t":"frame","id":0,"kind":"python","func":2,"file":1,"line":42}).to_string(),
        json!({"t":"stack","id":0,"frames":[0]}).to_string(),
        json!({"t":"notice","level":"warning","message":"bad\u{1b}[A\rfix: rm"}).to_string(),
        json!({"t":"x\u{1b}[2J","a":1}).to_string(),
    ];
    let mut t = 1_000u64;
    lines.push(json!({"t":"scope","ts":t,"tid":1,"name":3,"depth":0,"source":"nvtx"}).to_string());
    for i in 0..30u64 {
        lines.push(
            json!({"t":"kernel","name":0,"start":t + 10,"end":t + 1_000,"dev":0,"ctx":1,"stream":7,"corr":2 * i,
                   "grid":[1,1,1],"block":[32,1,1],"regs":8,"smem_static":0,"smem_dynamic":0,"local_mem":0})
            .to_string(),
        );
        lines.push(
            json!({"t":"sync","kind":"context_synchronize","start":t + 20,"end":t + 1_000,"ctx":1,
                   "corr":2 * i + 1,"tid":1,"stack":0})
            .to_string(),
        );
        t += 2_000;
    }
    lines.push(
        json!({"t":"scope","ts":t,"tid":1,"name":3,"depth":0,"end":true,"source":"nvtx"})
            .to_string(),
    );
    let dir = plain_session(&tmp.join("d\u{1b}[2J"), &lines);
    let d = dir.to_str().unwrap();
    let real = testdata_session("pytorch_train_sync-");
    let real = real.to_str().unwrap();
    for args in [
        vec!["report", d],
        vec!["report", "--color", "never", d],
        vec!["info", d],
        vec!["dump", d, "--type", "kernel", "--limit", "1"],
        vec!["diff", real, d],
        vec!["diff", d, real, "--fail-on-regression", "0"],
    ] {
        let o = gpufl(&args, &[]);
        // From the hostile session (60 µs of wall) to a real one, the wall time regresses.
        let ok = if args.contains(&"--fail-on-regression") {
            3
        } else {
            0
        };
        assert_eq!(o.code, ok, "{args:?}: {}", o.stderr);
        for (what, text) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
            let bad: Vec<char> = text.chars().filter(|&c| unsafe_char(c)).collect();
            assert!(bad.is_empty(), "{args:?} {what}: raw {bad:?} in\n{text}");
            for l in text.lines() {
                assert!(
                    !l.trim_start().starts_with("fix: rm"),
                    "{args:?} {what}: a faked line: {l:?}"
                );
            }
        }
        if args[0] == "report" {
            // The strings were printed, escaped.
            for s in [
                "tr\\u{a}fix: rm -rf ~\\u{d}.py:42",
                "step\\u{202e}dcba",
                "fwd\\u{9b}31m\\u{2066}",
                "k\\u{1b}[2J",
                "x\\u{1b}[31m.py a\\u{a}fix: rm -rf /",
                "GPU\\u{a}fix: rm",
                "why\\u{1b}[2K\\u{d}fix: rm",
                "bad\\u{1b}[A\\u{d}fix: rm",
                "x\\u{1b}[2J",
            ] {
                assert!(o.stdout.contains(s), "{args:?}: no {s} in\n{}", o.stdout);
            }
        }
        if args[0] == "diff" {
            // The hostile session's kernel, line, insight titles, command, warning and path.
            for s in [
                "k\\u{1b}[2J",
                "tr\\u{a}fix: rm -rf ~\\u{d}.py:42",
                "step\\u{202e}dcba",
                "x\\u{1b}[31m.py a\\u{a}fix: rm -rf /",
                "bad\\u{1b}[A\\u{d}fix: rm",
                "d\\u{1b}[2J",
            ] {
                assert!(o.stdout.contains(s), "{args:?}: no {s} in\n{}", o.stdout);
            }
        }
        if args[0] == "info" {
            for s in ["h\\u{1b}]0;t\\u{7}", "3.12\\u{d}", "GPU-\\u{202e}x"] {
                assert!(o.stdout.contains(s), "no {s} in\n{}", o.stdout);
            }
        }
    }
    // JSON stays exact.
    let o = gpufl(&["report", "--json", d], &[]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    let s = &v["sessions"][0];
    assert_eq!(s["command"][2], "a\nfix: rm -rf /");
    assert_eq!(s["kernels"]["rows"][0]["name"], kernel, "{}", s["kernels"]);
    assert_eq!(s["scopes"][0]["name"], scope);
    let located = s["insights"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["location"]["file"] == file && i["location"]["function"] == func);
    assert!(located, "{}", s["insights"]);
    let o = gpufl(&["dump", d, "--type", "kernel", "--limit", "1"], &[]);
    let v: Value = serde_json::from_str(o.stdout.trim()).unwrap();
    assert_eq!(v["name"], kernel);
}

fn kernels_of(info: &str) -> u64 {
    let i = info.find(" kernels").expect("a kernel count");
    info[..i]
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("a number")
}

// Row 7: a trace concatenated with itself doubled every count without a word.
#[test]
fn row7_duplicated_blocks_and_files_are_skipped_and_end_counts_checked() {
    let tmp = TempDir::new("row7");
    let good = testdata_session("pytorch_train_sync-");
    let orig = gpufl(&["info", good.to_str().unwrap()], &[]);
    let n = kernels_of(&orig.stdout);
    assert!(n > 1000);
    assert!(!orig.stdout.contains("warning"), "{}", orig.stdout);
    let bytes = std::fs::read(good.join("trace-0000.ndjson.zst")).unwrap();
    // The file concatenated with itself, as zstd and as plain NDJSON; and copied beside itself.
    let cat = tmp.join("cat");
    std::fs::create_dir_all(&cat).unwrap();
    std::fs::write(
        cat.join("trace-0000.ndjson.zst"),
        [&bytes[..], &bytes[..]].concat(),
    )
    .unwrap();
    let plain = zstd::decode_all(&bytes[..]).unwrap();
    let catp = tmp.join("catp");
    std::fs::create_dir_all(&catp).unwrap();
    std::fs::write(
        catp.join("trace-0000.ndjson"),
        [&plain[..], &plain[..]].concat(),
    )
    .unwrap();
    let copy = tmp.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::write(copy.join("trace-0000.ndjson.zst"), &bytes).unwrap();
    std::fs::write(copy.join("trace-0001.ndjson.zst"), &bytes).unwrap();
    for (dir, warning) in [
        (&cat, "identical to an earlier block"),
        (&catp, "after the end record"),
        (&copy, "identical to an earlier block"),
    ] {
        let o = gpufl(&["info", dir.to_str().unwrap()], &[]);
        assert_eq!(o.code, 0);
        assert_eq!(kernels_of(&o.stdout), n, "{}", o.stdout);
        assert!(o.stdout.contains(warning), "{}", o.stdout);
        let r = gpufl(&["report", "--json", dir.to_str().unwrap()], &[]);
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(v["sessions"][0]["totals"]["kernels"], n);
    }
    // Counts that disagree with the end record.
    let k = |i: u64| {
        json!({"t":"kernel","name":0,"start":i,"end":i + 1,"dev":0,"ctx":1,"stream":7,"corr":i,
               "grid":[1,1,1],"block":[1,1,1],"regs":8,"smem_static":0,"smem_dynamic":0,"local_mem":0})
        .to_string()
    };
    let lines = vec![
        header(json!({})).to_string(),
        json!({"t":"str","id":0,"s":"k"}).to_string(),
        k(1),
        k(2),
        k(3),
        json!({"t":"end","end_unix_ns":1,"reason":"exit","counts":{"kernels":5,"memcpys":0,"memsets":0,"syncs":1,"apis":0,"stacks":0,"dropped":0}}).to_string(),
    ];
    let dir = plain_session(&tmp.join("counts"), &lines);
    let o = gpufl(&["report", dir.to_str().unwrap()], &[]);
    assert!(
        o.stdout
            .contains("the end record's counts disagree with the records read: kernels 5 (read 3), syncs 1 (read 0)"),
        "{}",
        o.stdout
    );
}

// Row 8: no header, `version: 0` and an unknown `format` were accepted without a word.
#[test]
fn row8_header_problems_are_reported() {
    let tmp = TempDir::new("row8");
    let k = json!({"t":"kernel","name":0,"start":1,"end":2,"dev":0,"ctx":1,"stream":7,"corr":1,
                   "grid":[1,1,1],"block":[1,1,1],"regs":8,"smem_static":0,"smem_dynamic":0,"local_mem":0})
    .to_string();
    let s = json!({"t":"str","id":0,"s":"k"}).to_string();
    let cases = [
        ("noheader", vec![s.clone(), k.clone()], "no header record at the start of the file", 1),
        (
            "v0",
            vec![header(json!({"version":0})).to_string(), s.clone(), k.clone()],
            "header version 0 is not a trace format version",
            1,
        ),
        (
            "format",
            vec![header(json!({"format":"other-trace"})).to_string(), s.clone(), k.clone()],
            "not a gpufl trace: its header says format 'other-trace' (expected 'gpufl-trace'); the rest of the file was not read",
            0,
        ),
    ];
    for (name, lines, warning, kernels) in cases {
        let dir = plain_session(&tmp.join(name), &lines);
        let d = dir.to_str().unwrap();
        let o = gpufl(&["report", d], &[]);
        assert_eq!(o.code, 0, "{name}: {}", o.stderr);
        assert!(o.stdout.contains(warning), "{name}: {}", o.stdout);
        let o = gpufl(&["dump", d, "--type", "kernel"], &[]);
        assert_eq!(o.code, 0);
        assert!(o.stderr.contains(warning), "{name}: {}", o.stderr);
        assert_eq!(o.stdout.lines().count(), kernels, "{name}: {}", o.stdout);
    }
}
