//! One number, one meaning (issue 37): for every bundled session (testdata/sessions) and every
//! rank of every bundled run (testdata/runs), the headline figures — wall, GPU busy, kernels,
//! syncs, host blocked (in syncs, in blocking copies), GPU idle, low chunks — are the same, under
//! the same names, in `gpufl report` (its header line), `gpufl report --json` (its `headline`),
//! `gpufl info` and the dashboard's session page (a server started in-process, as the server's
//! own tests do; the headline boxes parsed from the page's HTML).

mod common;

use gpufl_analysis::headline::names;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every bundled session directory: testdata/sessions/* and testdata/runs/*/*.
fn all_sessions() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut sub = |d: &Path| {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| gpufl_trace::session::is_session_dir(p))
            .collect();
        v.sort();
        out.extend(v);
    };
    let root = common::root();
    sub(&root.join("testdata/sessions"));
    let mut runs: Vec<PathBuf> = std::fs::read_dir(root.join("testdata/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    for r in &runs {
        sub(r);
    }
    out
}

/// A server started from gpufl-server's library on a loopback port, on a thread and runtime of
/// its own, stopped when dropped; a project of its database (upload key, read key); uploads as
/// `gpufl upload` does them.
mod srv {
    use gpufl_server::auth::{self, KeyKind};
    use gpufl_server::ServeConfig;
    use serde_json::Value;
    use std::path::{Path, PathBuf};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    pub struct Server {
        pub url: String,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<JoinHandle<()>>,
    }

    impl Server {
        pub fn start(cfg: &ServeConfig) -> Server {
            let mut cfg = cfg.clone();
            cfg.listen = "127.0.0.1:0".into();
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let rt = gpufl_server::runtime().expect("a runtime");
                let r = rt.block_on(async move {
                    let ready = move |addr| {
                        let _ = addr_tx.send(addr);
                    };
                    tokio::select! {
                        r = gpufl_server::serve_with(cfg, ready) => r,
                        _ = stop_rx => Ok(()),
                    }
                });
                rt.shutdown_background();
                if let Err(e) = r {
                    eprintln!("gpufl serve (in-process): {e}");
                }
            });
            let addr = addr_rx
                .recv()
                .expect("the server stopped before it listened");
            Server {
                url: format!("http://{addr}"),
                stop: Some(stop_tx),
                thread: Some(thread),
            }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// SQLite and a local directory under a fresh temporary directory.
    pub fn sqlite_config(tag: &str) -> ServeConfig {
        let d = std::env::temp_dir().join(format!(
            "gpufl-headline-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        let mut cfg = ServeConfig::new(d);
        cfg.rate_per_key = 0.0;
        cfg
    }

    pub fn project(cfg: &ServeConfig, name: &str) -> (String, String) {
        let rt = gpufl_server::runtime().unwrap();
        rt.block_on(async {
            let db = gpufl_server::store::Db::open(&cfg.db_url()).await.unwrap();
            let (_, keys) = auth::create_project(&db, name).await.unwrap();
            let key = |kind| {
                keys.iter()
                    .find(|k| k.kind == kind)
                    .map(|k| k.secret.clone())
                    .unwrap()
            };
            (key(KeyKind::Upload), key(KeyKind::Read))
        })
    }

    pub fn upload(url: &str, key: &str, dirs: &[PathBuf]) {
        let sessions = gpufl_upload::find_sessions(dirs).unwrap();
        let up = gpufl_upload::Uploader::new(&gpufl_upload::UploadOptions::new(url, key)).unwrap();
        for d in &sessions {
            up.upload(d, &mut |_| {})
                .unwrap_or_else(|e| panic!("uploading {}: {e}", d.display()));
        }
    }

    /// Wait until every listed session is analysed.
    pub fn wait_ready(url: &str, key: &str, ids: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let body = ureq::get(&format!("{url}/api/v1/sessions?limit=1000"))
                .set("Authorization", &format!("Bearer {key}"))
                .call()
                .unwrap()
                .into_string()
                .unwrap();
            let v: Value = serde_json::from_str(&body).unwrap();
            let ready = |id: &str| {
                v["sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s["id"] == id && s["ingest"] == "ready")
            };
            if ids.iter().all(|id| ready(id)) {
                return;
            }
            assert!(Instant::now() < deadline, "not analysed after 600 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn id_of(dir: &Path) -> String {
        dir.file_name().unwrap().to_str().unwrap().to_string()
    }
}

fn gpufl(args: &[&str]) -> String {
    let o = Command::new(common::GPUFL).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "gpufl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Figures by name, as a view shows them.
type Figures = BTreeMap<String, String>;

/// The headline line of `gpufl report` / `gpufl info`: `wall 1.61s · GPU busy 2.7% · 8256
/// kernels · 194 syncs · host blocked 1.72ms (in syncs 1.72ms, in blocking copies 0ns) · GPU
/// idle 1.57s · 30 of 30 chunks under 50 % busy`, by name. The line itself is returned too.
fn text_figures(out: &str) -> (String, Figures) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("  {} ", names::WALL)))
        .unwrap_or_else(|| panic!("no headline line in\n{out}"))
        .trim()
        .to_string();
    let mut f = Figures::new();
    for part in line.split(" · ") {
        let part = part
            .trim_end_matches(" of observed")
            .trim_end_matches(" in windows");
        if let Some(rest) = part.strip_prefix(&format!("{} ", names::HOST_BLOCKED)) {
            // host blocked X (in syncs Y, in blocking copies Z)
            let (total, inner) = rest.split_once(" (").unwrap();
            f.insert(names::HOST_BLOCKED.into(), total.into());
            for p in inner.trim_end_matches(')').split(", ") {
                let (k, v) = p.rsplit_once(' ').unwrap();
                f.insert(k.into(), v.into());
            }
        } else if let Some(v) = part.strip_suffix(&format!(" {}", names::LOW_CHUNKS)) {
            f.insert(names::LOW_CHUNKS.into(), v.into());
        } else if let Some(v) = part.strip_suffix(&format!(" {}", names::KERNELS)) {
            f.insert(names::KERNELS.into(), v.into());
        } else if let Some(v) = part.strip_suffix(&format!(" {}", names::SYNCS)) {
            f.insert(names::SYNCS.into(), v.into());
        } else {
            let (k, v) = part.rsplit_once(' ').unwrap();
            f.insert(k.into(), v.into());
        }
    }
    (line, f)
}

/// The figures of a `headline` JSON object, formatted as every view prints them.
fn json_figures(h: &Value) -> Figures {
    let ns = |k: &str| gpufl_analysis::fmt_duration(h[k].as_u64().unwrap());
    let mut f = Figures::new();
    f.insert(names::WALL.into(), ns("wall_ns"));
    f.insert(
        names::GPU_BUSY.into(),
        gpufl_analysis::headline::fmt_pct(h["gpu_busy_pct"].as_f64().unwrap()),
    );
    f.insert(names::KERNELS.into(), h["kernels"].to_string());
    f.insert(names::SYNCS.into(), h["syncs"].to_string());
    f.insert(names::HOST_BLOCKED.into(), ns("host_blocked_ns"));
    f.insert(names::IN_SYNCS.into(), ns("sync_blocked_ns"));
    f.insert(names::IN_BLOCKING_COPIES.into(), ns("copy_blocked_ns"));
    let devices = h["devices"].as_array().unwrap();
    if !devices.is_empty() {
        f.insert(names::GPU_IDLE.into(), ns("gpu_idle_ns"));
    }
    let sum = |k: &str| devices.iter().map(|d| d[k].as_u64().unwrap()).sum::<u64>();
    if sum("chunks") > 0 {
        f.insert(
            names::LOW_CHUNKS.into(),
            format!("{} of {}", sum("low_chunks"), sum("chunks")),
        );
    }
    // The definitions: host blocked is the sum of its parts, GPU idle of the devices'.
    assert_eq!(
        h["host_blocked_ns"].as_u64(),
        Some(h["sync_blocked_ns"].as_u64().unwrap() + h["copy_blocked_ns"].as_u64().unwrap())
    );
    assert_eq!(h["gpu_idle_ns"].as_u64(), Some(sum("idle_ns")));
    f
}

/// The session page's headline boxes (`<section id="headline">`: value, then name), by name.
fn page_figures(html: &str) -> Figures {
    let start = html
        .find("<section id=\"headline\"")
        .expect("a headline section");
    let end = start + html[start..].find("</section>").unwrap();
    let sec = &html[start..end];
    let mut f = Figures::new();
    let mut rest = sec;
    while let Some(i) = rest.find("<div class=\"v") {
        rest = &rest[i..];
        let v0 = rest.find('>').unwrap() + 1;
        let v1 = rest.find("</div>").unwrap();
        let value = rest[v0..v1].to_string();
        let k0 = rest.find("<div class=\"k\">").unwrap() + "<div class=\"k\">".len();
        let k1 = k0 + rest[k0..].find("</div>").unwrap();
        f.insert(unescape(&rest[k0..k1]), unescape(&value));
        rest = &rest[k1..];
    }
    f
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

#[test]
fn the_headline_figures_are_equal_in_report_json_info_and_the_dashboard() {
    let dirs = all_sessions();
    assert!(dirs.len() > 40, "{} bundled sessions", dirs.len());
    let cfg = srv::sqlite_config("headline");
    let (up, rd) = srv::project(&cfg, "headline");
    let server = srv::Server::start(&cfg);
    srv::upload(&server.url, &up, &dirs);
    let ids: Vec<String> = dirs.iter().map(|d| srv::id_of(d)).collect();
    srv::wait_ready(&server.url, &rd, &ids);
    let mut checked = 0;
    for (dir, id) in dirs.iter().zip(&ids) {
        let d = dir.to_str().unwrap();
        let json: Value =
            serde_json::from_str(&gpufl(&["report", "--json", "--no-run", d])).unwrap();
        let h = &json["sessions"][0]["headline"];
        assert!(h.is_object(), "{d}: no headline in --json");
        let want = json_figures(h);
        let (report_line, report) =
            text_figures(&gpufl(&["report", "--color", "never", "--no-run", d]));
        let (info_line, info) = text_figures(&gpufl(&["info", d]));
        assert_eq!(report, want, "{d}: report's header vs --json");
        assert_eq!(info_line, report_line, "{d}: info vs report");
        assert_eq!(info, want, "{d}: info vs --json");
        let html = ureq::get(&format!("{}/sessions/{id}", server.url))
            .set("Authorization", &format!("Bearer {rd}"))
            .call()
            .unwrap_or_else(|e| panic!("{id}: {e}"))
            .into_string()
            .unwrap();
        let mut page = page_figures(&html);
        page.remove("top severity");
        // The page's host blocked box names its parts in its tooltip; the text and JSON figures
        // of the parts are compared above.
        let mut want_page = want.clone();
        want_page.remove(names::IN_SYNCS);
        want_page.remove(names::IN_BLOCKING_COPIES);
        assert_eq!(page, want_page, "{d}: dashboard vs --json");
        checked += 1;
    }
    assert_eq!(checked, dirs.len());
    // A blocking copy is host blocked time, not 0 beside a finding that says it blocked: the
    // blocking_copy session has no syncs and 20 blocking cudaMemcpy calls.
    let bc = dirs
        .iter()
        .find(|d| srv::id_of(d).starts_with("blocking_copy-"))
        .unwrap();
    let json: Value =
        serde_json::from_str(&gpufl(&["report", "--json", bc.to_str().unwrap()])).unwrap();
    let h = &json["sessions"][0]["headline"];
    assert_eq!(h["syncs"], 0);
    assert_eq!(h["blocking_copies"], 20);
    assert!(h["host_blocked_ns"].as_u64().unwrap() > 10_000_000, "{h}");
}

#[test]
fn the_low_chunk_count_is_the_low_utilization_findings_count() {
    // The header's "N of 30 chunks under 50 % busy" and rule low-utilization's title count the
    // same chunks (one-off pauses left out), for every session where the rule fires.
    let mut fired = 0;
    for dir in all_sessions() {
        let d = dir.to_str().unwrap();
        let json: Value =
            serde_json::from_str(&gpufl(&["report", "--json", "--no-run", d])).unwrap();
        let s = &json["sessions"][0];
        let all: Vec<&Value> = s["insights"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|i| std::iter::once(i).chain(i["facets"].as_array().into_iter().flatten()))
            .filter(|i| i["rule"] == "low-utilization")
            .collect();
        for i in all {
            let dev = &i["data"]["device"];
            let hd = s["headline"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| &x["device"] == dev)
                .unwrap();
            assert_eq!(i["data"]["counted_chunks"], hd["low_chunks"], "{d}");
            assert_eq!(i["data"]["low_chunks"], hd["low_chunks"], "{d}");
            let title = i["title"].as_str().unwrap();
            let want = format!("{} of {} chunks", hd["low_chunks"], hd["chunks"]);
            assert!(title.contains(&want), "{d}: {title} vs {want}");
            fired += 1;
        }
    }
    assert!(fired >= 10, "low-utilization fired {fired} times");
}
