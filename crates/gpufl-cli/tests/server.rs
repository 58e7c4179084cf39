//! `gpufl serve`, `gpufl admin` and `gpufl upload` end to end, as separate processes, on each
//! store: SQLite + a local directory (always), PostgreSQL + a local directory and PostgreSQL +
//! an S3 API server (moto's) when `scripts/services.sh` started them (`GPUFL_TEST_PG_URL`,
//! `GPUFL_TEST_S3` and the `AWS_*` variables; CI sets `GPUFL_REQUIRE_SERVICES=1`, and then a
//! missing service fails the test instead of skipping it). The API's own tests, run on a server
//! started in-process (bad requests, restarts), are crates/gpufl-server/tests/api.rs.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Server, GPUFL};

use common::root;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gpufl-srv-{tag}-{}-{}",
        std::process::id(),
        rand_hex()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rand_hex() -> String {
    let mut b = [0u8; 6];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where a test's server keeps its data.
#[derive(Clone, Copy, Debug)]
enum Backend {
    SqliteLocal,
    PgLocal,
    PgS3,
}

#[derive(Clone, Debug)]
struct Stores {
    data: PathBuf,
    db: Option<String>,
    store: Option<String>,
}

fn require_services() -> bool {
    std::env::var("GPUFL_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// A fresh database and store for one test, or None (skipped) without the service.
fn stores(b: Backend, tag: &str) -> Option<Stores> {
    let data = tmpdir(tag);
    let pg = || -> Option<String> {
        let Ok(base) = std::env::var("GPUFL_TEST_PG_URL") else {
            assert!(!require_services(), "GPUFL_TEST_PG_URL is not set");
            eprintln!("skipped: no PostgreSQL (GPUFL_TEST_PG_URL; scripts/services.sh)");
            return None;
        };
        let name = format!("gpufl_t_{}", rand_hex());
        let out = Command::new("psql")
            .arg(&base)
            .args(["-qc", &format!("CREATE DATABASE {name}")])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let at = base.rfind('/').unwrap();
        Some(format!("{}/{name}", &base[..at]))
    };
    let s3 = || -> Option<String> {
        let Ok(base) = std::env::var("GPUFL_TEST_S3") else {
            assert!(!require_services(), "GPUFL_TEST_S3 is not set");
            eprintln!("skipped: no S3 server (GPUFL_TEST_S3; scripts/services.sh)");
            return None;
        };
        Some(format!("{}/t-{}", base.trim_end_matches('/'), rand_hex()))
    };
    Some(match b {
        Backend::SqliteLocal => Stores {
            data,
            db: None,
            store: None,
        },
        Backend::PgLocal => Stores {
            data,
            db: Some(pg()?),
            store: None,
        },
        Backend::PgS3 => Stores {
            data,
            db: Some(pg()?),
            store: Some(s3()?),
        },
    })
}

fn store_args(s: &Stores) -> Vec<String> {
    let mut a = db_args(s);
    if let Some(st) = &s.store {
        a.extend(["--store".into(), st.clone()]);
    }
    a
}

/// What `gpufl admin` takes: the database only.
fn db_args(s: &Stores) -> Vec<String> {
    let mut a = vec!["--data".to_string(), s.data.display().to_string()];
    if let Some(d) = &s.db {
        a.extend(["--db".into(), d.clone()]);
    }
    a
}

fn serve(s: &Stores, extra: &[&str]) -> Server {
    let mut cmd = Command::new(GPUFL);
    cmd.arg("serve")
        .args(store_args(s))
        .args(["--listen", "127.0.0.1:0"])
        .args(extra);
    common::spawn_serve(cmd)
}

/// (upload key, read key) of a new project.
fn project(s: &Stores, name: &str) -> (String, String) {
    let mut admin = Command::new(GPUFL);
    admin.arg("admin").args(db_args(s));
    common::create_project(admin, name)
}

fn upload(url: &str, key: &str, dirs: &[PathBuf]) -> std::process::Output {
    Command::new(GPUFL)
        .arg("upload")
        .args(dirs)
        .args(["--server", url, "--api-key", key])
        .output()
        .unwrap()
}

fn get(url: &str, key: &str, path: &str) -> (u16, Value) {
    let r = ureq::get(&format!("{url}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .call();
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    let status = resp.status();
    let body = resp.into_string().unwrap_or_default();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Every bundled session directory (a directory holding trace files).
fn bundled() -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        let mut has = false;
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("trace-") && n.ends_with(".ndjson.zst"))
            {
                has = true;
            }
        }
        if has {
            out.push(d.to_path_buf());
        }
    }
    walk(&root().join("testdata"), &mut out);
    out.sort();
    out
}

/// `gpufl info`'s kernel count of a session directory (its headline line: `wall 1.28s · GPU busy
/// 1.4% · 114 kernels · …`).
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

/// Wait until every listed session is analysed; their summaries by id.
fn wait_ready(url: &str, rd: &str, ids: &[String]) -> std::collections::BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (st, v) = get(url, rd, "/api/v1/sessions?limit=1000");
        assert_eq!(st, 200, "{v}");
        let all: std::collections::BTreeMap<String, Value> = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["id"].as_str().unwrap().to_string(), s.clone()))
            .collect();
        let pending: Vec<&String> = ids
            .iter()
            .filter(|id| {
                !all.get(*id)
                    .is_some_and(|s| s["ingest"] == "ready" || s["ingest"] == "corrupt")
            })
            .collect();
        if pending.is_empty() {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "not analysed after 300 s: {pending:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bundled session whose directory name starts with `prefix`.
fn bundled_one(prefix: &str) -> PathBuf {
    bundled()
        .into_iter()
        .find(|d| id_of(d).starts_with(prefix))
        .unwrap_or_else(|| panic!("no bundled session {prefix}*"))
}

/// Wait until session `id` has been analysed `n` times and is ready; its detail.
fn wait_analysed(url: &str, rd: &str, id: &str, n: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = get(url, rd, &format!("/api/v1/sessions/{id}"));
        if v["analyses"] == n && v["ingest"] == "ready" {
            return v;
        }
        assert!(Instant::now() < deadline, "not analysed {n} times: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn id_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

/// Each bundled session arrives once, analysed, with `gpufl info`'s kernel count; uploading
/// them all again stores nothing new and analyses nothing again; the raw files read back equal.
fn uploads_every_bundled_session_once(b: Backend) {
    let Some(s) = stores(b, "all") else { return };
    let srv = serve(&s, &["--rate-limit", "0"]);
    let (up, rd) = project(&s, "team");
    let dirs = bundled();
    assert!(dirs.len() >= 30, "{} bundled sessions", dirs.len());
    let out = upload(&srv.url, &up, &dirs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    let all = wait_ready(&srv.url, &rd, &ids);
    for d in &dirs {
        let v = &all[&id_of(d)];
        assert_eq!(v["ingest"], "ready", "{v}");
        assert_eq!(
            v["kernels"].as_i64().unwrap(),
            info_kernels(d),
            "{}",
            d.display()
        );
    }
    let again = upload(&srv.url, &up, &dirs);
    assert!(again.status.success());
    for id in &ids {
        let (st, v) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert_eq!(st, 200);
        assert_eq!(v["analyses"], 1, "{id} analysed {} times", v["analyses"]);
    }
    // The list's filters: by app, by host, by start time and by severity.
    let list = |q: &str| -> Vec<Value> {
        let (st, v) = get(&srv.url, &rd, &format!("/api/v1/sessions?limit=1000&{q}"));
        assert_eq!(st, 200, "{q}: {v}");
        v["sessions"].as_array().unwrap().clone()
    };
    let every: Vec<Value> = all.values().cloned().collect();
    let cpp = list("app=cpp_api");
    assert!(!cpp.is_empty() && cpp.iter().all(|s| s["app"] == "cpp_api"));
    assert_eq!(
        cpp.len(),
        every.iter().filter(|s| s["app"] == "cpp_api").count()
    );
    let host = every[0]["host"].as_str().unwrap().to_string();
    assert_eq!(
        list(&format!("host={host}")).len(),
        every.iter().filter(|s| s["host"] == host.as_str()).count()
    );
    let starts: Vec<i64> = every
        .iter()
        .map(|s| s["start_unix_ns"].as_i64().unwrap())
        .collect();
    let mid = {
        let mut v = starts.clone();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let later = list(&format!("since={mid}"));
    assert_eq!(later.len(), starts.iter().filter(|&&t| t >= mid).count());
    assert!(
        later
            .windows(2)
            .all(|w| w[0]["start_unix_ns"].as_i64() >= w[1]["start_unix_ns"].as_i64()),
        "newest first"
    );
    assert_eq!(
        list(&format!("until={mid}")).len(),
        starts.iter().filter(|&&t| t < mid).count()
    );
    let high = list("severity=high");
    assert!(!high.is_empty() && high.iter().all(|s| s["top_severity"] == "HIGH"));
    let medium = list("severity=medium");
    assert!(medium.len() > high.len());
    assert!(medium
        .iter()
        .all(|s| s["top_severity"] == "HIGH" || s["top_severity"] == "MEDIUM"));
    let (_, page) = get(&srv.url, &rd, "/api/v1/sessions?limit=5&offset=2");
    assert_eq!(page["sessions"].as_array().unwrap().len(), 5);
    // The line detail of the C++ session's event sync, located by its insight.
    let d = dirs
        .iter()
        .find(|d| id_of(d).starts_with("cpp_api"))
        .unwrap();
    let (_, ins) = get(
        &srv.url,
        &rd,
        &format!("/api/v1/sessions/{}/insights", id_of(d)),
    );
    let sync = ins["insights"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| {
            // The loop's syncs: a sync-attribution, headline or a facet of the finding at its
            // line (one finding per line and cause).
            i["rule"] == "sync-attribution" && i["count"] == 20
                || i["facets"].as_array().is_some_and(|f| {
                    f.iter()
                        .any(|f| f["rule"] == "sync-attribution" && f["count"] == 20)
                })
        })
        .expect("a finding with the loop's sync-attribution");
    assert_eq!(sync["category"], "SYNCHRONIZATION");
    let (file, line) = (
        sync["location"]["file"].as_str().unwrap(),
        sync["location"]["line"].as_i64().unwrap(),
    );
    let (st, detail) = get(
        &srv.url,
        &rd,
        &format!(
            "/api/v1/sessions/{}/lines?file={file}&line={line}",
            id_of(d)
        ),
    );
    assert_eq!(st, 200, "{detail}");
    let act = &detail["activity"][0];
    assert_eq!(act["syncs"], 20, "{detail}");
    assert!(act["stack"].as_array().unwrap().len() >= 3, "{detail}");
    assert!(!detail["insights"].as_array().unwrap().is_empty());
    // The raw file of one session, byte for byte.
    let raw = ureq::get(&format!(
        "{}/api/v1/sessions/{}/files/trace-0000.ndjson.zst",
        srv.url,
        id_of(d)
    ))
    .set("Authorization", &format!("Bearer {rd}"))
    .call()
    .unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut raw.into_reader(), &mut bytes).unwrap();
    assert_eq!(
        bytes,
        std::fs::read(d.join("trace-0000.ndjson.zst")).unwrap()
    );
}

#[test]
fn uploads_every_bundled_session_once_sqlite_local() {
    uploads_every_bundled_session_once(Backend::SqliteLocal);
}

#[test]
fn uploads_every_bundled_session_once_postgres_local() {
    uploads_every_bundled_session_once(Backend::PgLocal);
}

#[test]
fn uploads_every_bundled_session_once_postgres_s3() {
    uploads_every_bundled_session_once(Backend::PgS3);
}

/// A session of ~10 MiB (3 parts) whose strings are random: a file too big to send in one part.
fn big_session(root: &Path) -> PathBuf {
    use gpufl_trace::{Header, TraceWriter};
    let name = format!("big-4242-{}", rand_hex());
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let header = Header {
        session_id: name.clone(),
        app_name: "big".into(),
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    for _ in 0..220 {
        let mut b = [0u8; 48 << 10];
        std::io::Read::read_exact(&mut f, &mut b).unwrap();
        let s: String = b.iter().map(|x| format!("{x:02x}")).collect();
        w.intern_str(&s).unwrap();
        w.end_block().unwrap();
    }
    w.finish(1, "test").unwrap();
    let size = std::fs::metadata(dir.join("trace-0000.ndjson.zst"))
        .unwrap()
        .len();
    assert!(size > 8 << 20, "{size}");
    dir
}

/// The server is killed (SIGKILL) while an upload is under way, then started again on the same
/// data: uploading again completes every session, each stored once, the big file byte for byte.
fn a_server_killed_mid_upload_loses_nothing(b: Backend) {
    let Some(s) = stores(b, "kill") else { return };
    let (up, rd) = project(&s, "team");
    let big = big_session(&s.data);
    let mut dirs = vec![big.clone()];
    dirs.extend(bundled());
    let srv = serve(&s, &["--rate-limit", "0"]);
    let mut client = Command::new(GPUFL)
        .arg("upload")
        .args(&dirs)
        .args(["--server", &srv.url, "--api-key", &up])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once part of the big file is there and its upload is not complete.
    let big_id = id_of(&big);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = get(&srv.url, &up, &format!("/api/v1/uploads/{big_id}"));
        let parts = v["files"]
            .as_array()
            .map(|f| {
                f.iter()
                    .map(|f| f["parts"].as_array().unwrap().len())
                    .sum::<usize>()
            })
            .unwrap_or(0);
        if parts >= 1 && v["state"] == "uploading" {
            break;
        }
        assert!(Instant::now() < deadline, "no part arrived: {v}");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(srv);
    let st = client.wait().unwrap();
    assert!(
        !st.success(),
        "the upload cannot have succeeded against a dead server"
    );
    let srv = serve(&s, &["--rate-limit", "0"]);
    let out = upload(&srv.url, &up, &dirs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    let all = wait_ready(&srv.url, &rd, &ids);
    assert_eq!(all.len(), ids.len());
    for d in &dirs[1..] {
        assert_eq!(all[&id_of(d)]["kernels"].as_i64().unwrap(), info_kernels(d));
    }
    let raw = ureq::get(&format!(
        "{}/api/v1/sessions/{big_id}/files/trace-0000.ndjson.zst",
        srv.url
    ))
    .set("Authorization", &format!("Bearer {rd}"))
    .call()
    .unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut raw.into_reader(), &mut bytes).unwrap();
    assert!(bytes == std::fs::read(big.join("trace-0000.ndjson.zst")).unwrap());
    for id in &ids {
        let (_, v) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert!(
            v["analyses"].as_i64().unwrap() <= 2,
            "{id}: {}",
            v["analyses"]
        );
    }
}

#[test]
fn a_server_killed_mid_upload_loses_nothing_sqlite_local() {
    a_server_killed_mid_upload_loses_nothing(Backend::SqliteLocal);
}

#[test]
fn a_server_killed_mid_upload_loses_nothing_postgres_s3() {
    a_server_killed_mid_upload_loses_nothing(Backend::PgS3);
}

/// 64 uploads of distinct sessions and 64 of one session, all at once: every session stored and
/// analysed once, kernel counts equal to `gpufl info`'s.
fn concurrent_uploads(b: Backend) {
    let Some(s) = stores(b, "conc") else { return };
    let (up, rd) = project(&s, "team");
    let src = bundled();
    // 64 distinct sessions: the bundled ones under new names.
    let mut distinct = Vec::new();
    for i in 0..64 {
        let from = &src[i % src.len()];
        let to = s.data.join("copies").join(format!("{}-c{i}", id_of(from)));
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        distinct.push((to, from.clone()));
    }
    let one = src
        .iter()
        .find(|d| id_of(d).starts_with("hf_trainer"))
        .unwrap()
        .clone();
    let srv = serve(&s, &["--rate-limit", "0"]);
    let mut kids = Vec::new();
    for (d, _) in &distinct {
        kids.push(
            Command::new(GPUFL)
                .arg("upload")
                .arg(d)
                .args(["--server", &srv.url, "--api-key", &up])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        kids.push(
            Command::new(GPUFL)
                .arg("upload")
                .arg(&one)
                .args(["--server", &srv.url, "--api-key", &up])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut ids: Vec<String> = distinct.iter().map(|(d, _)| id_of(d)).collect();
    ids.push(id_of(&one));
    let all = wait_ready(&srv.url, &rd, &ids);
    for (d, from) in &distinct {
        assert_eq!(
            all[&id_of(d)]["kernels"].as_i64().unwrap(),
            info_kernels(from)
        );
    }
    assert_eq!(
        all[&id_of(&one)]["kernels"].as_i64().unwrap(),
        info_kernels(&one)
    );
    for id in &ids {
        let (_, v) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert_eq!(v["analyses"], 1, "{id}");
    }
}

#[test]
fn concurrent_uploads_sqlite_local() {
    concurrent_uploads(Backend::SqliteLocal);
}

#[test]
fn concurrent_uploads_postgres_s3() {
    concurrent_uploads(Backend::PgS3);
}

/// A backlog uploaded to an instance that does not ingest, then analysed by two instances on
/// the same database and store: every session once (the database's ingest log), none twice.
fn two_instances_share_a_backlog(b: Backend) {
    let Some(s) = stores(b, "two") else { return };
    let (up, rd) = project(&s, "team");
    let dirs = bundled();
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    {
        let api_only = serve(&s, &["--rate-limit", "0", "--ingest-workers", "0"]);
        let out = upload(&api_only.url, &up, &dirs);
        assert!(out.status.success());
        let (_, v) = get(&api_only.url, &rd, "/api/v1/sessions?limit=1000");
        assert!(v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["ingest"] == "pending"));
    }
    let a = serve(&s, &["--rate-limit", "0", "--ingest-workers", "2"]);
    let b2 = serve(&s, &["--rate-limit", "0", "--ingest-workers", "2"]);
    wait_ready(&a.url, &rd, &ids);
    for id in &ids {
        let (_, v) = get(&b2.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert_eq!(v["analyses"], 1, "{id}");
        assert_eq!(v["ingest"], "ready", "{id}");
    }
}

#[test]
fn two_instances_share_a_backlog_sqlite_local() {
    two_instances_share_a_backlog(Backend::SqliteLocal);
}

#[test]
fn two_instances_share_a_backlog_postgres_s3() {
    two_instances_share_a_backlog(Backend::PgS3);
}

/// Project A's keys never reach project B's sessions: every read endpoint answers 404 (as for a
/// session that does not exist), keys of the wrong kind 403; A's upload key lands in A's own
/// project and leaves B's session as it was.
fn keys_reach_their_own_project_only(b: Backend) {
    let Some(s) = stores(b, "keys") else { return };
    let srv = serve(&s, &["--rate-limit", "0"]);
    let (a_up, a_rd) = project(&s, "a");
    let (b_up, b_rd) = project(&s, "b");
    let d = bundled_one("cpp_api");
    let id = id_of(&d);
    assert!(upload(&srv.url, &b_up, std::slice::from_ref(&d))
        .status
        .success());
    wait_ready(&srv.url, &b_rd, std::slice::from_ref(&id));
    let reads = [
        format!("/api/v1/sessions/{id}"),
        format!("/api/v1/sessions/{id}/insights"),
        format!("/api/v1/sessions/{id}/kernels"),
        format!("/api/v1/sessions/{id}/telemetry"),
        format!("/api/v1/sessions/{id}/files"),
        format!("/api/v1/sessions/{id}/files/trace-0000.ndjson.zst"),
        format!("/api/v1/sessions/{id}/lines?file=/work/main/examples/cpp_api.cu&line=19"),
    ];
    for p in &reads {
        assert_eq!(get(&srv.url, &b_rd, p).0, 200, "B's own key on {p}");
        assert_eq!(get(&srv.url, &a_rd, p).0, 404, "A's read key on {p}");
        assert_eq!(get(&srv.url, &a_up, p).0, 403, "A's upload key on {p}");
    }
    let (_, list) = get(&srv.url, &a_rd, "/api/v1/sessions");
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
    // Upload endpoints: a read key is refused; A's upload key sees A's namespace only.
    assert_eq!(
        get(&srv.url, &a_rd, &format!("/api/v1/uploads/{id}")).0,
        403
    );
    let (st, v) = get(&srv.url, &a_up, &format!("/api/v1/uploads/{id}"));
    assert_eq!((st, v["state"].as_str()), (200, Some("absent")));
    assert!(upload(&srv.url, &a_up, std::slice::from_ref(&d))
        .status
        .success());
    wait_ready(&srv.url, &a_rd, std::slice::from_ref(&id));
    let (_, vb) = get(&srv.url, &b_rd, &format!("/api/v1/sessions/{id}"));
    assert_eq!(vb["analyses"], 1, "B's session untouched");
    // A revoked key stops at once.
    let out = Command::new(GPUFL)
        .arg("admin")
        .args(db_args(&s))
        .args(["list-keys", "b"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let rd_id = text
        .lines()
        .find(|l| l.contains(" read "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let out = Command::new(GPUFL)
        .arg("admin")
        .args(db_args(&s))
        .args(["revoke-key", &rd_id])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (st, v) = get(&srv.url, &b_rd, &reads[0]);
    assert_eq!((st, v["error"].as_str()), (401, Some("unknown_key")));
}

#[test]
fn keys_reach_their_own_project_only_sqlite_local() {
    keys_reach_their_own_project_only(Backend::SqliteLocal);
}

#[test]
fn keys_reach_their_own_project_only_postgres_s3() {
    keys_reach_their_own_project_only(Backend::PgS3);
}

/// A session still being written goes up to its last closed block; when its file has grown,
/// uploading again sends the rest and the session is `extended`: analysed again, with the whole
/// file's kernels.
fn a_growing_session_is_completed_by_a_later_upload(b: Backend) {
    let Some(s) = stores(b, "grow") else { return };
    let srv = serve(&s, &["--rate-limit", "0"]);
    let (up, rd) = project(&s, "team");
    let src = bundled_one("hf_trainer");
    let whole = std::fs::read(src.join("trace-0000.ndjson.zst")).unwrap();
    let d = s.data.join("growing-7-20261126T000000Z");
    std::fs::create_dir_all(&d).unwrap();
    let f = d.join("trace-0000.ndjson.zst");
    // Cut in the middle of a block: what the recorder has on disk while it writes the next one.
    let closed = {
        std::fs::write(&f, &whole[..whole.len() * 2 / 3]).unwrap();
        gpufl_trace::closed_len(&f).unwrap()
    };
    assert!(closed > 0 && (closed as usize) < whole.len() * 2 / 3);
    let first = upload(&srv.url, &up, std::slice::from_ref(&d));
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let id = id_of(&d);
    let all = wait_ready(&srv.url, &rd, std::slice::from_ref(&id));
    let early = all[&id]["kernels"].as_i64().unwrap();
    let (_, files) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}/files"));
    assert_eq!(
        files["files"][0]["size"].as_u64(),
        Some(closed),
        "only the closed blocks"
    );
    std::fs::write(&f, &whole).unwrap();
    let second = upload(&srv.url, &up, std::slice::from_ref(&d));
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success() && out.contains("extended"), "{out}");
    let v = wait_analysed(&srv.url, &rd, &id, 2);
    let k = v["kernels"].as_i64().unwrap();
    assert!(k > early, "{k} <= {early}");
    assert_eq!(k, info_kernels(&src));
}

#[test]
fn a_growing_session_is_completed_by_a_later_upload_sqlite_local() {
    a_growing_session_is_completed_by_a_later_upload(Backend::SqliteLocal);
}

#[test]
fn a_growing_session_is_completed_by_a_later_upload_postgres_s3() {
    a_growing_session_is_completed_by_a_later_upload(Backend::PgS3);
}

/// A session damaged after its header is stored, analysed as far as it reads, and answers with
/// the reader's warnings; its raw file is kept as uploaded.
#[test]
fn a_damaged_session_is_kept_with_the_readers_warnings() {
    let s = stores(Backend::SqliteLocal, "damaged").unwrap();
    let srv = serve(&s, &["--rate-limit", "0"]);
    let (up, rd) = project(&s, "team");
    let src = bundled_one("hf_trainer");
    let d = s.data.join("damaged-1-20261126T000000Z");
    std::fs::create_dir_all(&d).unwrap();
    let mut b = std::fs::read(src.join("trace-0000.ndjson.zst")).unwrap();
    let n = b.len();
    for x in &mut b[n / 2..n / 2 + 64] {
        *x ^= 0x5a;
    }
    std::fs::write(d.join("trace-0000.ndjson.zst"), &b).unwrap();
    let out = upload(&srv.url, &up, std::slice::from_ref(&d));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = id_of(&d);
    wait_ready(&srv.url, &rd, std::slice::from_ref(&id));
    let (st, v) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
    assert_eq!(st, 200);
    let warnings = v["warnings"].as_array().unwrap();
    assert!(!warnings.is_empty(), "{v}");
    // Fewer kernels than the intact session: the damaged block is skipped, the rest kept.
    let k = v["kernels"].as_i64().unwrap();
    assert!(k > 0 && k < info_kernels(&src), "{k}");
    let (st, files) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}/files"));
    assert_eq!(st, 200);
    assert_eq!(files["files"][0]["size"].as_u64().unwrap(), n as u64);
}

// ---------------------------------------------------------------------------------------------
// Issue 36: the server against hostile uploads — the rows measured on the server's process.

/// The peak resident set of process `pid` (`VmHWM` of /proc/PID/status), bytes.
fn vm_hwm(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb << 10)
        .expect("VmHWM")
}

/// A header for a generated session.
fn gen_header(id: &str) -> gpufl_trace::Header {
    gpufl_trace::Header {
        gpufl_version: "0.1.0".into(),
        session_id: id.into(),
        app_name: "hostile".into(),
        host: "h".into(),
        pid: 1,
        command_line: vec!["hostile".into()],
        start_unix_ns: 1_795_300_000_000_000_000,
        clock: gpufl_trace::ClockSync {
            trace_ns: 1_000_000_000,
            unix_ns: 1_795_300_000_000_000_000,
        },
        ..gpufl_trace::Header::default()
    }
}

/// The first memory row: one trace whose 127-frame stacks all name two 512 KiB
/// strings, synchronizations at 8 lines (about 1.5 KB compressed).
fn long_strings_session(parent: &Path) -> PathBuf {
    use gpufl_trace::*;
    let id = "longstr-1-20261127T000000Z";
    let dir = parent.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &gen_header(id)).unwrap();
    let a = w.intern_str(&"a".repeat(512 << 10)).unwrap();
    let b = w
        .intern_str(&format!("/{}.py", "b".repeat(512 << 10)))
        .unwrap();
    let frames: Vec<FrameId> = (1..=127u32)
        .map(|line| {
            w.intern_frame(FrameData {
                kind: FrameKind::Python,
                module: None,
                offset: None,
                func: Some(a),
                file: Some(b),
                line: Some(line),
                inlined: false,
                text: Some(a),
            })
            .unwrap()
        })
        .collect();
    let mut t = 1_000_000_000u64 + 1_000_000;
    for line in 0..8usize {
        let mut fs = frames.clone();
        fs.rotate_left(line);
        let stack = w.intern_stack(&fs).unwrap();
        for _ in 0..3 {
            w.write(&Record::Sync(Sync {
                kind: SyncKind::ContextSynchronize,
                start: t,
                end: t + 50_000,
                ctx: 1,
                stream: None,
                event: None,
                corr: 0,
                tid: Some(1),
                stack: Some(stack),
            }))
            .unwrap();
            t += 100_000;
        }
    }
    w.finish(1_795_300_001_000_000_000, "normal").unwrap();
    dir
}

/// The second memory row: `files` trace files of highly compressible kernel records
/// (`per_file` identical lines after one that differs per file), each a few hundred bytes.
fn compressible_session(parent: &Path, files: usize, per_file: usize) -> PathBuf {
    let id = "bomb-1-20261127T000000Z";
    let dir = parent.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = |start: u64| {
        format!(
            "{{\"t\":\"kernel\",\"name\":0,\"start\":{start},\"end\":{},\"dev\":0,\"ctx\":1,\"stream\":7,\"corr\":0,\"grid\":[1,1,1],\"block\":[32,1,1],\"regs\":16,\"smem_static\":0,\"smem_dynamic\":0,\"local_mem\":0}}\n",
            start + 1000
        )
    };
    // File 0 by the writer: the header and the kernel's name.
    let f0 = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = gpufl_trace::TraceWriter::new(f0, &gen_header(id)).unwrap();
    let name = w.intern_str("k").unwrap();
    assert_eq!(name.0, 0);
    w.finish(1_795_300_001_000_000_000, "normal").unwrap();
    let body = kernel(2_000_000_000).repeat(per_file);
    for i in 1..files {
        let mut text = kernel(1_000_000_000 + i as u64);
        text.push_str(&body);
        let z = zstd::encode_all(text.as_bytes(), 3).unwrap();
        std::fs::write(dir.join(format!("trace-{i:04}.ndjson.zst")), z).unwrap();
    }
    dir
}

/// Upload every file of session `dir` (one part each) with 8 PUTs at a time, then complete: the
/// completion's status and body.
fn upload_parallel(url: &str, key: &str, dir: &Path) -> (u16, Value) {
    let id = id_of(dir);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, b)) = files.get(i) else { break };
                assert!(b.len() as u64 <= 4 << 20);
                let r = ureq::put(&format!("{url}/api/v1/uploads/{id}/files/{name}/parts/0"))
                    .set("Authorization", &format!("Bearer {key}"))
                    .set("X-Gpufl-Sha256", &gpufl_upload::parts::sha256_hex(b))
                    .send_bytes(b);
                assert!(r.is_ok(), "{name}: {r:?}");
            });
        }
    });
    let manifest = serde_json::json!({ "files": files.iter().map(|(n, b)| serde_json::json!({
        "name": n, "size": b.len(), "sha256": gpufl_upload::parts::sha256_hex(b), "parts": 1,
    })).collect::<Vec<_>>() });
    let r = ureq::post(&format!("{url}/api/v1/uploads/{id}/complete"))
        .set("Authorization", &format!("Bearer {key}"))
        .send_string(&manifest.to_string());
    match r {
        Ok(r) => (
            r.status(),
            serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or(Value::Null),
        ),
        Err(ureq::Error::Status(s, r)) => (
            s,
            serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or(Value::Null),
        ),
        Err(e) => panic!("complete: {e}"),
    }
}

/// What a memory row's server may hold at its peak beyond its resident set at start: the
/// ingest budget it is given, and 64 MiB for the rest (requests, pools, buffers).
const MEMORY_SLACK: u64 = 64 << 20;

/// One memory row: a server given `budget_mb` of ingest memory (2 workers) takes the hostile
/// session made by `make` and ends it in `want` (a final state); its peak resident set stays
/// within its resident set at start plus the budget (plus [`MEMORY_SLACK`]).
fn within_the_memory_budget(
    b: Backend,
    tag: &str,
    budget_mb: u64,
    make: impl Fn(&Path) -> PathBuf,
    want: &[&str],
) {
    let Some(s) = stores(b, tag) else { return };
    let (up, rd) = project(&s, "team");
    let budget = budget_mb.to_string();
    let srv = serve(&s, &["--ingest-memory-mb", &budget, "--rate-limit", "0"]);
    std::thread::sleep(Duration::from_millis(300));
    let pid = srv.child.id();
    let base = vm_hwm(pid);
    let t0 = Instant::now();
    let dir = make(&s.data.join("src"));
    let id = id_of(&dir);
    let t1 = Instant::now();
    let (st, v) = upload_parallel(&srv.url, &up, &dir);
    assert_eq!(st, 200, "{v}");
    eprintln!(
        "{tag}: made in {:.1} s, uploaded in {:.1} s",
        (t1 - t0).as_secs_f64(),
        t1.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let v = loop {
        let (_, v) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        if ["ready", "corrupt", "failed", "too_large"].contains(&v["ingest"].as_str().unwrap_or(""))
        {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(240), "not analysed: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let peak = vm_hwm(pid);
    eprintln!(
        "{tag} ({b:?}): ingest {} in {:.1} s, peak RSS {} MiB (start {} MiB, budget {budget_mb} MiB): {}",
        v["ingest"],
        t.elapsed().as_secs_f64(),
        peak >> 20,
        base >> 20,
        v["ingest_error"]
    );
    assert!(want.contains(&v["ingest"].as_str().unwrap()), "{v}");
    assert!(
        peak <= base + (budget_mb << 20) + MEMORY_SLACK,
        "peak RSS {} MiB over start {} MiB + budget {budget_mb} MiB + {} MiB",
        peak >> 20,
        base >> 20,
        MEMORY_SLACK >> 20
    );
    // Every page of it answers, each small.
    for path in [
        format!("/api/v1/sessions/{id}"),
        format!("/api/v1/sessions/{id}/insights"),
        format!("/api/v1/sessions/{id}/kernels"),
    ] {
        let (st, v) = get(&srv.url, &rd, &path);
        assert_eq!(st, 200, "{path}");
        assert!(v.to_string().len() < 16 << 20, "{path}");
    }
    let _ = std::fs::remove_dir_all(&s.data);
}

/// Row "ingest memory from repeated strings": the 1.5 KB upload of 127-frame stacks naming two
/// 512 KiB strings at 8 lines is analysed within a 256 MiB budget; its line answers are small
/// (the strings capped at 4 KiB, each stored once).
fn long_strings_stay_within_the_budget(b: Backend) {
    within_the_memory_budget(b, "memstr", 256, long_strings_session, &["ready"]);
}

#[test]
fn long_strings_stay_within_the_budget_sqlite_local() {
    long_strings_stay_within_the_budget(Backend::SqliteLocal);
}

#[test]
fn long_strings_stay_within_the_budget_postgres_local() {
    long_strings_stay_within_the_budget(Backend::PgLocal);
}

/// Row "ingest memory within the documented limits": 4,096 files of highly compressible kernel
/// records are read until their records would need more than the budget, then stored
/// `too_large` with the reason, the server's peak within the budget.
fn many_compressible_files_stay_within_the_budget(b: Backend) {
    within_the_memory_budget(
        b,
        "membomb",
        256,
        |s| compressible_session(s, 4096, 1200),
        &["too_large"],
    );
}

#[test]
fn many_compressible_files_stay_within_the_budget_sqlite_local() {
    many_compressible_files_stay_within_the_budget(Backend::SqliteLocal);
}

#[test]
fn many_compressible_files_stay_within_the_budget_postgres_local() {
    many_compressible_files_stay_within_the_budget(Backend::PgLocal);
}

/// A session of `n` kernels whose analysis takes a while (seconds in a debug build).
fn slow_session(parent: &Path, n: u32) -> PathBuf {
    use gpufl_trace::*;
    let id = "slow-1-20261127T000000Z";
    let dir = parent.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &gen_header(id)).unwrap();
    let names: Vec<StrId> = (0..50)
        .map(|i| w.intern_str(&format!("kernel_{i}")).unwrap())
        .collect();
    let mut t = 1_001_000_000u64;
    for i in 0..n {
        w.write(&Record::Kernel(Kernel {
            name: names[i as usize % names.len()],
            start: t,
            end: t + 3_000 + u64::from(i % 7) * 100,
            dev: 0,
            ctx: 1,
            stream: 7 + i % 3,
            corr: i + 1,
            grid: [1 + (i % 5) as i32, 1, 1],
            block: [128, 1, 1],
            regs: 32,
            ..Kernel::default()
        }))
        .unwrap();
        t += 5_000;
    }
    w.finish(1_795_300_001_000_000_000, "normal").unwrap();
    dir
}

/// The database of `s` as the library opens it.
fn db_url_of(s: &Stores) -> String {
    let mut cfg = gpufl_server::ServeConfig::new(s.data.clone());
    cfg.db = s.db.clone();
    cfg.db_url()
}

/// Row "poison session crash loop": a session whose analysis stops the server (here: the server
/// killed with SIGKILL while analysing it) three times is `failed` with the reason at the next
/// start — in the API and on its dashboard page — and not claimed again (no fourth analysis,
/// the killed analyses' temporary directories removed); a newer analysis takes it up again.
fn a_poison_session_ends_failed(b: Backend) {
    let Some(s) = stores(b, "poison") else { return };
    let (up, rd) = project(&s, "team");
    let dir = slow_session(&s.data.join("src"), 600_000);
    let id = id_of(&dir);
    let detail = |url: &str| get(url, &rd, &format!("/api/v1/sessions/{id}")).1;
    for round in 1..=3 {
        let mut srv = serve(&s, &["--ingest-workers", "1"]);
        if round == 1 {
            let (st, v) = upload_parallel(&srv.url, &up, &dir);
            assert_eq!(st, 200, "{v}");
        }
        let t = Instant::now();
        loop {
            let v = detail(&srv.url);
            if v["ingest"] == "running" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "round {round}: not running: {v}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        srv.child.kill().unwrap();
        srv.child.wait().unwrap();
    }
    let srv = serve(&s, &["--ingest-workers", "1"]);
    let t = Instant::now();
    let v = loop {
        let v = detail(&srv.url);
        if v["ingest"] == "failed" {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "not failed: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let why = v["ingest_error"].as_str().unwrap().to_string();
    assert!(why.contains("stopped the server 3 times"), "{v}");
    assert_eq!(v["analyses"], 3, "{v}");
    let page = ureq::get(&format!("{}/sessions/{id}", srv.url))
        .set("Authorization", &format!("Bearer {rd}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        page.contains("stopped the server 3 times"),
        "the reason on its page"
    );
    std::thread::sleep(Duration::from_secs(2));
    let v = detail(&srv.url);
    assert_eq!(
        (v["ingest"].as_str(), v["analyses"].as_i64()),
        (Some("failed"), Some(3))
    );
    let left: Vec<_> = std::fs::read_dir(s.data.join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "temporary directories left: {left:?}");
    drop(srv);
    // A newer analysis (as a newer gpufl's start does) takes it up again.
    let rt = gpufl_server::runtime().unwrap();
    rt.block_on(async {
        let db = gpufl_server::store::Db::open(&db_url_of(&s)).await.unwrap();
        let n = db
            .requeue_old(gpufl_server::ingest::ANALYSIS_VERSION + 1)
            .await
            .unwrap();
        assert_eq!(n, 1);
    });
    let srv = serve(&s, &["--ingest-workers", "1"]);
    let t = Instant::now();
    loop {
        let v = detail(&srv.url);
        if v["ingest"] == "ready" {
            assert_eq!(v["analyses"], 4, "{v}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(240), "not analysed: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(srv);
    let _ = std::fs::remove_dir_all(&s.data);
}

#[test]
fn a_poison_session_ends_failed_sqlite_local() {
    a_poison_session_ends_failed(Backend::SqliteLocal);
}

#[test]
fn a_poison_session_ends_failed_postgres_local() {
    a_poison_session_ends_failed(Backend::PgLocal);
}

// ---------------------------------------------------------------------------------------------
// The soak (bench/server_soak.sh; not in the default run): mixed uploads, hostile uploads and
// hostile clients, and readers, for GPUFL_SOAK_SECS seconds on PostgreSQL + S3, the server under
// an address-space limit.

/// Counts of one kind of request by answer.
#[derive(Default)]
struct Tally {
    by_status: std::collections::BTreeMap<u16, u64>,
    errors: u64,
    ms: Vec<f64>,
}

type Tallies = std::sync::Mutex<std::collections::BTreeMap<&'static str, Tally>>;

fn note(t: &Tallies, what: &'static str, status: Option<u16>, ms: f64) {
    let mut m = t.lock().unwrap();
    let e = m.entry(what).or_default();
    match status {
        Some(s) => *e.by_status.entry(s).or_default() += 1,
        None => e.errors += 1,
    }
    e.ms.push(ms);
}

fn timed_get(url: &str, key: Option<&str>, t: &Tallies, what: &'static str) -> Option<u16> {
    let t0 = Instant::now();
    let agent = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout(Duration::from_secs(60))
        .build();
    let mut r = agent.get(url);
    if let Some(k) = key {
        r = r.set("Authorization", &format!("Bearer {k}"));
    }
    let st = match r.call() {
        Ok(r) => {
            let s = r.status();
            let _ = r.into_string();
            Some(s)
        }
        Err(ureq::Error::Status(s, r)) => {
            let _ = r.into_string();
            Some(s)
        }
        Err(_) => None,
    };
    note(t, what, st, t0.elapsed().as_secs_f64() * 1e3);
    st
}

/// A copy of bundled session `from` named `id` under `parent`.
fn copy_session(from: &Path, parent: &Path, id: &str) -> PathBuf {
    let to = parent.join(id);
    std::fs::create_dir_all(&to).unwrap();
    for f in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
    to
}

/// `p`-th percentile of `v` (sorted in place), ms.
fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * p / 100.0).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Every session of the read key's project by id (the list paged through; a 429 waited out).
fn all_sessions(url: &str, rd: &str) -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    let mut offset = 0;
    loop {
        let (st, v) = get(
            url,
            rd,
            &format!("/api/v1/sessions?limit=1000&offset={offset}"),
        );
        if st == 429 {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        assert_eq!(st, 200, "{v}");
        let page = v["sessions"].as_array().unwrap();
        for x in page {
            out.insert(x["id"].as_str().unwrap().to_string(), x.clone());
        }
        if page.len() < 1000 {
            return out;
        }
        offset += 1000;
    }
}

#[test]
#[ignore = "the soak: bench/server_soak.sh"]
fn soak() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let secs: u64 = std::env::var("GPUFL_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let as_mb: u64 = std::env::var("GPUFL_SOAK_AS_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3072);
    let ingest_mb: u64 = std::env::var("GPUFL_SOAK_INGEST_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let s = stores(Backend::PgS3, "soak").expect("PostgreSQL and S3 (scripts/services.sh)");
    let (up, rd) = project(&s, "team");
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--as={}", as_mb << 20))
        .arg("--")
        .arg(GPUFL)
        .arg("serve")
        .args(store_args(&s))
        .args(["--listen", "127.0.0.1:0"])
        .args(["--ingest-memory-mb", &ingest_mb.to_string()])
        // Readers and uploaders share one key each: room for all of them.
        .args(["--rate-limit", "2000"])
        .env("MALLOC_ARENA_MAX", "2");
    let mut srv = common::spawn_serve(cmd);
    let url = srv.url.clone();
    let pid = srv.child.id();
    let src = s.data.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let bundled_dirs: Vec<PathBuf> = bundled()
        .into_iter()
        .filter(|d| d.starts_with(root().join("testdata/sessions")))
        .collect();
    let tallies: Tallies = Default::default();
    let stop = AtomicBool::new(false);
    let normal: std::sync::Mutex<Vec<String>> = Default::default();
    let hostile: std::sync::Mutex<Vec<(String, &'static str)>> = Default::default();
    let seq = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|sc| {
        // Uploaders: copies of the bundled sessions under fresh ids, some uploaded twice.
        for w in 0..2 {
            let (tallies, stop, normal, seq, src, bundled_dirs, url, up) = (
                &tallies,
                &stop,
                &normal,
                &seq,
                &src,
                &bundled_dirs,
                &url,
                &up,
            );
            sc.spawn(move || {
                let opts = gpufl_upload::UploadOptions::new(url.clone(), up.clone());
                let upl = gpufl_upload::Uploader::new(&opts).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    let from = &bundled_dirs[n as usize % bundled_dirs.len()];
                    let id = format!("soak{w}x{n}-1-20261127T000000Z");
                    let d = copy_session(from, src, &id);
                    for _ in 0..1 + (n % 3 == 0) as usize {
                        let t0 = Instant::now();
                        let r = upl.upload(&d, &mut |_| {});
                        note(
                            tallies,
                            "upload (gpufl-upload)",
                            Some(if r.is_ok() { 200 } else { 0 }),
                            t0.elapsed().as_secs_f64() * 1e3,
                        );
                        if let Err(e) = r {
                            eprintln!("soak: upload {id}: {e}");
                        }
                    }
                    normal.lock().unwrap().push(id);
                    let _ = std::fs::remove_dir_all(&d);
                }
            });
        }
        // Readers: the list, a session and its pages, the API's documents, a raw file.
        for _ in 0..2 {
            let (tallies, stop, normal, url, rd) = (&tallies, &stop, &normal, &url, &rd);
            sc.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    timed_get(
                        &format!("{url}/api/v1/sessions?limit=50"),
                        Some(rd),
                        tallies,
                        "read: API list",
                    );
                    timed_get(
                        &format!("{url}/sessions"),
                        Some(rd),
                        tallies,
                        "read: dashboard list",
                    );
                    let id = {
                        let n = normal.lock().unwrap();
                        if n.is_empty() {
                            None
                        } else {
                            Some(n[i % n.len()].clone())
                        }
                    };
                    if let Some(id) = id {
                        for (what, p) in [
                            ("read: API session", format!("/api/v1/sessions/{id}")),
                            (
                                "read: API insights",
                                format!("/api/v1/sessions/{id}/insights"),
                            ),
                            (
                                "read: API kernels",
                                format!("/api/v1/sessions/{id}/kernels"),
                            ),
                            ("read: dashboard session", format!("/sessions/{id}")),
                            (
                                "read: raw file",
                                format!("/api/v1/sessions/{id}/files/trace-0000.ndjson.zst"),
                            ),
                        ] {
                            timed_get(&format!("{url}{p}"), Some(rd), tallies, what);
                        }
                    }
                }
            });
        }
        // Hostile uploads and hostile clients, in turn.
        {
            let (tallies, stop, hostile, src, url, up, rd) =
                (&tallies, &stop, &hostile, &src, &url, &up, &rd);
            sc.spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let dir = src.join(format!("h{round}"));
                    std::fs::create_dir_all(&dir).unwrap();
                    let t0 = Instant::now();
                    let (what, made): (&'static str, PathBuf) = match round % 4 {
                        1 => ("long strings", long_strings_session(&dir)),
                        2 => (
                            "4,096 compressible files",
                            compressible_session(&dir, 4096, 1200),
                        ),
                        3 => ("a session of 600,000 kernels", slow_session(&dir, 600_000)),
                        _ => {
                            // Not a gpufl session: refused at completion.
                            let d = dir.join("junk-1-20261127T000000Z");
                            std::fs::create_dir_all(&d).unwrap();
                            std::fs::write(d.join("trace-0000.ndjson.zst"), vec![0u8; 1000])
                                .unwrap();
                            ("not a trace", d)
                        }
                    };
                    // A fresh id each round.
                    let id = format!("hostile{round}-1-20261127T000000Z");
                    let d = dir.join(&id);
                    std::fs::rename(&made, &d).unwrap();
                    let (st, v) = upload_parallel(url, up, &d);
                    note(
                        tallies,
                        "hostile upload",
                        Some(st),
                        t0.elapsed().as_secs_f64() * 1e3,
                    );
                    if st == 200 {
                        hostile.lock().unwrap().push((id.clone(), what));
                    } else {
                        assert!((400..500).contains(&st), "{what}: {st} {v}");
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                    // Hostile clients: idle sockets, a flood of unknown keys, bad hosts, long
                    // searches, odd dates, cross-site logins.
                    let addr = url.trim_start_matches("http://").to_string();
                    let idle: Vec<std::net::TcpStream> = (0..200)
                        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
                        .collect();
                    for _ in 0..300 {
                        timed_get(
                            &format!("{url}/api/v1/sessions"),
                            Some("gfl_rd_0000"),
                            tallies,
                            "hostile: unknown key",
                        );
                    }
                    let long = "x".repeat(50_000);
                    timed_get(
                        &format!("{url}/sessions?q={long}"),
                        Some(rd),
                        tallies,
                        "hostile: long search",
                    );
                    timed_get(
                        &format!("{url}/api/v1/sessions?since=9999-12-31T23:59:59Z"),
                        Some(rd),
                        tallies,
                        "hostile: odd date",
                    );
                    timed_get(
                        &format!("{url}/api/v1/sessions?app=%00"),
                        Some(rd),
                        tallies,
                        "hostile: NUL parameter",
                    );
                    let t0 = Instant::now();
                    let r = ureq::AgentBuilder::new()
                        .redirects(0)
                        .build()
                        .post(&format!("{url}/login"))
                        .set("Origin", "http://evil.example")
                        .send_form(&[("key", rd.as_str())]);
                    let st = match r {
                        Ok(r) => Some(r.status()),
                        Err(ureq::Error::Status(s, _)) => Some(s),
                        Err(_) => None,
                    };
                    note(
                        tallies,
                        "hostile: cross-site login",
                        st,
                        t0.elapsed().as_secs_f64() * 1e3,
                    );
                    std::thread::sleep(Duration::from_secs(5));
                    drop(idle);
                }
            });
        }
        while started.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_secs(1));
            assert!(
                srv.child.try_wait().unwrap().is_none(),
                "the server stopped"
            );
        }
        stop.store(true, Ordering::Relaxed);
    });
    let load_s = started.elapsed().as_secs_f64();
    // Every session ends in a final state.
    let finals = ["ready", "corrupt", "failed", "too_large"];
    let t = Instant::now();
    let mut states: std::collections::BTreeMap<String, u64> = Default::default();
    let mut hostile_states: Vec<String> = Vec::new();
    let mut all;
    loop {
        all = all_sessions(&url, &rd);
        // Uploads refused at completion (not a trace) stay `uploading`, left to housekeeping.
        let stuck: Vec<&Value> = all
            .values()
            .filter(|x| {
                x["state"] == "complete" && !finals.contains(&x["ingest"].as_str().unwrap_or(""))
            })
            .collect();
        if stuck.is_empty() {
            states.clear();
            for x in all.values() {
                *states
                    .entry(format!(
                        "{}/{}",
                        x["state"].as_str().unwrap(),
                        x["ingest"].as_str().unwrap()
                    ))
                    .or_default() += 1;
            }
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(600), "stuck: {stuck:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let drain_s = t.elapsed().as_secs_f64();
    let normal = normal.into_inner().unwrap();
    for id in &normal {
        let v = all.get(id).unwrap_or_else(|| panic!("{id} lost"));
        assert!(
            ["ready", "corrupt"].contains(&v["ingest"].as_str().unwrap()),
            "{id}: {v}"
        );
    }
    for (id, what) in hostile.into_inner().unwrap() {
        assert!(all.contains_key(&id), "{id} lost");
        let v = loop {
            match get(&url, &rd, &format!("/api/v1/sessions/{id}")) {
                (429, _) => std::thread::sleep(Duration::from_secs(1)),
                (st, v) => {
                    assert_eq!(st, 200, "{id}: {v}");
                    break v;
                }
            }
        };
        let state = v["ingest"].as_str().unwrap().to_string();
        let why = v["ingest_error"].as_str().unwrap_or("").to_string();
        assert!(finals.contains(&state.as_str()), "{id}: {v}");
        if state != "ready" {
            assert!(!why.is_empty(), "{id}: {state} without a reason");
        }
        hostile_states.push(format!("{what}: {state}"));
    }
    assert!(
        srv.child.try_wait().unwrap().is_none(),
        "the server stopped"
    );
    let peak = vm_hwm(pid);
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    let _ = srv.child.kill();
    let mut hs: std::collections::BTreeMap<String, u64> = Default::default();
    for h in hostile_states {
        *hs.entry(h).or_default() += 1;
    }
    println!("\nsoak: {load_s:.0} s of load, then {drain_s:.0} s until every session was in a final state; server pid {pid} never restarted");
    println!("soak: address-space limit {as_mb} MiB, ingest memory {ingest_mb} MiB; peak RSS {} MiB, RSS at the end {rss}", peak >> 20);
    println!(
        "soak: {} ordinary sessions uploaded, all ready or corrupt; sessions by state: {states:?}",
        normal.len()
    );
    println!("soak: hostile sessions: {hs:?}");
    println!("\n| requests | answers | p50 ms | p99 ms |\n|---|---|---|---|");
    for (what, t) in tallies.lock().unwrap().iter_mut() {
        let answers: Vec<String> = t
            .by_status
            .iter()
            .map(|(s, n)| format!("{n}× {s}"))
            .chain((t.errors > 0).then(|| format!("{}× no answer", t.errors)))
            .collect();
        println!(
            "| {what} | {} | {:.1} | {:.1} |",
            answers.join(", "),
            pct(&mut t.ms, 50.0),
            pct(&mut t.ms, 99.0)
        );
    }
    let _ = std::fs::remove_dir_all(&s.data);
}
