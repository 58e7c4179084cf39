//! Runs on the dashboard (issue 37): an uploaded run directory (testdata/runs: the sessions of one
//! torchrun, two ranks and the launcher) is one run. On SQLite and on PostgreSQL (+ S3, where
//! `GPUFL_TEST_PG_URL` / `GPUFL_TEST_S3` name them): the run page shows every session of the run
//! side by side, each linking to its session page with its top finding, and the cross-rank
//! findings that gpufl-analysis's run analysis gives over the same sessions (computed here
//! through the library, as `gpufl report DIR` does); the sessions list shows the run as one row
//! linking to the run page; the stored run analysis over more members is not replaced by one over
//! fewer.

mod common;
mod webdriver;

use common::{id_of, root, Server};
use gpufl_analysis::{analyze_on, analyze_run, Analysis, Config, Model, RunMember};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn run_dir() -> PathBuf {
    root().join("testdata/runs/run-torchrun-1492-20261127T195712Z")
}

fn members(run: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| gpufl_trace::session::is_session_dir(p))
        .collect();
    v.sort();
    v
}

/// The run analysis's cross-rank insight titles, as `gpufl report DIR` computes them.
fn expected_titles(dirs: &[PathBuf]) -> Vec<String> {
    let cfg = Config::default();
    let loaded: Vec<(String, Model, Analysis)> = dirs
        .iter()
        .map(|d| {
            let mut r = gpufl_trace::ParSessionReader::open(d, 2).unwrap();
            let mut m = Model::load_items(&mut r);
            m.add_warnings(r.warnings());
            let a = analyze_on(&m, &cfg, 2);
            (id_of(d), m, a)
        })
        .collect();
    let members: Vec<RunMember> = loaded
        .iter()
        .map(|(n, m, a)| RunMember {
            name: n.clone(),
            model: m,
            analysis: a,
        })
        .collect();
    analyze_run(&members, &cfg)
        .insights
        .iter()
        .map(|i| i.title.clone())
        .collect()
}

fn html(url: &str, key: &str, path: &str) -> (u16, String) {
    match ureq::get(&format!("{url}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .call()
    {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{path}: {e}"),
    }
}

fn unescape(s: &str) -> String {
    s.replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#38;", "&")
        .replace("&amp;", "&")
}

#[test]
fn an_uploaded_run_is_one_run_with_ranks_side_by_side_and_cross_rank_findings() {
    let run = run_dir();
    let run_id = id_of(&run);
    let dirs = members(&run);
    assert_eq!(dirs.len(), 3, "{dirs:?}");
    let want = expected_titles(&dirs);
    for cfg in common::backends("runs", true) {
        let (up, rd) = common::project(&cfg, "runs");
        let server = Server::start(&cfg);
        let url = server.url.clone();
        common::upload(&url, &up, std::slice::from_ref(&run));
        let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
        common::wait_ready(&url, &rd, ids.iter());
        // The run analysis follows the last member's ingest: wait until it covers all three.
        let path = format!("/runs/{}", gpufl_server::web::url_encode(&run_id));
        let deadline = Instant::now() + Duration::from_secs(120);
        let page = loop {
            let (st, body) = html(&url, &rd, &path);
            assert_eq!(st, 200, "{body}");
            if body.contains("over 3 of its 3 sessions") {
                break unescape(&body);
            }
            assert!(Instant::now() < deadline, "no run analysis over 3: {body}");
            std::thread::sleep(Duration::from_millis(200));
        };
        // Every session side by side, linked, with its top finding.
        for id in &ids {
            assert!(
                page.contains(&format!("href=\"/sessions/{id}\"")),
                "{id} not linked from the run page"
            );
            let (_, v) = common::get(&url, &rd, &format!("/api/v1/sessions/{id}"));
            let top = v["top_insight"].as_str().unwrap_or("");
            if !top.is_empty() {
                assert!(page.contains(top), "{id}'s top finding {top:?} missing");
            }
        }
        assert!(
            page.contains(">rank 0<") && page.contains(">rank 1<"),
            "{page}"
        );
        // The cross-rank findings, those of gpufl-analysis's run analysis.
        assert!(!want.is_empty(), "the bundled run has cross-rank findings");
        for t in &want {
            assert!(
                page.contains(t.as_str()),
                "cross-rank finding {t:?} missing"
            );
        }
        assert_eq!(
            page.matches("<div class=\"card ").count(),
            want.len(),
            "one card per cross-rank finding"
        );
        // The sessions list: one row for the run, no row of its own for its sessions.
        let (_, list) = html(&url, &rd, "/sessions");
        assert_eq!(
            list.matches("<tr class=\"session run\"").count(),
            1,
            "{list}"
        );
        assert!(list.contains(&format!("href=\"{path}\"")), "{list}");
        for id in &ids {
            assert!(
                !list.contains(&format!("<tr class=\"session\" data-id=\"{id}\"")),
                "{id} listed on its own"
            );
        }
        if cfg.db_url().starts_with("sqlite") {
            screenshot(&url, &rd, &path);
        }
        // An unknown run is a 404 page.
        assert_eq!(html(&url, &rd, "/runs/no-such-run").0, 404);
        // A run analysis over fewer members does not replace the stored one.
        let rt = gpufl_server::runtime().unwrap();
        rt.block_on(async {
            let db = gpufl_server::store::Db::open(&cfg.db_url()).await.unwrap();
            let row = sqlx::query("SELECT project_id FROM sessions WHERE id = $1")
                .bind(&ids[0])
                .fetch_one(&db.pool)
                .await
                .unwrap();
            let project: String = sqlx::Row::get(&row, 0);
            let before = db.run(&project, &run_id).await.unwrap().expect("stored");
            assert_eq!(before.members, 3);
            assert!(!db.save_run(&project, &run_id, 2, "{}").await.unwrap());
            let after = db.run(&project, &run_id).await.unwrap().expect("stored");
            assert_eq!((after.members, after.body), (3, before.body));
        });
        drop(server);
    }
}

/// The run page's screenshot (`run.png` in `$GPUFL_SCREENSHOTS`, else target/dashboard-screenshots)
/// when Chromium is installed (required with `GPUFL_REQUIRE_BROWSER=1`).
fn screenshot(url: &str, key: &str, path: &str) {
    let require = std::env::var("GPUFL_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let b = match webdriver::find_browser().and_then(|(c, d)| webdriver::Browser::start(&c, &d)) {
        Ok(b) => b,
        Err(why) => {
            assert!(!require, "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("no screenshot: {why}");
            return;
        }
    };
    b.goto(&format!("{url}/login"));
    let field = b.find("input[name=key]");
    b.send_keys(&field, key);
    let go = b.find("#login");
    b.click_nav(&go);
    b.goto(&format!("{url}{path}"));
    b.find("table#ranks");
    let png = b.screenshot_full(4000);
    let dir = match std::env::var("GPUFL_SCREENSHOTS") {
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
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.png"), png).unwrap();
    // The sessions list with the run's row open.
    b.goto(&format!("{url}/sessions"));
    b.find("tr.session.run");
}
