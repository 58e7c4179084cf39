//! The JSON API of a server started in-process from gpufl-server's library (tests/common): every
//! kind of bad request and its answer (the table of docs/server-api.md), rate limiting, and what
//! an instance does at start — sessions of an older analysis analysed again, the claims of a dead
//! instance of this host taken over (PostgreSQL, when `scripts/services.sh` started it:
//! `GPUFL_TEST_PG_URL`; CI sets `GPUFL_REQUIRE_SERVICES=1`). The tests of the `gpufl` binary
//! (`gpufl serve`, `admin`, `upload` as separate processes) are crates/gpufl-cli/tests/server.rs.

mod common;

use common::{
    bundled, get, id_of, postgres_config, project, sqlite_config, upload, wait_analysed,
    wait_ready, Server,
};
use gpufl_server::ServeConfig;
use serde_json::Value;
use std::process::{Command, Stdio};

/// One bad request: what is sent, and the status and code it gets.
struct Bad {
    what: &'static str,
    method: &'static str,
    path: String,
    key: Option<String>,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn send(url: &str, b: &Bad) -> (u16, Value) {
    let mut r = ureq::request(b.method, &format!("{url}{}", b.path));
    if let Some(k) = &b.key {
        r = r.set("Authorization", &format!("Bearer {k}"));
    }
    for (h, v) in &b.headers {
        r = r.set(h, v);
    }
    let resp = match if b.method == "GET" {
        r.call()
    } else {
        r.send_bytes(&b.body)
    } {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{}: {e}", b.what),
    };
    let st = resp.status();
    (
        st,
        serde_json::from_str(&resp.into_string().unwrap_or_default()).unwrap_or(Value::Null),
    )
}

fn sha(b: &[u8]) -> String {
    use std::io::Write;
    // sha256sum, as a user would check a part.
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Every kind of bad request gets its 4xx and a JSON reason, never a 5xx; the table is the one
/// in docs/server-api.md.
#[test]
fn bad_requests_get_a_status_and_a_reason() {
    let cfg = sqlite_config("bad");
    let srv = Server::start(&cfg);
    let (up, rd) = project(&cfg, "team");
    let sess = "bad-1-20261126T000000Z";
    let part = b"not a trace at all".to_vec();
    let good = bundled("cpp_api");
    let gbytes = std::fs::read(good.join("trace-0000.ndjson.zst")).unwrap();
    let put = |path: String, body: Vec<u8>, hash: String| Bad {
        what: "",
        method: "PUT",
        path,
        key: Some(up.clone()),
        headers: vec![("X-Gpufl-Sha256", hash)],
        body,
        status: 0,
        code: "",
    };
    // A part that is not a trace, stored, then completed: not a gpufl session.
    let (st, _) = send(
        &srv.url,
        &put(
            format!("/api/v1/uploads/{sess}/files/trace-0000.ndjson.zst/parts/0"),
            part.clone(),
            sha(&part),
        ),
    );
    assert_eq!(st, 200);
    let manifest = |size: usize, hash: &str, parts: usize| {
        format!(r#"{{"files":[{{"name":"trace-0000.ndjson.zst","size":{size},"sha256":"{hash}","parts":{parts}}}]}}"#)
            .into_bytes()
    };
    let mut rows: Vec<Bad> = Vec::new();
    let mut row = |what,
                   method,
                   path: String,
                   key: Option<&String>,
                   headers: Vec<(&'static str, String)>,
                   body: Vec<u8>,
                   status,
                   code| {
        rows.push(Bad {
            what,
            method,
            path,
            key: key.cloned(),
            headers,
            body,
            status,
            code,
        })
    };
    let p0 = |s: &str| format!("/api/v1/uploads/{s}/files/trace-0000.ndjson.zst/parts/0");
    row(
        "no key",
        "GET",
        "/api/v1/sessions".into(),
        None,
        vec![],
        vec![],
        401,
        "missing_key",
    );
    let wrong = "gfl_rd_0000".to_string();
    row(
        "unknown key",
        "GET",
        "/api/v1/sessions".into(),
        Some(&wrong),
        vec![],
        vec![],
        401,
        "unknown_key",
    );
    row(
        "upload key on a read endpoint",
        "GET",
        "/api/v1/sessions".into(),
        Some(&up),
        vec![],
        vec![],
        403,
        "wrong_key_kind",
    );
    row(
        "read key on an upload endpoint",
        "GET",
        format!("/api/v1/uploads/{sess}"),
        Some(&rd),
        vec![],
        vec![],
        403,
        "wrong_key_kind",
    );
    row(
        "no such session",
        "GET",
        "/api/v1/sessions/nope-1-2".into(),
        Some(&rd),
        vec![],
        vec![],
        404,
        "not_found",
    );
    row(
        "session id with a slash (encoded)",
        "GET",
        "/api/v1/uploads/a%2Fb".into(),
        Some(&up),
        vec![],
        vec![],
        400,
        "bad_session_id",
    );
    row(
        "file name not a trace file",
        "PUT",
        format!("/api/v1/uploads/{sess}/files/passwd/parts/0"),
        Some(&up),
        vec![("X-Gpufl-Sha256", sha(&part))],
        part.clone(),
        400,
        "bad_file_name",
    );
    row(
        "part index out of range",
        "PUT",
        format!("/api/v1/uploads/{sess}/files/trace-0000.ndjson.zst/parts/99999999"),
        Some(&up),
        vec![("X-Gpufl-Sha256", sha(&part))],
        part.clone(),
        400,
        "bad_part_index",
    );
    row(
        "part without its hash",
        "PUT",
        p0(sess),
        Some(&up),
        vec![],
        part.clone(),
        400,
        "missing_hash",
    );
    row(
        "part whose hash differs",
        "PUT",
        p0("other-1-2"),
        Some(&up),
        vec![("X-Gpufl-Sha256", "0".repeat(64))],
        part.clone(),
        422,
        "hash_mismatch",
    );
    row(
        "part over 4 MiB",
        "PUT",
        p0("other-1-2"),
        Some(&up),
        vec![("X-Gpufl-Sha256", "0".repeat(64))],
        vec![0u8; (4 << 20) + 1],
        413,
        "too_large",
    );
    row(
        "a full part replaced by other bytes",
        "PUT",
        p0("full-1-2"),
        Some(&up),
        vec![("X-Gpufl-Sha256", sha(&vec![2u8; 4 << 20]))],
        vec![2u8; 4 << 20],
        409,
        "part_conflict",
    );
    row(
        "manifest not JSON",
        "POST",
        format!("/api/v1/uploads/{sess}/complete"),
        Some(&up),
        vec![],
        b"{files".to_vec(),
        400,
        "malformed_manifest",
    );
    row(
        "manifest with a wrong part count",
        "POST",
        format!("/api/v1/uploads/{sess}/complete"),
        Some(&up),
        vec![],
        manifest(part.len(), &sha(&part), 2),
        400,
        "malformed_manifest",
    );
    row(
        "manifest naming parts never sent",
        "POST",
        format!("/api/v1/uploads/{sess}/complete"),
        Some(&up),
        vec![],
        manifest(5 << 20, &sha(&part), 2),
        409,
        "incomplete",
    );
    row(
        "manifest whose file hash differs",
        "POST",
        format!("/api/v1/uploads/{sess}/complete"),
        Some(&up),
        vec![],
        manifest(part.len(), &"a".repeat(64), 1),
        422,
        "hash_mismatch",
    );
    row(
        "not a gpufl session",
        "POST",
        format!("/api/v1/uploads/{sess}/complete"),
        Some(&up),
        vec![],
        manifest(part.len(), &sha(&part), 1),
        422,
        "not_a_gpufl_session",
    );
    row(
        "no such endpoint",
        "GET",
        "/api/v1/nothing".into(),
        Some(&rd),
        vec![],
        vec![],
        404,
        "no_route",
    );
    row(
        "line query without a line",
        "GET",
        format!("/api/v1/sessions/{}/lines?file=x", id_of(&good)),
        Some(&rd),
        vec![],
        vec![],
        400,
        "bad_query",
    );
    row(
        "a time that is not one",
        "GET",
        "/api/v1/sessions?since=yesterday".into(),
        Some(&rd),
        vec![],
        vec![],
        400,
        "bad_query",
    );
    // A full part stored first, for the conflict row.
    let full = vec![1u8; 4 << 20];
    assert_eq!(
        send(&srv.url, &put(p0("full-1-2"), full.clone(), sha(&full))).0,
        200
    );
    upload(&srv.url, &up, std::slice::from_ref(&good));
    wait_ready(&srv.url, &rd, &[id_of(&good)]);
    let _ = gbytes;
    let mut table = String::from("| request | status | error |\n|---|---|---|\n");
    for b in &rows {
        let (st, v) = send(&srv.url, b);
        assert_eq!(st, b.status, "{}: {v}", b.what);
        assert_eq!(v["error"], b.code, "{}: {v}", b.what);
        assert!(
            v["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{}",
            b.what
        );
        table.push_str(&format!("| {} | {st} | `{}` |\n", b.what, b.code));
    }
    // Rate limiting, on a server that allows 2 requests a second per key.
    let slow = Server::start(&ServeConfig {
        rate_per_key: 2.0,
        ..cfg.clone()
    });
    let statuses: Vec<u16> = (0..10)
        .map(|_| get(&slow.url, &rd, "/api/v1/sessions").0)
        .collect();
    assert!(statuses.contains(&429), "{statuses:?}");
    let r = ureq::get(&format!("{}/api/v1/sessions", slow.url))
        .set("Authorization", &format!("Bearer {rd}"))
        .call();
    if let Err(ureq::Error::Status(429, resp)) = r {
        assert!(resp.header("Retry-After").is_some());
    }
    table.push_str("| more requests a second than the key's limit | 429 | `rate_limited` |\n");
    eprintln!("{table}");
}

/// A session stored by an older analysis is analysed again when the server starts.
#[test]
fn sessions_of_an_older_analysis_are_analysed_again() {
    let Some(cfg) = postgres_config("reanalyse") else {
        return;
    };
    let (up, rd) = project(&cfg, "team");
    let d = bundled("cpp_api");
    let id = id_of(&d);
    {
        let srv = Server::start(&cfg);
        upload(&srv.url, &up, std::slice::from_ref(&d));
        wait_ready(&srv.url, &rd, std::slice::from_ref(&id));
    }
    let db = cfg.db.clone().unwrap();
    let out = Command::new("psql")
        .arg(&db)
        .args(["-qc", "UPDATE sessions SET analysis_version = 0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let srv = Server::start(&cfg);
    let v = wait_analysed(&srv.url, &rd, &id, 2);
    assert!(v["analysis_version"].as_i64().unwrap() > 0);
}

/// A session an instance of this host was analysing when it died (its claim names a process that
/// no longer exists) is analysed again as soon as an instance starts, not after the lease.
#[test]
fn claims_of_a_dead_local_instance_are_taken_over() {
    let Some(cfg) = postgres_config("orphan") else {
        return;
    };
    let (up, rd) = project(&cfg, "team");
    let d = bundled("cpp_api");
    let id = id_of(&d);
    {
        let srv = Server::start(&cfg);
        upload(&srv.url, &up, std::slice::from_ref(&d));
        wait_ready(&srv.url, &rd, std::slice::from_ref(&id));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let sql = format!(
        "UPDATE sessions SET ingest_state = 'running', claimed_by = '{}:4194999:dead', claimed_ns = {now_ns}",
        host.trim()
    );
    let out = Command::new("psql")
        .arg(cfg.db.as_ref().unwrap())
        .args(["-qc", &sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let srv = Server::start(&cfg);
    let v = wait_analysed(&srv.url, &rd, &id, 2);
    assert_eq!(v["ingest"], "ready");
}
