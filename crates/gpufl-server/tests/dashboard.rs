//! The dashboard of `gpufl serve` (issue 15), end to end: one server (SQLite, a temporary
//! directory), started in-process from gpufl-server's library (tests/common), holding project A
//! (bundled sessions and a hostile one, uploaded with gpufl-upload) and project B (one session).
//!
//! Plain HTTP tests (always run): the hostile session's insights are located at its hostile path,
//! every page carries the Content-Security-Policy, the hostile pages' HTML holds no markup from
//! the data, the login form refuses an upload key, a page asked
//! for without a key sends to the login form.
//!
//! Browser tests: Debian's `chromium` driven through `chromedriver` (W3C WebDriver, from Rust;
//! tests/webdriver): the journey of the issue (sessions → session → the SYNCHRONIZATION filter's
//! first card's chip → the line → a kernel; compare), the hostile session shown as text with no script run,
//! project isolation, logout. Without Chromium or chromedriver they say they skip, unless
//! `GPUFL_REQUIRE_BROWSER=1` (CI, once `.ci/run` installed them): then they fail. Screenshots of
//! each page go to `$GPUFL_SCREENSHOTS` (scripts/screenshots.sh: docs/screenshots), else to
//! target/dashboard-screenshots.

mod common;
mod webdriver;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use webdriver::{Browser, Element};

use common::{bundled, get as api, Server};

/// What a hostile trace puts in its strings: a script element and an attribute break-out.
const SCRIPT: &str = "<script>window.__pwned=1</script>";
const IMG: &str = "\"><img src=x onerror=\"window.__pwned=2\">";
const HOSTILE_ID: &str = "hostile-4242-20261121T222640Z";
/// The line of the hostile file where it synchronizes and launches.
const HOSTILE_LINE: u32 = 42;

/// Project A's bundled sessions (directory name prefixes) and project B's one.
const A_SESSIONS: &[&str] = &[
    "pytorch_train_sync-1304-",
    "cpp_api-639-",
    "diffpair_base-",
    "diffpair_new-",
    "hf_trainer-",
    "nvtx_ranges-",
    "jax_train-",
];
const B_SESSION: &str = "launch_bound-1009-";

use common::root;

fn hostile_path() -> String {
    format!("/srv/app/{SCRIPT}{IMG}.py")
}
fn hostile_func() -> String {
    format!("step{SCRIPT}{IMG}")
}
fn hostile_kernel() -> String {
    format!("void fused{SCRIPT}<{IMG}>(float*)")
}
fn hostile_scope() -> String {
    format!("nvtx{SCRIPT}{IMG}")
}

/// Percent-encode a path segment or query value (as the dashboard's links do).
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text of HTML character references (the escapes askama writes: `&#60;`, `&lt;`, …).
fn unescape(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let end = rest.find(';').filter(|&e| e <= 8);
        let ch = end.and_then(|e| match &rest[1..e] {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            n if n.starts_with("#x") => u32::from_str_radix(&n[2..], 16)
                .ok()
                .and_then(char::from_u32),
            n if n.starts_with('#') => n[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        });
        match (ch, end) {
            (Some(c), Some(e)) => {
                out.push(c);
                rest = &rest[e + 1..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn rand_hex() -> String {
    let mut b = [0u8; 6];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn id_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

/// A session whose kernel name, Python file path, function name, source text, NVTX scope and
/// range name and command line hold [`SCRIPT`] and [`IMG`]: 60 iterations of 5 launches, a copy
/// and a device-wide sync, all at `hostile_path():42`, so that the analysis locates its insights
/// (in-loop sync, sync attribution…) and the line's kernels there.
fn write_hostile_session(parent: &Path) -> PathBuf {
    use gpufl_trace::*;
    let dir = parent.join(HOSTILE_ID);
    std::fs::create_dir_all(&dir).unwrap();
    let start_unix = 1_795_300_000_000_000_000u64;
    let t0 = 1_000_000_000u64;
    let header = Header {
        gpufl_version: "0.1.0".into(),
        session_id: HOSTILE_ID.into(),
        app_name: "hostile".into(),
        host: "h".into(),
        pid: 4242,
        ppid: 1,
        command_line: vec![
            "python3".into(),
            "train.py".into(),
            format!("--tag={SCRIPT}{IMG}"),
        ],
        start_unix_ns: start_unix,
        clock: ClockSync {
            trace_ns: t0,
            unix_ns: start_unix,
        },
        gpus: vec![Gpu {
            index: 0,
            name: format!("GPU {SCRIPT}"),
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            sm_count: 132,
            cc_major: 9,
            cc_minor: 0,
            total_mem_bytes: 85_017_493_504,
            limits: Some(GpuLimits {
                max_threads_per_block: 1024,
                max_threads_per_sm: 2048,
                max_blocks_per_sm: 32,
                regs_per_sm: 65536,
                regs_per_block: 65536,
                smem_per_sm: 233_472,
                smem_per_block: 49_152,
                smem_per_block_optin: 232_448,
                smem_reserved_per_block: 1024,
                warp_size: 32,
                l2_bytes: 52_428_800,
                sm_clock_khz: Some(1_980_000),
                mem_clock_khz: Some(2_619_000),
                mem_bus_bits: Some(5120),
                mem_bandwidth: Some(3_352_320_000_000),
            }),
        }],
        python_version: Some("3.12".into()),
        options: CaptureOptions {
            enable_synchronization: true,
            enable_stack_trace: true,
            api_records: "default".into(),
            log_path: "/tmp".into(),
            started_by: "injection".into(),
            ..CaptureOptions::default()
        },
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let s = |w: &mut TraceWriter<std::fs::File>, x: &str| w.intern_str(x).unwrap();
    let path = s(&mut w, &hostile_path());
    let func = s(&mut w, &hostile_func());
    let text = s(
        &mut w,
        &format!("torch.cuda.synchronize()  # {SCRIPT}{IMG}"),
    );
    let main_fn = s(&mut w, "<module>");
    let cudart = s(&mut w, "/usr/lib/x86_64-linux-gnu/libcudart.so.13");
    let native = |w: &mut TraceWriter<std::fs::File>, name: &str, off: u64| {
        let f = w.intern_str(name).unwrap();
        w.intern_frame(FrameData {
            kind: FrameKind::Native,
            module: Some(cudart),
            offset: Some(off),
            func: Some(f),
            file: None,
            line: None,
            inlined: false,
            text: None,
        })
        .unwrap()
    };
    let sync_fr = native(&mut w, "cudaDeviceSynchronize", 0x5a10);
    let launch_fr = native(&mut w, "cudaLaunchKernel", 0x6b20);
    let copy_fr = native(&mut w, "cudaMemcpyAsync", 0x7c30);
    let py = |w: &mut TraceWriter<std::fs::File>, func: StrId, line: u32, text: Option<StrId>| {
        w.intern_frame(FrameData {
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(path),
            line: Some(line),
            inlined: false,
            text,
        })
        .unwrap()
    };
    let step = py(&mut w, func, HOSTILE_LINE, Some(text));
    let outer = py(&mut w, main_fn, 60, None);
    let sync_stack = w.intern_stack(&[sync_fr, step, outer]).unwrap();
    let launch_stack = w.intern_stack(&[launch_fr, step, outer]).unwrap();
    let copy_stack = w.intern_stack(&[copy_fr, step, outer]).unwrap();
    let kernel = s(&mut w, &hostile_kernel());
    let scope = s(&mut w, &hostile_scope());
    let launch_api = s(&mut w, "cudaLaunchKernel");
    let copy_api = s(&mut w, "cudaMemcpyAsync");
    let sync_api = s(&mut w, "cudaDeviceSynchronize");
    let tid = 4242u64;
    let mut t = t0 + 1_000_000;
    let mut corr = 0u32;
    let loop_start = t;
    for i in 0..60u64 {
        w.write(&Record::Scope(Scope {
            ts: t,
            tid,
            name: scope,
            depth: 0,
            end: false,
            source: ScopeSource::Nvtx,
        }))
        .unwrap();
        let mut gpu = t + 10_000;
        for j in 0..5u64 {
            corr += 1;
            let at = t + j * 5_000;
            w.write(&Record::Api(Api {
                domain: ApiDomain::Runtime,
                name: launch_api,
                cbid: 211,
                start: at,
                end: at + 4_000,
                tid,
                corr,
                ret: 0,
            }))
            .unwrap();
            w.write(&Record::Callsite(Callsite {
                corr,
                api: launch_api,
                tid,
                ts: at,
                stack: launch_stack,
                weight: None,
            }))
            .unwrap();
            let len = 80_000 + 10_000 * j + (i % 7) * 1_000;
            w.write(&Record::Kernel(Kernel {
                name: kernel,
                start: gpu,
                end: gpu + len,
                dev: 0,
                ctx: 1,
                stream: 7,
                corr,
                grid: [64, 1, 1],
                block: [256, 1, 1],
                regs: 96,
                smem_static: 8192,
                smem_dynamic: 4096,
                local_mem: 16,
                smem_executed: None,
                graph: None,
            }))
            .unwrap();
            gpu += len + 1_000;
        }
        // A device-to-host copy of the result, at the same line.
        corr += 1;
        let at = t + 26_000;
        w.write(&Record::Api(Api {
            domain: ApiDomain::Runtime,
            name: copy_api,
            cbid: 41,
            start: at,
            end: at + 3_000,
            tid,
            corr,
            ret: 0,
        }))
        .unwrap();
        w.write(&Record::Callsite(Callsite {
            corr,
            api: copy_api,
            tid,
            ts: at,
            stack: copy_stack,
            weight: None,
        }))
        .unwrap();
        w.write(&Record::Memcpy(Memcpy {
            kind: CopyKind::DtoH,
            src_kind: MemoryKind::Device,
            dst_kind: MemoryKind::Pinned,
            bytes: 1 << 20,
            start: gpu,
            end: gpu + 40_000,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr,
            graph: None,
        }))
        .unwrap();
        gpu += 41_000;
        // The host waits for all of it.
        corr += 1;
        let (ss, se) = (t + 30_000, gpu + 5_000);
        w.write(&Record::Api(Api {
            domain: ApiDomain::Runtime,
            name: sync_api,
            cbid: 165,
            start: ss,
            end: se,
            tid,
            corr,
            ret: 0,
        }))
        .unwrap();
        w.write(&Record::Sync(Sync {
            kind: SyncKind::ContextSynchronize,
            start: ss,
            end: se,
            ctx: 1,
            stream: None,
            event: None,
            corr,
            tid: Some(tid),
            stack: Some(sync_stack),
        }))
        .unwrap();
        w.write(&Record::Scope(Scope {
            ts: se + 1_000,
            tid,
            name: scope,
            depth: 0,
            end: true,
            source: ScopeSource::Nvtx,
        }))
        .unwrap();
        // CPU work before the next step: the GPU idles.
        t = se + 150_000;
    }
    w.write(&Record::Range(Range {
        id: 1,
        name: scope,
        start: loop_start,
        end: t,
        tid,
        end_tid: None,
        source: ScopeSource::Nvtx,
    }))
    .unwrap();
    w.finish(start_unix + (t - t0) + 1_000_000, "exit").unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------
// The server and its data, shared by the tests of this file while any of them runs.

struct Fixture {
    /// Taken when the fixture drops (the server stops before its data is removed).
    server: Option<Server>,
    url: String,
    data: PathBuf,
    a_up: String,
    a_rd: String,
    b_rd: String,
    /// Session ids of project A by directory-name prefix, and B's.
    a: BTreeMap<String, String>,
    b_id: String,
}

impl Fixture {
    fn id(&self, prefix: &str) -> &str {
        self.a
            .iter()
            .find(|(p, _)| p.starts_with(prefix))
            .map(|(_, id)| id.as_str())
            .unwrap_or_else(|| panic!("no session {prefix} in project A"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

static FIXTURE: Mutex<Weak<Fixture>> = Mutex::new(Weak::new());

/// The running fixture, started by the first test that needs it (the others running at the
/// same time share it; it stops when the last of them drops it).
fn fixture() -> Arc<Fixture> {
    let mut g = FIXTURE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = g.upgrade() {
        return f;
    }
    let f = Arc::new(start_fixture());
    *g = Arc::downgrade(&f);
    f
}

fn start_fixture() -> Fixture {
    let data =
        std::env::temp_dir().join(format!("gpufl-dash-{}-{}", std::process::id(), rand_hex()));
    std::fs::create_dir_all(&data).unwrap();
    let mut cfg = gpufl_server::ServeConfig::new(data.clone());
    cfg.rate_per_key = 0.0;
    let (a_up, a_rd) = common::project(&cfg, "team-a");
    let (b_up, b_rd) = common::project(&cfg, "team-b");
    let server = Server::start(&cfg);
    let url = server.url.clone();
    let mut dirs: Vec<PathBuf> = A_SESSIONS.iter().map(|p| bundled(p)).collect();
    dirs.push(write_hostile_session(&data.join("hostile")));
    let b_dir = bundled(B_SESSION);
    common::upload(&url, &a_up, &dirs);
    common::upload(&url, &b_up, std::slice::from_ref(&b_dir));
    let a: BTreeMap<String, String> = dirs.iter().map(|d| (id_of(d), id_of(d))).collect();
    let b_id = id_of(&b_dir);
    let f = Fixture {
        server: Some(server),
        url,
        data,
        a_up,
        a_rd,
        b_rd,
        a,
        b_id,
    };
    wait_ready(&f.url, &f.a_rd, f.a.values());
    wait_ready(&f.url, &f.b_rd, [&f.b_id]);
    f
}

/// Wait until every listed session of the key's project is analysed.
fn wait_ready<'a>(url: &str, key: &str, ids: impl IntoIterator<Item = &'a String>) {
    let ids: Vec<&String> = ids.into_iter().collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (st, v) = api(url, key, "/api/v1/sessions?limit=1000");
        assert_eq!(st, 200, "{v}");
        let ready = |id: &str| {
            v["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == id && (s["ingest"] == "ready" || s["ingest"] == "corrupt"))
        };
        let pending: Vec<&&String> = ids.iter().filter(|id| !ready(id)).collect();
        if pending.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not analysed after 300 s: {pending:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A dashboard page over plain HTTP, redirects not followed.
struct Page {
    status: u16,
    csp: Option<String>,
    location: Option<String>,
    body: String,
}

fn http(method: &str, url: &str, key: Option<&str>, form: Option<&[(&str, &str)]>) -> Page {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let mut req = agent.request(method, url);
    if let Some(k) = key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    // A form's POST carries its page's origin, as a browser sends it (the server takes the
    // login form's POSTs from its own pages only).
    if method == "POST" {
        let origin = url.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
        req = req.set("Origin", &origin);
    }
    let r = match form {
        Some(f) => req.send_form(f),
        None => req.call(),
    };
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{url}: {e}"),
    };
    Page {
        status: resp.status(),
        csp: resp.header("content-security-policy").map(str::to_string),
        location: resp.header("location").map(str::to_string),
        body: resp.into_string().unwrap_or_default(),
    }
}

/// The dashboard pages of the hostile session: session, its line, its kernel.
fn hostile_pages(f: &Fixture) -> Vec<String> {
    let id = enc(HOSTILE_ID);
    vec![
        format!("/sessions/{id}"),
        format!(
            "/sessions/{id}/line?file={}&line={HOSTILE_LINE}",
            enc(&hostile_path())
        ),
        format!(
            "/sessions/{id}/kernel?name={}&device=0",
            enc(&hostile_kernel())
        ),
    ]
    .into_iter()
    .map(|p| format!("{}{p}", f.url))
    .collect()
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP: no browser needed.

/// The `href` of every `<a class="{class}" href="…">` of a page, unescaped, in page order.
fn hrefs_of(html: &str, class: &str) -> Vec<String> {
    let key = format!("<a class=\"{class}\" href=\"");
    html.split(&key)
        .skip(1)
        .filter_map(|r| r.split_once('"').map(|(h, _)| unescape(h)))
        .collect()
}

/// Library lines are first-class (issue 37): on hf_trainer, a card's library chip links to the
/// library line's page, which says it is a library line and lists the user lines that called
/// through it (each linking to its page); a user line's page shows its split by library line as
/// a visible table (not folded), each row linking to that library line's page.
#[test]
fn library_chips_open_the_library_line_and_user_lines_split_by_it() {
    let f = fixture();
    let id = f.id("hf_trainer-");
    let sp = http(
        "GET",
        &format!("{}/sessions/{}", f.url, enc(id)),
        Some(&f.a_rd),
        None,
    );
    assert_eq!(sp.status, 200);
    let libs = hrefs_of(&sp.body, "chip lib");
    assert!(!libs.is_empty(), "no library chip link on the session page");
    let lib = &libs[0];
    assert!(
        lib.starts_with(&format!("/sessions/{}/line?file=", enc(id))),
        "{lib}"
    );
    let lp = http("GET", &format!("{}{lib}", f.url), Some(&f.a_rd), None);
    assert_eq!(lp.status, 200, "{lib}: {}", lp.body);
    assert!(
        lp.body.contains("id=\"library-badge\""),
        "{lib}: not a library line page"
    );
    assert!(lp.body.contains("By user line calling it"), "{lib}");
    let users = hrefs_of(&lp.body, "chip");
    assert!(!users.is_empty(), "{lib}: no user line listed");
    // The library page's insights are the ones through it: the card whose chip led here.
    assert!(lp.body.contains("id=\"line-insights\""), "{lib}");
    // The user line's page: its split by library line, visible, linking back.
    let user = users
        .iter()
        .find(|u| {
            let up = http("GET", &format!("{}{u}", f.url), Some(&f.a_rd), None);
            up.status == 200 && hrefs_of(&up.body, "chip lib").contains(lib)
        })
        .unwrap_or_else(|| panic!("no user line of {lib} links back to it: {users:?}"));
    let up = http("GET", &format!("{}{user}", f.url), Some(&f.a_rd), None);
    assert!(
        up.body.contains("<section id=\"line-locations\">"),
        "{user}"
    );
    assert!(up.body.contains("By library line"), "{user}");
    assert!(
        !up.body.contains("<details class=\"variants\""),
        "{user}: still folded"
    );
    let rows = up.body.matches("<tr class=\"variant\">").count();
    assert!(rows >= 1, "{user}: no library line rows");
}

/// The hostile session is analysed like any other: its sync insights are located at the
/// hostile path (so the session page's chip shows it).
#[test]
fn the_hostile_session_has_insights_at_the_hostile_path() {
    // GPUFL_HOSTILE_OUT=DIR: also leave a copy in DIR (to look at it by hand).
    if let Ok(d) = std::env::var("GPUFL_HOSTILE_OUT") {
        write_hostile_session(Path::new(&d));
    }
    let f = fixture();
    let id = enc(HOSTILE_ID);
    let (st, v) = api(&f.url, &f.a_rd, &format!("/api/v1/sessions/{id}/insights"));
    assert_eq!(st, 200, "{v}");
    let ins = v["insights"].as_array().unwrap();
    let at_path: Vec<&Value> = ins
        .iter()
        .filter(|i| i["location"]["file"] == hostile_path().as_str())
        .collect();
    assert!(
        at_path
            .iter()
            .any(|i| i["rule"] == "in-loop-sync" || i["rule"] == "sync-attribution"),
        "{ins:#?}"
    );
    assert!(at_path
        .iter()
        .all(|i| i["location"]["function"] == hostile_func().as_str()));
    let (st, v) = api(&f.url, &f.a_rd, &format!("/api/v1/sessions/{id}/kernels"));
    assert_eq!(st, 200, "{v}");
    let kernels = v["kernels"].to_string();
    assert!(kernels.contains("fused<script>"), "{kernels}");
}

/// Every dashboard page answers with the policy that forbids every script.
#[test]
fn every_page_carries_the_content_security_policy() {
    let f = fixture();
    let mut urls = hostile_pages(&f);
    let base = &f.url;
    urls.extend([
        format!("{base}/sessions"),
        format!("{base}/sessions?q=train&sort=duration&dir=asc"),
        format!("{base}/sessions/{}", enc(f.id("pytorch_train_sync-1304-"))),
        format!("{base}/compare"),
        format!(
            "{base}/compare?a={}&b={}",
            enc(f.id("diffpair_base-")),
            enc(f.id("diffpair_new-"))
        ),
        format!("{base}/sessions/no-such-session"),
        format!("{base}/login"),
    ]);
    for u in &urls {
        let p = http("GET", u, Some(&f.a_rd), None);
        let csp = p
            .csp
            .unwrap_or_else(|| panic!("{u}: {} without a Content-Security-Policy", p.status));
        let parts: Vec<&str> = csp.split(';').map(str::trim).collect();
        assert!(parts.contains(&"default-src 'none'"), "{u}: {csp}");
        assert!(
            !parts.iter().any(|d| d.starts_with("script-src")),
            "{u}: scripts allowed: {csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{u}: {csp}");
        assert!(
            !p.body.to_ascii_lowercase().contains("<script"),
            "{u}: a script element"
        );
    }
    // Without a key too (the redirect to the login form).
    let p = http("GET", &format!("{base}/sessions"), None, None);
    assert!(p.csp.is_some_and(|c| c.contains("default-src 'none'")));
}

/// The hostile session's pages show its strings escaped: no `<script` and no `<img` anywhere in
/// the HTML, and the escaped text is there.
#[test]
fn hostile_pages_hold_no_markup_from_the_data() {
    let f = fixture();
    for u in hostile_pages(&f) {
        let p = http("GET", &u, Some(&f.a_rd), None);
        assert_eq!(p.status, 200, "{u}: {}", p.body);
        let lower = p.body.to_ascii_lowercase();
        assert!(!lower.contains("<script"), "{u}: <script in\n{}", p.body);
        assert!(!lower.contains("<img"), "{u}: <img in\n{}", p.body);
        assert!(!lower.contains("onerror=\""), "{u}: an onerror attribute");
        let text = unescape(&p.body);
        assert!(
            text.contains(SCRIPT) && text.contains(IMG),
            "{u}: the hostile strings are not shown as text:\n{}",
            p.body
        );
    }
}

/// The login form takes read keys only: an upload key is refused with the reason.
#[test]
fn login_refuses_an_upload_key() {
    let f = fixture();
    let p = http(
        "POST",
        &format!("{}/login", f.url),
        None,
        Some(&[("key", &f.a_up), ("next", "/sessions")]),
    );
    assert_eq!(p.status, 401, "{}", p.body);
    assert!(p.body.contains("id=\"login-error\""), "{}", p.body);
    assert!(p.body.contains("upload key"), "{}", p.body);
    let p = http(
        "POST",
        &format!("{}/login", f.url),
        None,
        Some(&[("key", "gfl_rd_00000000000000000000000000000000")]),
    );
    assert_eq!(p.status, 401);
    assert!(p.body.contains("not known"), "{}", p.body);
    // A read key logs in: a cookie and back to the page asked for.
    let p = http(
        "POST",
        &format!("{}/login", f.url),
        None,
        Some(&[("key", &f.a_rd), ("next", "/compare")]),
    );
    assert!((300..400).contains(&p.status), "{}", p.status);
    assert_eq!(p.location.as_deref(), Some("/compare"));
}

/// A raw POST of the login form (or logout) with the given headers: status, `Location`,
/// `Set-Cookie`, body.
fn post_form(
    url: &str,
    form: &[(&str, &str)],
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Option<String>, String) {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let mut req = agent.post(url);
    for (h, v) in headers {
        req = req.set(h, v);
    }
    let resp = match req.send_form(form) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{url}: {e}"),
    };
    (
        resp.status(),
        resp.header("location").map(str::to_string),
        resp.header("set-cookie").map(str::to_string),
        resp.into_string().unwrap_or_default(),
    )
}

/// A page with a cookie: its status.
fn get_with_cookie(url: &str, cookie: &str) -> u16 {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    match agent.get(url).set("Cookie", cookie).call() {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Rows "login/logout take cross-site POSTs", "`next=` after login" and "the cookie holds the
/// raw read key": the form's POSTs are taken from this server's pages only (another `Origin`,
/// or none, is 403, and logs no one in or out); `next` that a browser would read as another
/// site, or that holds control characters, goes to `/sessions` (never a 500); the cookie is an
/// opaque id, not the key, `Secure` behind TLS, and logging out ends it on the server.
#[test]
fn login_is_same_origin_with_an_opaque_session() {
    let f = fixture();
    let login = format!("{}/login", f.url);
    let own = f.url.clone();
    let form = [("key", f.a_rd.as_str()), ("next", "/compare")];
    for origin in [Some("http://evil.example"), Some("null"), None] {
        let h: Vec<(&str, &str)> = origin.iter().map(|o| ("Origin", *o)).collect();
        let (st, _, cookie, _) = post_form(&login, &form, &h);
        assert_eq!(st, 403, "Origin {origin:?}");
        assert!(cookie.is_none(), "Origin {origin:?}: {cookie:?}");
    }
    // The Referer's origin serves where there is no Origin.
    let referer = format!("{own}/login");
    let (st, _, cookie, _) = post_form(&login, &form, &[("Referer", &referer)]);
    assert_eq!(st, 303);
    assert!(cookie.is_some());
    // next.
    for bad in [
        "/\t/evil.example",
        "/\tevil.example",
        "//evil.example",
        "/\\evil.example",
        "/a\r\nSet-Cookie: x=1",
        "/a\x0b",
        "/a\x1f",
        "/a\x7f",
        "https://evil.example/",
        "/ /evil.example",
    ] {
        let (st, loc, _, _) = post_form(
            &login,
            &[("key", f.a_rd.as_str()), ("next", bad)],
            &[("Origin", &own)],
        );
        assert_eq!(st, 303, "{bad:?}");
        assert_eq!(loc.as_deref(), Some("/sessions"), "{bad:?}");
        let p = http("GET", &format!("{login}?next={}", enc(bad)), None, None);
        // Control characters are refused outright (400); the rest go back to /sessions.
        match p.status {
            200 => assert!(
                p.body.contains("value=\"/sessions\""),
                "{bad:?}: {}",
                p.body
            ),
            400 => assert!(bad.chars().any(char::is_control), "{bad:?}"),
            s => panic!("{bad:?}: {s}"),
        }
    }
    // The cookie: an opaque id, Secure behind TLS, ended by logout.
    let (st, _, cookie, _) = post_form(&login, &form, &[("Origin", &own)]);
    assert_eq!(st, 303);
    let cookie = cookie.unwrap();
    assert!(!cookie.contains(&f.a_rd), "{cookie}");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    assert_eq!(get_with_cookie(&format!("{own}/sessions"), &pair), 200);
    let (_, _, tls, _) = post_form(
        &login,
        &form,
        &[("Origin", &own), ("X-Forwarded-Proto", "https")],
    );
    assert!(tls.unwrap().contains("Secure"));
    // A cross-site logout leaves the session; a same-origin one ends it on the server.
    let (st, _, _, _) = post_form(
        &format!("{own}/logout"),
        &[],
        &[("Origin", "http://evil.example"), ("Cookie", &pair)],
    );
    assert_eq!(st, 403);
    assert_eq!(get_with_cookie(&format!("{own}/sessions"), &pair), 200);
    let (st, _, _, _) = post_form(
        &format!("{own}/logout"),
        &[],
        &[("Origin", &own), ("Cookie", &pair)],
    );
    assert_eq!(st, 303);
    assert_eq!(get_with_cookie(&format!("{own}/sessions"), &pair), 303);
    // The raw key as a cookie (what it held before) opens nothing.
    let raw = format!("gpufl_key={}", f.a_rd);
    assert_eq!(get_with_cookie(&format!("{own}/sessions"), &raw), 303);
}

/// A page asked for without a key sends to the login form, which sends back after.
#[test]
fn a_page_without_a_key_redirects_to_the_login_form() {
    let f = fixture();
    for path in [
        "/sessions".to_string(),
        format!("/sessions/{}", enc(f.id("cpp_api-639-"))),
        "/compare".into(),
    ] {
        let p = http("GET", &format!("{}{path}", f.url), None, None);
        assert!((300..400).contains(&p.status), "{path}: {}", p.status);
        let loc = p.location.unwrap_or_default();
        assert!(loc.starts_with("/login"), "{path}: {loc}");
        assert!(
            loc.contains(&format!("next={}", enc(&path))),
            "{path}: {loc}"
        );
    }
    // A wrong key is no key.
    let p = http(
        "GET",
        &format!("{}/sessions", f.url),
        Some("gfl_rd_00000000000000000000000000000000"),
        None,
    );
    assert!((300..400).contains(&p.status), "{}", p.status);
}

// ---------------------------------------------------------------------------------------------
// The browser.

fn require_browser() -> bool {
    std::env::var("GPUFL_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
}

/// A headless Chromium, or None (the test skips) when it is not installed.
fn browser() -> Option<Browser> {
    let (chromium, driver) = match webdriver::find_browser() {
        Ok(x) => x,
        Err(why) => {
            assert!(!require_browser(), "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: {why}");
            return None;
        }
    };
    match Browser::start(&chromium, &driver) {
        Ok(b) => Some(b),
        Err(why) => {
            assert!(!require_browser(), "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: the browser did not start: {why}");
            None
        }
    }
}

/// Log in through the form with `key`; lands on the sessions list.
fn login(b: &Browser, f: &Fixture, key: &str) {
    b.goto(&format!("{}/sessions", f.url));
    assert!(
        b.current_path().starts_with("/login"),
        "{}",
        b.current_url()
    );
    let field = b.find("input[name=key]");
    b.send_keys(&field, key);
    let go = b.find("#login");
    b.click_nav(&go);
    assert_eq!(b.current_path(), "/sessions", "{}", b.page_text());
}

/// Where the screenshots go.
fn shots_dir() -> PathBuf {
    let d = match std::env::var("GPUFL_SCREENSHOTS") {
        Ok(d) if !d.is_empty() => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                root().join(p)
            }
        }
        _ => root().join("target/dashboard-screenshots"),
    };
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn save_shot(name: &str, png: &[u8]) {
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}: not a PNG");
    let p = shots_dir().join(name);
    std::fs::write(&p, png).unwrap();
    eprintln!("screenshot {}", p.display());
}

/// No script ran and no element came from the data: `window.__pwned` undefined, no `script`
/// element, no `img` with an `onerror` attribute.
fn assert_inert(b: &Browser) {
    let v = b.exec(
        "return [typeof window.__pwned, document.getElementsByTagName('script').length, \
         document.querySelectorAll('img[onerror], [onerror]').length, \
         document.getElementsByTagName('img').length];",
        vec![],
    );
    assert_eq!(
        v,
        serde_json::json!(["undefined", 0, 0, 0]),
        "{}",
        b.current_url()
    );
}

fn assert_no_error(b: &Browser) {
    if let Ok(e) = b.try_find("#error-title") {
        panic!(
            "{}: error page {}: {}",
            b.current_url(),
            b.text(&e),
            b.page_text()
        );
    }
}

/// The journey: the sessions list, a session, the SYNCHRONIZATION card's chip → the
/// line (its stack, the kernels launched there) → a kernel; screenshots of each page.
#[test]
fn browser_sessions_session_line_kernel() {
    let Some(b) = browser() else { return };
    let f = fixture();
    login(&b, &f, &f.a_rd);
    // The sessions list: a row per session of project A, none of B's.
    let rows = b.find_all("table#sessions tr.session");
    assert_eq!(rows.len(), f.a.len(), "{}", b.page_text());
    let links: Vec<String> = b
        .find_all("table#sessions a.session-link")
        .iter()
        .filter_map(|a| b.attr(a, "href"))
        .collect();
    for id in f.a.values() {
        assert!(
            links
                .iter()
                .any(|h| h.ends_with(&format!("/sessions/{}", enc(id)))),
            "{id} not listed: {links:?}"
        );
    }
    b.find("#trend");
    b.find("form#filters");
    save_shot("sessions.png", &b.screenshot_full(4000));
    // A search narrows the list.
    b.goto(&format!("{}/sessions?q=hf_trainer", f.url));
    assert_eq!(b.find_all("table#sessions tr.session").len(), 1);

    // pytorch_train_sync: its SYNCHRONIZATION chip leads to the line with its stack (the
    // session recorded no launch call sites: no kernels at the line).
    let journey = |prefix: &str, want_kernels: bool| -> String {
        let id = f.id(prefix).to_string();
        b.goto(&format!("{}/sessions", f.url));
        let link = b
            .find_all("table#sessions a.session-link")
            .into_iter()
            .find(|a| {
                b.attr(a, "href")
                    .is_some_and(|h| h.ends_with(&format!("/sessions/{}", enc(&id))))
            })
            .unwrap_or_else(|| panic!("no link to {id}"));
        b.click_nav(&link);
        assert_eq!(b.current_path(), format!("/sessions/{}", enc(&id)));
        assert_no_error(&b);
        b.find("h1#session-title");
        assert!(!b.find_all("#headline .stat").is_empty());
        // The SYNCHRONIZATION filter of the findings list, then its first card's chip.
        let filter = b
            .find_all("nav#insight-filters a.filter")
            .into_iter()
            .find(|a| b.text(a).starts_with("SYNCHRONIZATION"))
            .unwrap_or_else(|| panic!("no SYNCHRONIZATION filter: {}", b.page_text()));
        b.click_nav(&filter);
        assert!(
            b.current_path().contains("?category=SYNCHRONIZATION"),
            "{}",
            b.current_url()
        );
        let cats: Vec<String> = b
            .find_all("#insight-list .card")
            .iter()
            .filter_map(|c| b.attr(c, "data-category"))
            .collect();
        assert!(
            !cats.is_empty() && cats.iter().all(|c| c == "SYNCHRONIZATION"),
            "{cats:?}"
        );
        let chip = b.find("#insight-list .card[data-category=\"SYNCHRONIZATION\"] a.chip");
        let chip_text = b.text(&chip);
        let chip_title = b.attr(&chip, "title").unwrap_or_default();
        b.click_nav(&chip);
        let path = b.current_path();
        assert!(
            path.starts_with(&format!("/sessions/{}/line?", enc(&id))),
            "{path}"
        );
        assert_no_error(&b);
        let title = b.text(&b.find("h1#line-title"));
        let line_no = chip_text.rsplit(':').next().unwrap_or_default().to_string();
        assert!(
            title.contains(&format!(":{line_no}")),
            "{title} vs chip {chip_text}"
        );
        let file = chip_title.rsplit('/').next().unwrap_or_default();
        let file = file.split(':').next().unwrap_or_default();
        assert!(title.contains(file), "{title} vs chip title {chip_title}");
        assert!(
            !b.find_all("section#line-stack ol.stack li").is_empty(),
            "no stack: {}",
            b.page_text()
        );
        let kernels = b.find_all("section#line-kernels tr.kernel");
        if want_kernels {
            assert!(!kernels.is_empty(), "no kernels: {}", b.page_text());
        }
        id
    };
    journey("pytorch_train_sync-1304-", false);
    // The session page's screenshot: hf_trainer, the example (its top finding first, 30
    // findings of three categories, utilization, the host while the GPU idled, telemetry).
    b.goto(&format!("{}/sessions/{}", f.url, enc(f.id("hf_trainer-"))));
    assert_no_error(&b);
    save_shot("session.png", &b.screenshot_full(12000));
    // hf_trainer: the chip's line launched kernels; one of them opens its detail.
    let id = journey("hf_trainer-", true);
    let k = b.find("section#line-kernels tr.kernel a.kernel-link");
    let kname = b.text(&k);
    b.click_nav(&k);
    assert!(
        b.current_path()
            .starts_with(&format!("/sessions/{}/kernel?", enc(&id))),
        "{}",
        b.current_url()
    );
    assert_no_error(&b);
    let ktitle = b.text(&b.find("h1#kernel-title"));
    let short: String = kname.chars().take(20).collect();
    assert!(
        ktitle.contains(short.trim_end_matches('…')),
        "{ktitle} vs {kname}"
    );
    let config = b.text(&b.find("#kernel-config"));
    for word in ["grid", "block", "register"] {
        assert!(
            config.to_lowercase().contains(word),
            "{word} missing from the launch configuration: {config}"
        );
    }
    b.find("section#kernel-durations");
    b.find("section#kernel-sites");
    // The session page's kernel table links to the same kind of page.
    b.goto(&format!("{}/sessions/{}", f.url, enc(&id)));
    let k = b.find("section#kernels tr.kernel a.kernel-link");
    b.click_nav(&k);
    b.find("#kernel-config");
    // The line and kernel screenshots: jax_train's synchronizing line (a line with fewer
    // insights than hf_trainer's `trainer.train()`, which holds nearly all of them).
    let jax = f.id("jax_train-").to_string();
    let (_, ins) = api(&f.url, &f.a_rd, &format!("/api/v1/sessions/{jax}/insights"));
    let loc = ins["insights"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|i| i["rule"] == "sync-attribution" && i["location"]["file"].is_string())
        })
        .map(|i| i["location"].clone())
        .expect("a located sync insight in jax_train");
    b.goto(&format!(
        "{}/sessions/{}/line?file={}&line={}",
        f.url,
        enc(&jax),
        enc(loc["file"].as_str().unwrap()),
        loc["line"]
    ));
    assert_no_error(&b);
    save_shot("line.png", &b.screenshot_full(8000));
    let k = b.find("section#line-kernels tr.kernel a.kernel-link");
    b.click_nav(&k);
    assert_no_error(&b);
    save_shot("kernel.png", &b.screenshot_full(8000));
}

/// Comparing two sessions through the form.
#[test]
fn browser_compare() {
    let Some(b) = browser() else { return };
    let f = fixture();
    login(&b, &f, &f.a_rd);
    let (base, new) = (f.id("diffpair_base-"), f.id("diffpair_new-"));
    b.find("form#compare-form");
    let pick = |sel: &str, id: &str| {
        let opt = b
            .find_all(&format!("form#compare-form select[name={sel}] option"))
            .into_iter()
            .find(|o| b.attr(o, "value").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no option {id} in select {sel}"));
        b.click(&opt);
    };
    pick("a", base);
    pick("b", new);
    let go = b.find("#compare-go");
    b.click_nav(&go);
    let path = b.current_path();
    assert!(path.starts_with("/compare?"), "{path}");
    assert!(path.contains(&format!("a={}", enc(base))), "{path}");
    assert!(path.contains(&format!("b={}", enc(new))), "{path}");
    assert_no_error(&b);
    b.find("h1#compare-title");
    b.find("section#compare-totals");
    let rows = b.find_all(
        "section#compare-insights tr.insight-new, section#compare-insights tr.insight-gone, \
         section#compare-insights tr.insight-changed, section#compare-kernels tr.kernel-delta",
    );
    assert!(
        !rows.is_empty(),
        "no insight or kernel rows: {}",
        b.page_text()
    );
    save_shot("compare.png", &b.screenshot_full(8000));
}

/// The hostile session's pages show its strings as text and run nothing.
#[test]
fn browser_hostile_session_runs_no_script() {
    let Some(b) = browser() else { return };
    let f = fixture();
    login(&b, &f, &f.a_rd);
    // The list shows it (its command line holds the strings).
    assert_inert(&b);
    b.goto(&format!("{}/sessions/{}", f.url, enc(HOSTILE_ID)));
    assert_no_error(&b);
    assert_inert(&b);
    let text = b.page_text();
    assert!(text.contains(SCRIPT), "{text}");
    assert!(text.contains("<img src=x onerror="), "{text}");
    // Its chip shows the hostile path and leads to the line.
    let chip = b.find("#insight-list .card[data-category=\"SYNCHRONIZATION\"] a.chip");
    assert_eq!(
        b.attr(&chip, "title")
            .as_deref()
            .map(|t| t.contains(SCRIPT)),
        Some(true),
        "the chip's title is not the hostile path"
    );
    let shown = b.text(&chip);
    assert!(shown.ends_with(&format!(":{HOSTILE_LINE}")), "{shown}");
    b.click_nav(&chip);
    assert!(
        b.current_path()
            .starts_with(&format!("/sessions/{}/line?", enc(HOSTILE_ID))),
        "{}",
        b.current_url()
    );
    assert_no_error(&b);
    assert_inert(&b);
    let title = b.text(&b.find("h1#line-title"));
    assert!(title.contains(SCRIPT), "{title}");
    let text = b.page_text();
    assert!(text.contains(&hostile_func()), "{text}");
    save_shot("hostile.png", &b.screenshot());
    let k = b.find("section#line-kernels tr.kernel a.kernel-link");
    b.click_nav(&k);
    assert!(
        b.current_path()
            .starts_with(&format!("/sessions/{}/kernel?", enc(HOSTILE_ID))),
        "{}",
        b.current_url()
    );
    assert_no_error(&b);
    assert_inert(&b);
    let title = b.text(&b.find("h1#kernel-title"));
    assert!(title.contains(SCRIPT), "{title}");
    b.find("#kernel-config");
    // The pages asked for directly (the URLs the plain tests use).
    for u in hostile_pages(&f) {
        b.goto(&u);
        assert_no_error(&b);
        assert_inert(&b);
        assert!(b.page_text().contains(SCRIPT), "{u}");
    }
}

/// With project A's key, project B's session, line and kernel pages are "Not found", and B's
/// session is not on A's list.
#[test]
fn browser_a_key_cannot_open_project_b() {
    let f = fixture();
    // B's own pages, with B's key: they exist.
    let (_, ins) = api(
        &f.url,
        &f.b_rd,
        &format!("/api/v1/sessions/{}/insights", f.b_id),
    );
    let loc = ins["insights"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["location"]["file"].is_string()))
        .map(|i| i["location"].clone())
        .expect("an insight with a line in B's session");
    let (_, ks) = api(
        &f.url,
        &f.b_rd,
        &format!("/api/v1/sessions/{}/kernels", f.b_id),
    );
    let kname = ks["kernels"][0]["name"]
        .as_str()
        .expect("a kernel")
        .to_string();
    let bid = enc(&f.b_id);
    let b_pages = [
        format!("/sessions/{bid}"),
        format!(
            "/sessions/{bid}/line?file={}&line={}",
            enc(loc["file"].as_str().unwrap()),
            loc["line"]
        ),
        format!("/sessions/{bid}/kernel?name={}&device=0", enc(&kname)),
    ];
    for p in &b_pages {
        let page = http("GET", &format!("{}{p}", f.url), Some(&f.b_rd), None);
        assert_eq!(page.status, 200, "{p} with B's key: {}", page.body);
        let page = http("GET", &format!("{}{p}", f.url), Some(&f.a_rd), None);
        assert_eq!(page.status, 404, "{p} with A's key");
    }
    let Some(b) = browser() else { return };
    login(&b, &f, &f.a_rd);
    let list = b.page_text();
    assert!(!list.contains(&f.b_id), "B's session on A's list");
    let html = b
        .exec("return document.documentElement.outerHTML;", vec![])
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!html.contains(&f.b_id), "B's session id in A's list");
    for p in &b_pages {
        b.goto(&format!("{}{p}", f.url));
        let t = b.text(&b.find("#error-title"));
        assert_eq!(t, "Not found", "{p}");
        for shown in ["session-title", "line-title", "kernel-title"] {
            assert!(b.try_find(&format!("#{shown}")).is_err(), "{p}: #{shown}");
        }
    }
    // The compare page does not take B's session either.
    b.goto(&format!(
        "{}/compare?a={}&b={bid}",
        f.url,
        enc(f.id("cpp_api-639-"))
    ));
    assert_eq!(b.text(&b.find("#error-title")), "Not found");
}

/// Logging out forgets the key: the next page is the login form.
#[test]
fn browser_logout_returns_to_the_login_form() {
    let Some(b) = browser() else { return };
    let f = fixture();
    login(&b, &f, &f.a_rd);
    b.find("#project");
    let out: Element = b.find("form.logout button");
    b.click_nav(&out);
    assert!(
        b.current_path().starts_with("/login"),
        "{}",
        b.current_url()
    );
    b.goto(&format!("{}/sessions/{}", f.url, enc(f.id("cpp_api-639-"))));
    assert!(
        b.current_path().starts_with("/login"),
        "{}",
        b.current_url()
    );
}
