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
