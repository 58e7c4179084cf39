//! What the server's in-process tests share (`mod common;` in api.rs and dashboard.rs): a server
//! started from gpufl-server's library on a loopback port, on a thread and runtime of its own
//! (stopped when dropped, as a killed process would stop); projects created through the
//! library (what `gpufl admin create-project` does); uploads through gpufl-upload (what `gpufl
//! upload` does); a fresh database and store per test; the bundled sessions.

#![allow(dead_code)]

use gpufl_server::auth::{self, KeyKind};
use gpufl_server::ServeConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn rand_hex() -> String {
    let mut b = [0u8; 6];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gpufl-srv-{tag}-{}-{}",
        std::process::id(),
        rand_hex()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn require_services() -> bool {
    std::env::var("GPUFL_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// A server's configuration on a fresh temporary data directory (SQLite and a local directory),
/// unlimited requests a second.
pub fn sqlite_config(tag: &str) -> ServeConfig {
    let mut cfg = ServeConfig::new(tmpdir(tag));
    cfg.rate_per_key = 0.0;
    cfg
}

/// [`sqlite_config`] on a fresh PostgreSQL database of `GPUFL_TEST_PG_URL`
/// (`scripts/services.sh`), or None (skipped) without it — a failure with
/// `GPUFL_REQUIRE_SERVICES=1`.
pub fn postgres_config(tag: &str) -> Option<ServeConfig> {
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
    let mut cfg = sqlite_config(tag);
    cfg.db = Some(format!("{}/{name}", &base[..at]));
    Some(cfg)
}

/// [`postgres_config`] with the raw files in a fresh prefix of the S3 bucket of `GPUFL_TEST_S3`
/// (and the `AWS_*` variables: `scripts/services.sh`), or None (skipped) without them — a failure
/// with `GPUFL_REQUIRE_SERVICES=1`.
pub fn postgres_s3_config(tag: &str) -> Option<ServeConfig> {
    let mut cfg = postgres_config(tag)?;
    let Ok(base) = std::env::var("GPUFL_TEST_S3") else {
        assert!(!require_services(), "GPUFL_TEST_S3 is not set");
        eprintln!("skipped: no S3 server (GPUFL_TEST_S3; scripts/services.sh)");
        return None;
    };
    cfg.store = Some(format!("{}/t-{}", base.trim_end_matches('/'), rand_hex()));
    Some(cfg)
}

/// The configurations a test runs on: SQLite + a local directory always, PostgreSQL + S3 where
/// the services are (with `s3`; else PostgreSQL + a local directory).
pub fn backends(tag: &str, s3: bool) -> Vec<ServeConfig> {
    let mut v = vec![sqlite_config(tag)];
    let pg = if s3 {
        postgres_s3_config(tag)
    } else {
        postgres_config(tag)
    };
    v.extend(pg);
    v
}

/// A request with a bearer key: status and JSON body (null when not JSON).
pub fn request(
    method: &str,
    url: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> (u16, Value) {
    let mut r = ureq::request(method, url);
    if let Some(k) = key {
        r = r.set("Authorization", &format!("Bearer {k}"));
    }
    for (h, v) in headers {
        r = r.set(h, v);
    }
    let resp = match body {
        Some(b) => r.send_bytes(b),
        None => r.call(),
    };
    let resp = match resp {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let st = resp.status();
    let text = resp.into_string().unwrap_or_default();
    (st, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// `PUT` part `idx` of `file` of `session` with its hash.
pub fn put_part(
    url: &str,
    key: &str,
    session: &str,
    file: &str,
    idx: u64,
    bytes: &[u8],
) -> (u16, Value) {
    request(
        "PUT",
        &format!("{url}/api/v1/uploads/{session}/files/{file}/parts/{idx}"),
        Some(key),
        &[("X-Gpufl-Sha256", &sha256_hex(bytes))],
        Some(bytes),
    )
}

/// The manifest of one file of `bytes`, named `file`, in parts of 4 MiB.
pub fn manifest_of(files: &[(&str, &[u8])]) -> String {
    let part = gpufl_protocol::PART_SIZE;
    let files: Vec<Value> = files
        .iter()
        .map(|(name, b)| {
            serde_json::json!({
                "name": name,
                "size": b.len(),
                "sha256": sha256_hex(b),
                "parts": (b.len() as u64).div_ceil(part),
            })
        })
        .collect();
    serde_json::json!({ "files": files }).to_string()
}

/// `POST …/complete` with `manifest`.
pub fn complete(url: &str, key: &str, session: &str, manifest: &str) -> (u16, Value) {
    request(
        "POST",
        &format!("{url}/api/v1/uploads/{session}/complete"),
        Some(key),
        &[("Content-Type", "application/json")],
        Some(manifest.as_bytes()),
    )
}

/// A session's detail from the read API once `pred` holds of it (panics after `secs`).
pub fn wait_for(url: &str, rd: &str, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (_, v) = get(url, rd, &format!("/api/v1/sessions/{id}"));
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: not as expected after {secs} s: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running server, stopped when dropped.
pub struct Server {
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serve `cfg` on a free loopback port; returns once it listens.
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
            // The ingest workers and any analysis in flight end with the runtime.
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

/// A new project in `cfg`'s database: its (upload key, read key).
pub fn project(cfg: &ServeConfig, name: &str) -> (String, String) {
    std::fs::create_dir_all(&cfg.data).unwrap();
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

/// Upload the sessions under `dirs` with `key`, as `gpufl upload` does; panics on a failure.
pub fn upload(url: &str, key: &str, dirs: &[PathBuf]) {
    let sessions = gpufl_upload::find_sessions(dirs).unwrap();
    assert!(!sessions.is_empty(), "no session under {dirs:?}");
    let up = gpufl_upload::Uploader::new(&gpufl_upload::UploadOptions::new(url, key)).unwrap();
    for d in &sessions {
        up.upload(d, &mut |_| {})
            .unwrap_or_else(|e| panic!("uploading {}: {e}", d.display()));
    }
}

/// `GET url+path` with a bearer key: status and JSON body (null when not JSON).
pub fn get(url: &str, key: &str, path: &str) -> (u16, Value) {
    let (status, body) = page(url, key, path);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Wait until every listed session of the key's project is analysed (ready or corrupt).
pub fn wait_ready<'a>(url: &str, key: &str, ids: impl IntoIterator<Item = &'a String>) {
    let ids: Vec<&String> = ids.into_iter().collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (st, v) = get(url, key, "/api/v1/sessions?limit=1000");
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

/// Wait until session `id` has been analysed `n` times and is ready; its detail.
pub fn wait_analysed(url: &str, rd: &str, id: &str, n: i64) -> Value {
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

/// The bundled session (testdata/sessions) whose directory name starts with `prefix` (the first
/// in name order).
pub fn bundled(prefix: &str) -> PathBuf {
    let dir = root().join("testdata/sessions");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v.into_iter()
        .next()
        .unwrap_or_else(|| panic!("no bundled session {prefix}*"))
}

pub fn id_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

/// A dashboard page with the read key: its status and HTML (an error status's body too).
pub fn page(url: &str, key: &str, path: &str) -> (u16, String) {
    let r = ureq::get(&format!("{url}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .call();
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    (resp.status(), resp.into_string().unwrap_or_default())
}

/// Percent-encoding of a query value, written here apart from the server's own
/// (`web::url_encode`), so the links a test expects are not the server's by construction.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The text of the element with `id="…"` up to its section's end.
pub fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in\n{html}"));
    let rest = &html[at..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}
