//! The session page's first screen tells the answer (issue 37): for every bundled session
//! (testdata/sessions) and every rank of every bundled run (testdata/runs), the first card of the
//! session page is the analysis's first finding — what `gpufl report --json` lists first, computed
//! here through gpufl-analysis as the CLI does — and lies entirely inside a 1400×900 first screen
//! (Chromium over WebDriver, `getBoundingClientRect`). The categories are filters of the one
//! ranked list: each filter link keeps the analysis's order and shows only its category.
//!
//! The HTTP part (order and filters) always runs; the browser part skips without Chromium unless
//! `GPUFL_REQUIRE_BROWSER=1`. Screenshots of each first screen go to target/first-screens.

mod common;
mod webdriver;

use common::{id_of, root, Server};
use gpufl_analysis::{analyze_on, Config, Insight, Model};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use webdriver::Browser;

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
    sub(&root().join("testdata/sessions"));
    let mut runs: Vec<PathBuf> = std::fs::read_dir(root().join("testdata/runs"))
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

/// The analysis's findings of a session, as `gpufl report --json` computes them.
fn findings(dir: &Path) -> Vec<Insight> {
    let mut reader = gpufl_trace::ParSessionReader::open(dir, 2).unwrap();
    let mut model = Model::load_items(&mut reader);
    model.add_warnings(reader.warnings());
    analyze_on(&model, &Config::default(), 2).insights
}

struct Fixture {
    server: Server,
    rd: String,
    /// (session id, the analysis's findings), every bundled session.
    sessions: Vec<(String, Vec<Insight>)>,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let cfg = common::sqlite_config("first");
        let (up, rd) = common::project(&cfg, "first");
        let server = Server::start(&cfg);
        let dirs = all_sessions();
        assert!(dirs.len() > 40, "{} bundled sessions", dirs.len());
        common::upload(&server.url, &up, &dirs);
        let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
        let sessions = dirs.iter().map(|d| (id_of(d), findings(d))).collect();
        common::wait_ready(&server.url, &rd, ids.iter());
        Fixture {
            server,
            rd,
            sessions,
        }
    })
}

fn enc(s: &str) -> String {
    gpufl_server::web::url_encode(s)
}

/// A dashboard page's HTML with the read key.
fn page(f: &Fixture, path: &str) -> String {
    let r = ureq::get(&format!("{}{path}", f.server.url))
        .set("Authorization", &format!("Bearer {}", f.rd))
        .call()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    r.into_string().unwrap()
}

/// Undo the HTML escaping of text.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&#x22;", "\"")
        .replace("&#34;", "\"")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&#38;", "&")
        .replace("&amp;", "&")
}

/// The (rule, category, title) of each card of the findings list, in page order.
fn cards_of(html: &str) -> Vec<(String, String, String)> {
    let list = html
        .split_once("id=\"insight-list\"")
        .map(|x| x.1)
        .unwrap_or("");
    let attr = |s: &str, name: &str| -> String {
        let k = format!("{name}=\"");
        s.split_once(&k)
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(v, _)| unescape(v))
            .unwrap_or_default()
    };
    list.split("<div class=\"card ")
        .skip(1)
        .map(|c| {
            let title = c
                .split_once("<span class=\"title\">")
                .and_then(|(_, r)| r.split_once("</span>"))
                .map(|(t, _)| unescape(t))
                .unwrap_or_default();
            (attr(c, "data-rule"), attr(c, "data-category"), title)
        })
        .collect()
}

/// Every session page lists the analysis's findings in its order (the first card is its first
/// finding), and each category filter lists that category's findings, in the same order.
#[test]
fn the_findings_list_is_the_analysis_order_and_categories_filter_it() {
    let f = fixture();
    let mut with_findings = 0;
    for (id, ins) in &f.sessions {
        let html = page(f, &format!("/sessions/{}", enc(id)));
        let cards = cards_of(&html);
        let want: Vec<(String, String)> = ins
            .iter()
            .take(cards.len().max(1))
            .map(|i| (i.rule.to_string(), i.title.clone()))
            .collect();
        let got: Vec<(String, String)> = cards.iter().map(|c| (c.0.clone(), c.2.clone())).collect();
        if ins.is_empty() {
            assert!(cards.is_empty(), "{id}: cards without findings");
            assert!(html.contains("No insights"), "{id}");
            continue;
        }
        with_findings += 1;
        assert_eq!(
            cards.len(),
            ins.len().min(100),
            "{id}: every finding is a card"
        );
        assert_eq!(
            got, want,
            "{id}: the cards are the analysis's findings in its order"
        );
        // Each category's filter: its findings only, in the analysis's order.
        let mut cats: Vec<&str> = Vec::new();
        for c in &cards {
            if !cats.contains(&c.1.as_str()) {
                cats.push(&c.1);
            }
        }
        for cat in cats {
            let href = format!("/sessions/{}?category={}", enc(id), enc(cat));
            assert!(
                html.contains(&format!("href=\"{}#insights\"", href.replace('&', "&amp;"))),
                "{id}: no filter link {href}"
            );
            let only = cards_of(&page(f, &href));
            let want: Vec<&(String, String, String)> =
                cards.iter().filter(|c| c.1 == cat).collect();
            assert_eq!(only.iter().collect::<Vec<_>>(), want, "{id} {cat}");
        }
    }
    assert!(with_findings > 30, "{with_findings} sessions with findings");
}

/// In Chromium at 1400×900: the first card is the analysis's first finding and lies entirely
/// inside the first screen, for every bundled session and run.
#[test]
fn browser_the_top_finding_is_on_the_first_screen() {
    let Some(b) = browser() else { return };
    let f = fixture();
    let shots = root().join("target/first-screens");
    std::fs::create_dir_all(&shots).unwrap();
    b.goto(&format!("{}/login", f.server.url));
    let field = b.find("input[name=key]");
    b.send_keys(&field, &f.rd);
    let go = b.find("#login");
    b.click_nav(&go);
    // The viewport (not the window) 1400×900.
    b.set_window_size(1400, 900);
    let chrome = b.exec(
        "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];",
        vec![],
    );
    let dw = chrome[0].as_u64().unwrap_or(0) as u32;
    let dh = chrome[1].as_u64().unwrap_or(0) as u32;
    b.set_window_size(1400 + dw, 900 + dh);
    let mut failures = Vec::new();
    for (id, ins) in &f.sessions {
        b.goto(&format!("{}/sessions/{}", f.server.url, enc(id)));
        let v = b.exec(
            "window.scrollTo(0, 0); \
             const c = document.querySelector('#insight-list .card'); \
             if (!c) return null; \
             const r = c.getBoundingClientRect(); \
             return {rule: c.dataset.rule, title: c.querySelector('.title').innerText, \
                     top: r.top, bottom: r.bottom, left: r.left, right: r.right, \
                     w: window.innerWidth, h: window.innerHeight};",
            vec![],
        );
        let Some(first) = ins.first() else {
            assert!(v.is_null(), "{id}: a card without findings: {v}");
            continue;
        };
        assert_eq!(v["w"], 1400, "{id}: viewport {v}");
        assert_eq!(v["h"], 900, "{id}: viewport {v}");
        assert_eq!(v["rule"], first.rule, "{id}: {v}");
        assert_eq!(v["title"].as_str(), Some(first.title.as_str()), "{id}: {v}");
        let inside = v["top"].as_f64().unwrap_or(-1.0) >= 0.0
            && v["left"].as_f64().unwrap_or(-1.0) >= 0.0
            && v["bottom"].as_f64().unwrap_or(1e9) <= 900.0
            && v["right"].as_f64().unwrap_or(1e9) <= 1400.0;
        std::fs::write(shots.join(format!("{id}.png")), b.screenshot()).unwrap();
        if !inside {
            failures.push(format!("{id}: {v}"));
        }
    }
    assert!(
        failures.is_empty(),
        "first card not inside the 1400×900 first screen:\n{}",
        failures.join("\n")
    );
}

fn browser() -> Option<Browser> {
    let require = std::env::var("GPUFL_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let started = webdriver::find_browser().and_then(|(c, d)| Browser::start(&c, &d));
    match started {
        Ok(b) => Some(b),
        Err(why) => {
            assert!(!require, "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}
