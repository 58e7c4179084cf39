//! Issue 36, the server against hostile uploads and hostile clients: a regression test per row
//! of the table that a server started in-process can show (the memory rows run the
//! `gpufl` binary as a child process, whose peak resident set they read: crates/gpufl-cli/tests/
//! server.rs). Each runs on SQLite + a local directory and, where `scripts/services.sh` started
//! them, on PostgreSQL (+ S3 where the row touches the raw files).

mod common;

use common::{
    backends, bundled, complete, get, id_of, manifest_of, project, put_part, wait_ready, Server,
};
use gpufl_server::ServeConfig;
use serde_json::Value;
use std::sync::{Arc, Barrier};

const TRACE: &str = "trace-0000.ndjson.zst";

fn trace_of(prefix: &str) -> Vec<u8> {
    std::fs::read(bundled(prefix).join(TRACE)).unwrap()
}

/// Row "two different bodies for the same part": of two PUTs of one part with different bytes
/// sent at once, exactly one is stored (the other answers 409 `part_conflict`), and the stored
/// file is byte for byte the one whose PUT was stored — the session completes with its manifest
/// and reads back equal.
#[test]
fn two_bodies_for_one_part_store_one() {
    for cfg in backends("race", true) {
        let srv = Server::start(&cfg);
        let (up, rd) = project(&cfg, "team");
        let bodies = [trace_of("cpp_api"), trace_of("stream_sync_loop")];
        for round in 0..12 {
            let session = format!("race-{round}-20261127T000000Z");
            let barrier = Arc::new(Barrier::new(2));
            let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
                let hs: Vec<_> = bodies
                    .iter()
                    .map(|b| {
                        let (barrier, url, up, session) =
                            (barrier.clone(), &srv.url, &up, &session);
                        s.spawn(move || {
                            barrier.wait();
                            put_part(url, up, session, TRACE, 0, b)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let stored: Vec<usize> = (0..2)
                .filter(|&i| answers[i].0 == 200 && answers[i].1["stored"] == true)
                .collect();
            assert_eq!(stored.len(), 1, "round {round}: {answers:?}");
            let (win, lose) = (stored[0], 1 - stored[0]);
            assert_eq!(answers[lose].0, 409, "round {round}: {answers:?}");
            assert_eq!(answers[lose].1["error"], "part_conflict");
            let (st, v) = complete(
                &srv.url,
                &up,
                &session,
                &manifest_of(&[(TRACE, &bodies[win])]),
            );
            assert_eq!(st, 200, "round {round}: {v}");
            let r = ureq::get(&format!(
                "{}/api/v1/sessions/{session}/files/{TRACE}",
                srv.url
            ))
            .set("Authorization", &format!("Bearer {rd}"))
            .call()
            .unwrap();
            let mut back = Vec::new();
            std::io::Read::read_to_end(&mut r.into_reader(), &mut back).unwrap();
            assert!(
                back == bodies[win],
                "round {round}: the file read back differs"
            );
        }
    }
}

/// Row "the per-session size cap races": 32 parts of 1 MiB sent at once to a server that takes
/// 4 MiB a session store 4 MiB, the others answer 413.
#[test]
fn the_session_cap_holds_under_concurrent_parts() {
    for mut cfg in backends("cap", false) {
        cfg.limits.max_session_bytes = 4 << 20;
        let srv = Server::start(&cfg);
        let (up, _) = project(&cfg, "team");
        let session = "cap-1-20261127T000000Z";
        // The session's row exists before the race (its first part creates it).
        let first = vec![7u8; 1 << 20];
        assert_eq!(put_part(&srv.url, &up, session, TRACE, 0, &first).0, 200);
        let barrier = Arc::new(Barrier::new(32));
        let statuses: Vec<u16> = std::thread::scope(|s| {
            let hs: Vec<_> = (1..=32u64)
                .map(|i| {
                    let (barrier, url, up) = (barrier.clone(), &srv.url, &up);
                    s.spawn(move || {
                        let body = vec![i as u8; 1 << 20];
                        barrier.wait();
                        put_part(
                            url,
                            up,
                            session,
                            &format!("trace-{i:04}.ndjson.zst"),
                            0,
                            &body,
                        )
                        .0
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok = statuses.iter().filter(|&&s| s == 200).count();
        assert_eq!(ok, 3, "{statuses:?}");
        assert!(
            statuses.iter().all(|&s| s == 200 || s == 413),
            "{statuses:?}"
        );
        let (_, v) = common::request(
            "GET",
            &format!("{}/api/v1/uploads/{session}", srv.url),
            Some(&up),
            &[],
            None,
        );
        let held: u64 = v["files"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|f| f["parts"].as_array().unwrap().iter())
            .map(|p| p["size"].as_u64().unwrap())
            .sum();
        assert_eq!(held, 4 << 20, "{v}");
    }
}

/// The objects of a session's parts in `cfg`'s store, removed (as if lost): what a completion
/// that reads them again stumbles on.
fn remove_objects(cfg: &ServeConfig, project_id_of_key: &str, session: &str) -> usize {
    let rt = gpufl_server::runtime().unwrap();
    rt.block_on(async {
        let db = gpufl_server::store::Db::open(&cfg.db_url()).await.unwrap();
        let key = db
            .live_key(&gpufl_server::auth::sha256_hex(
                project_id_of_key.as_bytes(),
            ))
            .await
            .unwrap()
            .unwrap();
        let blobs = gpufl_server::blobs::Blobs::open(&cfg.store_url()).unwrap();
        let names = blobs
            .list(&format!("sessions/{}/{session}/", key.project_id))
            .await
            .unwrap();
        for n in &names {
            blobs.delete(n).await.unwrap();
        }
        names.len()
    })
}

/// Row "each completion re-reads and re-hashes the whole session": a completion that repeats
/// the stored manifest reads no part (it answers `unchanged` with the parts' objects gone),
/// nor does one that adds a file (only the new file is read).
#[test]
fn completion_reads_only_what_changed() {
    for cfg in backends("rehash", true) {
        let srv = Server::start(&cfg);
        let (up, _) = project(&cfg, "team");
        let session = "rehash-1-20261127T000000Z";
        let a = trace_of("cpp_api");
        assert_eq!(put_part(&srv.url, &up, session, TRACE, 0, &a).0, 200);
        let m = manifest_of(&[(TRACE, &a)]);
        let (st, v) = complete(&srv.url, &up, session, &m);
        assert_eq!((st, v["stored"].as_str()), (200, Some("new")), "{v}");
        assert!(remove_objects(&cfg, &up, session) >= 1);
        let (st, v) = complete(&srv.url, &up, session, &m);
        assert_eq!((st, v["stored"].as_str()), (200, Some("unchanged")), "{v}");
        // A second file: only it is read (the first one's objects are gone).
        let b = trace_of("stream_sync_loop");
        let f1 = "trace-0001.ndjson.zst";
        assert_eq!(put_part(&srv.url, &up, session, f1, 0, &b).0, 200);
        let (st, v) = complete(
            &srv.url,
            &up,
            session,
            &manifest_of(&[(TRACE, &a), (f1, &b)]),
        );
        assert_eq!((st, v["stored"].as_str()), (200, Some("extended")), "{v}");
    }
}

/// Row "an upload key can shrink a completed session": completing again with a prefix of the
/// stored file is refused (409 `manifest_shrinks`) and the analysis stays as it was.
#[test]
fn a_completed_session_does_not_shrink() {
    for cfg in backends("shrink", false) {
        let srv = Server::start(&cfg);
        let (up, rd) = project(&cfg, "team");
        let d = bundled("cpp_api");
        let id = id_of(&d);
        common::upload(&srv.url, &up, std::slice::from_ref(&d));
        wait_ready(&srv.url, &rd, std::slice::from_ref(&id));
        let (_, before) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert!(before["kernels"].as_i64().unwrap() > 0);
        let full = std::fs::read(d.join(TRACE)).unwrap();
        let prefix = &full[..full.len() / 2];
        let (st, v) = complete(&srv.url, &up, &id, &manifest_of(&[(TRACE, prefix)]));
        assert_eq!(st, 409, "{v}");
        assert_eq!(v["error"], "manifest_shrinks", "{v}");
        let (_, after) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}"));
        assert_eq!(after["kernels"], before["kernels"]);
        assert_eq!(after["analyses"], before["analyses"]);
        let (_, files) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}/files"));
        assert_eq!(files["files"][0]["size"], full.len(), "{files}");
    }
}

/// A header for a generated session.
fn gen_header(id: &str, app: &str) -> gpufl_trace::Header {
    gpufl_trace::Header {
        gpufl_version: "0.1.0".into(),
        session_id: id.into(),
        app_name: app.into(),
        host: "h\0ost".into(),
        pid: 1,
        command_line: vec!["python3".into(), "tr\0ain.py".into()],
        start_unix_ns: 1_795_300_000_000_000_000,
        clock: gpufl_trace::ClockSync {
            trace_ns: 1_000_000_000,
            unix_ns: 1_795_300_000_000_000_000,
        },
        ..gpufl_trace::Header::default()
    }
}

/// A session whose strings hold NULs: the app, host and command line, a kernel name, a frame's
/// file and function, synchronizations and kernels at that line.
fn nul_session(parent: &std::path::Path) -> std::path::PathBuf {
    use gpufl_trace::*;
    let id = "nul-1-20261127T000000Z";
    let dir = parent.join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::fs::File::create(dir.join(TRACE)).unwrap();
    let mut w = TraceWriter::new(file, &gen_header(id, "ap\0p")).unwrap();
    let kname = w.intern_str("ker\0nel").unwrap();
    let path = w.intern_str("/work/tr\0ain.py").unwrap();
    let func = w.intern_str("st\0ep").unwrap();
    let fr = w
        .intern_frame(FrameData {
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(path),
            line: Some(7),
            inlined: false,
            text: Some(func),
        })
        .unwrap();
    let stack = w.intern_stack(&[fr]).unwrap();
    let mut t = 1_001_000_000u64;
    for i in 0..50u32 {
        w.write(&Record::Kernel(Kernel {
            name: kname,
            start: t,
            end: t + 20_000,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr: i + 1,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            regs: 16,
            ..Kernel::default()
        }))
        .unwrap();
        w.write(&Record::Sync(Sync {
            kind: SyncKind::ContextSynchronize,
            start: t + 1_000,
            end: t + 30_000,
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
    w.finish(1_795_300_001_000_000_000, "normal").unwrap();
    dir
}

/// Row "PostgreSQL and NUL": a session whose trace strings hold NULs is analysed on both
/// backends alike (the NUL shown as `␀`), and a NUL in a query parameter is a 400, never a 5xx.
#[test]
fn nul_in_trace_strings_and_queries() {
    for cfg in backends("nul", false) {
        let srv = Server::start(&cfg);
        let (up, rd) = project(&cfg, "team");
        let d = nul_session(&cfg.data.join("src"));
        let id = id_of(&d);
        common::upload(&srv.url, &up, std::slice::from_ref(&d));
        let v = common::wait_for(&srv.url, &rd, &id, 60, |v| {
            v["ingest"] != "pending" && v["ingest"] != "running"
        });
        assert_eq!(v["ingest"], "ready", "{v}");
        assert_eq!(v["app"], "ap\u{2400}p", "{v}");
        assert_eq!(v["host"], "h\u{2400}ost", "{v}");
        let (st, k) = get(&srv.url, &rd, &format!("/api/v1/sessions/{id}/kernels"));
        assert_eq!(st, 200);
        assert!(k.to_string().contains("ker\u{2400}nel"), "{k}");
        let (st, l) = get(
            &srv.url,
            &rd,
            &format!("/api/v1/sessions/{id}/lines?file=/work/tr%E2%90%80ain.py&line=7"),
        );
        assert_eq!(st, 200, "{l}");
        for q in [
            "/api/v1/sessions?app=a%00b",
            "/api/v1/sessions?host=%00",
            &format!("/api/v1/sessions/{id}/lines?file=a%00&line=7"),
        ] {
            let (st, v) = get(&srv.url, &rd, q);
            assert_eq!(st, 400, "{q}: {v}");
            assert_eq!(v["error"], "bad_query", "{q}: {v}");
        }
        for q in [
            "/sessions?q=a%00b",
            "/sessions?app=%00",
            "/sessions?host=%00",
            &format!("/sessions/{id}/line?file=%00&line=7"),
            &format!("/sessions/{id}/kernel?name=%00&device=0"),
            "/compare?a=%00&b=x",
        ] {
            let r = ureq::get(&format!("{}{q}", srv.url))
                .set("Authorization", &format!("Bearer {rd}"))
                .call();
            let st = match r {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(s, _)) => s,
                Err(e) => panic!("{q}: {e}"),
            };
            assert_eq!(st, 400, "{q}");
        }
    }
}

/// Row "input edges" (server paths): a session's warnings name its files, never where the
/// server keeps them while it reads them.
#[test]
fn warnings_name_no_server_path() {
    for cfg in backends("paths", false) {
        let srv = Server::start(&cfg);
        let (up, rd) = project(&cfg, "team");
        let src = cfg.data.join("src");
        let d = src.join("paths-1-20261127T000000Z");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(bundled("cpp_api").join(TRACE), d.join(TRACE)).unwrap();
        // A second file that does not decode.
        std::fs::write(d.join("trace-0001.ndjson.zst"), b"(not zstd at all)\n").unwrap();
        let id = id_of(&d);
        let m1 = manifest_of(&[
            (TRACE, &std::fs::read(d.join(TRACE)).unwrap()),
            ("trace-0001.ndjson.zst", b"(not zstd at all)\n"),
        ]);
        for (f, b) in [
            (TRACE, std::fs::read(d.join(TRACE)).unwrap()),
            ("trace-0001.ndjson.zst", b"(not zstd at all)\n".to_vec()),
        ] {
            assert_eq!(put_part(&srv.url, &up, &id, f, 0, &b).0, 200);
        }
        assert_eq!(complete(&srv.url, &up, &id, &m1).0, 200);
        let v = common::wait_for(&srv.url, &rd, &id, 60, |v| v["ingest"] == "ready");
        let w = v["warnings"].to_string();
        assert!(w.contains("trace-0001.ndjson.zst"), "{w}");
        let data = cfg.data.display().to_string();
        assert!(
            !w.contains(&data) && !w.contains("ingest-") && !w.contains("/tmp"),
            "{w}"
        );
    }
}

/// Row "leftovers" (transient failures): a session whose parts cannot be read when it is
/// analysed goes back to pending with the reason and a backoff (not running until the lease
/// ends), and is analysed once they can.
#[test]
fn a_transient_failure_is_retried_after_a_backoff() {
    for mut cfg in backends("retry", true) {
        let (up, rd) = project(&cfg, "team");
        let d = bundled("cpp_api");
        let id = id_of(&d);
        // Uploaded to an instance that does not analyse.
        cfg.ingest_workers = 0;
        {
            let srv = Server::start(&cfg);
            common::upload(&srv.url, &up, std::slice::from_ref(&d));
        }
        let rt = gpufl_server::runtime().unwrap();
        let blobs = gpufl_server::blobs::Blobs::open(&cfg.store_url()).unwrap();
        let kept: Vec<(String, bytes::Bytes)> = rt.block_on(async {
            let mut kept = Vec::new();
            for n in blobs.list("sessions/").await.unwrap() {
                let b = blobs.get(&n).await.unwrap();
                blobs.delete(&n).await.unwrap();
                kept.push((n, b));
            }
            kept
        });
        assert!(!kept.is_empty());
        cfg.ingest_workers = 1;
        cfg.ingest_retry_ms = 1500;
        let srv = Server::start(&cfg);
        let v = common::wait_for(&srv.url, &rd, &id, 60, |v| {
            v["ingest"] == "pending" && v["ingest_error"] != ""
        });
        assert!(
            v["ingest_error"].as_str().unwrap().contains("not found"),
            "{v}"
        );
        rt.block_on(async {
            for (n, b) in kept {
                blobs.put(&n, b).await.unwrap();
            }
        });
        let v = common::wait_for(&srv.url, &rd, &id, 60, |v| v["ingest"] == "ready");
        assert_eq!(v["ingest_error"], "", "{v}");
        assert_eq!(v["analyses"], 2, "{v}");
    }
}

/// Row "leftovers" (orphans): an upload never completed is removed with its objects once it
/// has been untouched for the expiry; the object of a part replaced by a longer version is
/// removed after its grace.
#[test]
fn housekeeping_removes_abandoned_uploads_and_unused_objects() {
    for mut cfg in backends("sweep", true) {
        cfg.housekeeping.every_ms = 200;
        cfg.housekeeping.upload_expiry_ms = 1000;
        cfg.housekeeping.garbage_grace_ms = 300;
        let srv = Server::start(&cfg);
        let (up, _) = project(&cfg, "team");
        let blobs = gpufl_server::blobs::Blobs::open(&cfg.store_url()).unwrap();
        let rt = gpufl_server::runtime().unwrap();
        let objects = |s: &str| {
            rt.block_on(blobs.list("sessions/"))
                .unwrap()
                .into_iter()
                .filter(|n| n.contains(&format!("/{s}/")))
                .count()
        };
        let full = trace_of("cpp_api");
        // Abandoned: one part, never completed.
        let a = "abandoned-1-20261127T000000Z";
        assert_eq!(put_part(&srv.url, &up, a, TRACE, 0, &full[..1000]).0, 200);
        // Grown: a short part, then the whole file, completed.
        let g = "grown-1-20261127T000000Z";
        assert_eq!(put_part(&srv.url, &up, g, TRACE, 0, &full[..1000]).0, 200);
        assert_eq!(put_part(&srv.url, &up, g, TRACE, 0, &full).0, 200);
        assert_eq!(
            complete(&srv.url, &up, g, &manifest_of(&[(TRACE, &full)])).0,
            200
        );
        assert_eq!(objects(g), 2);
        let t = std::time::Instant::now();
        while objects(a) > 0 || objects(g) > 1 {
            assert!(
                t.elapsed().as_secs() < 30,
                "a: {}, g: {}",
                objects(a),
                objects(g)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let (_, v) = common::request(
            "GET",
            &format!("{}/api/v1/uploads/{a}", srv.url),
            Some(&up),
            &[],
            None,
        );
        assert_eq!(v["state"], "absent", "{v}");
    }
}

// ---------------------------------------------------------------------------------------------
// Connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// Whether the server closed `s` (a read sees the end) within `secs`.
fn closed_within(s: &mut TcpStream, secs: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    while t.elapsed() < Duration::from_secs(secs) {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

/// Row "no header-read or idle timeout, no connection cap": a socket that sends nothing, one
/// that sends its headers a byte a second and a kept-alive one left idle are closed after the
/// header timeout; connections beyond the cap are answered `503 too_many_connections` with
/// `Retry-After` at once, and once the idle ones are gone a request is served again.
#[test]
fn connections_time_out_and_are_capped() {
    for mut cfg in backends("conn", false) {
        cfg.net.header_timeout_ms = 1500;
        cfg.net.max_connections = 8;
        let srv = Server::start(&cfg);
        let (_, rd) = project(&cfg, "team");
        let addr = addr_of(&srv.url);
        // Silent.
        let mut silent = TcpStream::connect(&addr).unwrap();
        // A byte a second.
        let mut slow = TcpStream::connect(&addr).unwrap();
        let dribble = std::thread::spawn({
            let mut s = slow.try_clone().unwrap();
            move || {
                for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" {
                    if s.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1000));
                }
            }
        });
        // Kept alive after one answer, then idle.
        let mut idle = TcpStream::connect(&addr).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 256];
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(idle.read(&mut buf).unwrap() > 0);
        // Five more silent ones fill the cap of 8.
        let mut more: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut over = TcpStream::connect(&addr).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        let _ = over.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("Retry-After: 1"), "{answer}");
        assert!(answer.contains("too_many_connections"), "{answer}");
        for (what, s) in [
            ("silent", &mut silent),
            ("slow", &mut slow),
            ("idle", &mut idle),
        ] {
            assert!(closed_within(s, 6), "{what} connection still open");
        }
        for s in &mut more {
            assert!(closed_within(s, 6));
        }
        let _ = dribble.join();
        let (st, _) = get(&srv.url, &rd, "/api/v1/sessions");
        assert_eq!(st, 200);
    }
}

/// Row "limits and protocol": a flood of requests without a key or with unknown keys from one
/// address meets 429 with `Retry-After` (a known key from it still reads); `bearer` in any case
/// is the scheme; a 405 and a path that does not decode answer the JSON error; every API answer says `nosniff` and `no-store`; the dashboard's 429 has `Retry-After`.
#[test]
fn floods_and_protocol_edges() {
    for cfg in backends("flood", false) {
        let srv = Server::start(&cfg);
        let (up, rd) = project(&cfg, "team");
        let mut limited = None;
        for i in 0..200 {
            let key = if i % 2 == 0 {
                None
            } else {
                Some("gfl_rd_00000000000000000000000000000000")
            };
            let r = ureq::get(&format!("{}/api/v1/sessions", srv.url));
            let r = match key {
                Some(k) => r.set("Authorization", &format!("Bearer {k}")),
                None => r,
            };
            match r.call() {
                Err(ureq::Error::Status(429, resp)) => {
                    limited = Some(resp.header("Retry-After").map(str::to_string));
                    break;
                }
                Err(ureq::Error::Status(401, _)) => {}
                other => panic!("{other:?}"),
            }
        }
        let limited = limited.expect("never limited");
        assert!(limited.is_some(), "429 without Retry-After");
        // A known key from the same address still reads.
        assert_eq!(get(&srv.url, &rd, "/api/v1/sessions").0, 200);
        // Any case of the scheme.
        let r = ureq::get(&format!("{}/api/v1/sessions", srv.url))
            .set("Authorization", &format!("bearer {rd}"))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(r.header("Cache-Control"), Some("no-store"));
        // Not the JSON error before.
        for (method, path, body) in [
            ("DELETE", "/api/v1/sessions".to_string(), None),
            ("POST", "/api/v1/sessions".to_string(), Some(&b"{}"[..])),
            ("GET", "/api/v1/sessions/%FF%FE".to_string(), None),
            ("GET", "/api/v1/uploads/%FF%FE".to_string(), None),
        ] {
            let key = if method == "POST" { &up } else { &rd };
            let (st, v) =
                common::request(method, &format!("{}{path}", srv.url), Some(key), &[], body);
            assert!((400..500).contains(&st), "{method} {path}: {st}");
            assert!(
                v["error"].is_string() && v["reason"].is_string(),
                "{method} {path}: {st} {v}"
            );
        }
        // The dashboard's rate limit: a 429 page with Retry-After.
        let slow = Server::start(&ServeConfig {
            rate_per_key: 1.0,
            ..cfg.clone()
        });
        let mut seen = None;
        for _ in 0..10 {
            match ureq::get(&format!("{}/sessions", slow.url))
                .set("Authorization", &format!("Bearer {rd}"))
                .call()
            {
                Err(ureq::Error::Status(s, r)) => {
                    seen = Some((s, r.header("Retry-After").map(str::to_string)));
                    break;
                }
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let (s, after) = seen.expect("never limited");
        assert_eq!(s, 429);
        assert!(after.is_some());
    }
}

/// Row "input edges": a search over 200 characters and dates that do not exist or do not fit
/// are refused with 400 and a reason, not answered with a 500 or every session.
#[test]
fn searches_and_dates_are_bounded() {
    for cfg in backends("edges", false) {
        let srv = Server::start(&cfg);
        let (_, rd) = project(&cfg, "team");
        for q in [
            "/api/v1/sessions?since=9999-12-31T23:59:59Z",
            "/api/v1/sessions?since=2026-02-31T00:00:00Z",
            "/api/v1/sessions?until=2025-02-29T00:00:00Z",
        ] {
            let (st, v) = get(&srv.url, &rd, q);
            assert_eq!(
                (st, v["error"].as_str()),
                (400, Some("bad_query")),
                "{q}: {v}"
            );
        }
        let long = "x".repeat(50_000);
        let r = ureq::get(&format!("{}/sessions?q={long}", srv.url))
            .set("Authorization", &format!("Bearer {rd}"))
            .call();
        match r {
            Err(ureq::Error::Status(400, resp)) => {
                assert!(resp.into_string().unwrap().contains("at most 200"))
            }
            other => panic!("{other:?}"),
        }
        let (st, _) = get(&srv.url, &rd, &format!("/sessions?q={}", "x".repeat(200)));
        assert_eq!(st, 200);
    }
}

/// A raw `GET path` with `Host: host`: the status.
fn get_with_host(url: &str, path: &str, host: &str) -> u16 {
    let mut s = TcpStream::connect(addr_of(url)).unwrap();
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

/// Row "`--local` / `--demo` accept any `Host`": a server whose project is open without a key
/// answers only requests naming a loopback host (DNS rebinding: `Host: evil.example` is 421 for
/// the list, the raw trace file and the dashboard).
#[test]
fn an_open_project_answers_loopback_hosts_only() {
    for mut cfg in backends("rebind", false) {
        let (up, _) = project(&cfg, "local");
        cfg.open_project = Some("local".into());
        let srv = Server::start(&cfg);
        let d = bundled("cpp_api");
        let id = id_of(&d);
        common::upload(&srv.url, &up, std::slice::from_ref(&d));
        let port = srv.url.rsplit(':').next().unwrap().to_string();
        for path in [
            "/api/v1/sessions".to_string(),
            format!("/api/v1/sessions/{id}/files/{TRACE}"),
            "/sessions".to_string(),
            format!("/sessions/{id}"),
        ] {
            for host in ["evil.example", &format!("evil.example:{port}"), "10.1.2.3"] {
                assert_eq!(get_with_host(&srv.url, &path, host), 421, "{path} {host}");
            }
            for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
                assert_eq!(get_with_host(&srv.url, &path, &host), 200, "{path} {host}");
            }
        }
    }
}
