//! `gpufl serve --local DIR…`: the dashboard and the read API open without a key on a loopback
//! address, the sessions under DIR loaded into project "local" (through the upload protocol, so
//! a restart does not store them twice), to requests naming a loopback host only; refused on a
//! non-loopback address; a project's read key still sees its own project.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{bundled, Server, GPUFL};

fn serve(data: &Path, args: &[&str]) -> Server {
    let mut cmd = Command::new(GPUFL);
    cmd.arg("serve")
        .arg("--data")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .args(args);
    common::spawn_serve(cmd)
}

fn get(url: &str, key: Option<&str>) -> (u16, String) {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let mut req = agent.get(url);
    if let Some(k) = key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A raw `GET path` with `Host: host`: the status.
fn status_with_host(url: &str, path: &str, host: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// The open project's sessions once every one is analysed.
fn wait_ready(url: &str, n: usize) -> Vec<serde_json::Value> {
    let t = Instant::now();
    loop {
        let (st, body) = get(&format!("{url}/api/v1/sessions"), None);
        assert_eq!(st, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let s = v["sessions"].as_array().unwrap().clone();
        if s.len() == n && s.iter().all(|x| x["ingest"] == "ready") {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "not analysed: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn local_sessions_open_without_a_key_and_are_stored_once() {
    let tmp = std::env::temp_dir().join(format!("gpufl-local-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let src = tmp.join("sessions");
    std::fs::create_dir_all(&src).unwrap();
    let mut ids = Vec::new();
    for p in ["cpp_api-", "stream_sync_loop-1427"] {
        let from = bundled(p);
        let id = from.file_name().unwrap().to_owned();
        let to = src.join(&id);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
        ids.push(id.to_string_lossy().into_owned());
    }
    let data = tmp.join("data");
    let src_s = src.to_str().unwrap();
    {
        let s = serve(&data, &["--local", src_s]);
        let list = wait_ready(&s.url, 2);
        let mut got: Vec<String> = list
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect();
        got.sort();
        ids.sort();
        assert_eq!(got, ids);
        let (st, html) = get(&format!("{}/sessions", s.url), None);
        assert_eq!(st, 200, "the list opens without a key");
        for id in &ids {
            assert!(html.contains(id.as_str()), "{id} listed");
        }
        assert!(html.contains("local"), "the project is named");
        let (st, html) = get(&format!("{}/sessions/{}", s.url, ids[0]), None);
        assert_eq!(st, 200);
        assert!(html.contains("id=\"insights\""), "the session page");
        // Only to a loopback host name (a page elsewhere rebinding its name to 127.0.0.1 reads
        // nothing).
        for path in [
            "/api/v1/sessions".to_string(),
            format!("/api/v1/sessions/{}/files/trace-0000.ndjson.zst", ids[0]),
            "/sessions".to_string(),
        ] {
            assert_eq!(
                status_with_host(&s.url, &path, "evil.example"),
                421,
                "{path}"
            );
            assert_eq!(status_with_host(&s.url, &path, "localhost"), 200, "{path}");
        }
        // A project's read key still sees that project, not the open one.
        let mut admin = Command::new(GPUFL);
        admin.args(["admin", "--data"]).arg(&data);
        let (_, rd) = common::create_project(admin, "other");
        let (st, body) = get(&format!("{}/api/v1/sessions", s.url), Some(&rd));
        assert_eq!(st, 200);
        assert!(body.contains("\"sessions\":[]"), "{body}");
        let (st, _) = get(&format!("{}/sessions/{}", s.url, ids[0]), Some(&rd));
        assert_eq!(st, 404, "the open project's session is not the key's");
    }
    // Started again on the same data: nothing is stored or analysed twice (the sessions are
    // `unchanged` to the upload protocol).
    {
        let s = serve(&data, &["--local", src_s]);
        std::thread::sleep(Duration::from_secs(2));
        let list = wait_ready(&s.url, 2);
        for x in &list {
            let (_, body) = get(
                &format!("{}/api/v1/sessions/{}", s.url, x["id"].as_str().unwrap()),
                None,
            );
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["analyses"], 1, "stored and analysed once: {v}");
        }
    }
    // Without a key and without --local the dashboard asks for one.
    {
        let s = serve(&data, &[]);
        let (st, _) = get(&format!("{}/sessions", s.url), None);
        assert_eq!(st, 303, "to the login form");
        let (st, _) = get(&format!("{}/api/v1/sessions", s.url), None);
        assert_eq!(st, 401);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn an_open_project_is_refused_on_a_non_loopback_address() {
    let tmp = std::env::temp_dir().join(format!("gpufl-local-nl-{}", std::process::id()));
    let out = Command::new(GPUFL)
        .arg("serve")
        .arg("--data")
        .arg(&tmp)
        .args(["--listen", "0.0.0.0:0", "--local"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}
