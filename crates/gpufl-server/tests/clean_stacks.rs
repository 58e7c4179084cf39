//! Issue 37, clean stacks, on the server: a PyTorch session and a C++ one uploaded to an
//! in-process server; at every line its findings name, the line API's stacks and the line page
//! start from the program's CUDA call, without the recorder's, CUPTI's and the driver's frames,
//! unless the API is asked for every frame (`all_frames=true`).

mod common;

use common::{bundled, enc, get, id_of, page, project, sqlite_config, upload, wait_ready};
use serde_json::Value;

/// A frame of the recorder, CUPTI or the driver, or an unnamed one of the CUDA runtime.
fn cuda_internal(f: &Value) -> bool {
    let module = f["module"].as_str().unwrap_or_default();
    let base = module.rsplit('/').next().unwrap_or_default();
    ["libcupti", "libcuda.so", "libgpufl_capture"]
        .iter()
        .any(|p| base.starts_with(p))
        || (base.starts_with("libcudart") && f["function"].as_str().is_none_or(|n| n == "??"))
}

/// The stacks of the line API's entries at `file:line`.
fn stacks(url: &str, rd: &str, id: &str, file: &str, line: i64, all: bool) -> Vec<Vec<Value>> {
    let all = if all { "&all_frames=true" } else { "" };
    let (st, v) = get(
        url,
        rd,
        &format!(
            "/api/v1/sessions/{id}/lines?file={}&line={line}{all}",
            enc(file)
        ),
    );
    assert_eq!(st, 200, "{v}");
    v["activity"]
        .as_array()
        .expect("activity")
        .iter()
        .map(|l| l["stack"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn line_stacks_start_at_the_programs_call() {
    let cfg = sqlite_config("clean-stacks");
    let (up, rd) = project(&cfg, "team-clean-stacks");
    let server = common::Server::start(&cfg);
    let url = server.url.clone();
    let dirs = vec![
        bundled("pytorch_train_sync-1304-20261122T083220Z"),
        bundled("malloc_free_loop-613-20261127T204121Z"),
    ];
    upload(&url, &up, &dirs);
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    wait_ready(&url, &rd, &ids);
    let mut checked = 0;
    for id in &ids {
        let (st, v) = get(&url, &rd, &format!("/api/v1/sessions/{id}/insights"));
        assert_eq!(st, 200, "{v}");
        let mut lines: Vec<(String, i64)> = v["insights"]
            .as_array()
            .expect("insights")
            .iter()
            .filter_map(|i| {
                let l = &i["location"];
                Some((l["file"].as_str()?.to_string(), l["line"].as_i64()?))
            })
            .filter(|(f, _)| f.starts_with('/'))
            .collect();
        lines.dedup();
        assert!(!lines.is_empty(), "{id}: no line");
        for (file, line) in lines {
            let shown = stacks(&url, &rd, id, &file, line, false);
            let all = stacks(&url, &rd, id, &file, line, true);
            assert_eq!(shown.len(), all.len());
            for (s, a) in shown.iter().zip(&all) {
                assert!(!s.is_empty() && a.ends_with(s), "{id} {file}:{line}");
                assert!(!cuda_internal(&s[0]), "{id} {file}:{line}: {}", s[0]);
                // The recorded stacks begin inside CUPTI.
                assert!(
                    a[0]["module"]
                        .as_str()
                        .is_some_and(|m| m.contains("libcupti")),
                    "{id} {file}:{line}: {}",
                    a[0]
                );
                checked += 1;
            }
            // The line page lists no frame of CUPTI or the driver.
            let (st, html) = page(
                &url,
                &rd,
                &format!("/sessions/{id}/line?file={}&line={line}", enc(&file)),
            );
            assert_eq!(st, 200, "{html}");
            assert!(html.contains("stack"), "{html}");
            assert!(
                !html.contains("libcupti") && !html.contains("libcuda.so"),
                "{id} {file}:{line}: the line page shows CUDA's frames"
            );
        }
    }
    assert!(checked >= 3, "{checked} stacks checked");
    drop(server);
    let _ = std::fs::remove_dir_all(&cfg.data);
}
