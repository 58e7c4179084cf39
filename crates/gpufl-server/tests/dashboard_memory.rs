//! Memory on the dashboard (issue 38), on the real sessions recorded with `mem` records
//! (pytorch_oom: a PyTorch loop keeping tensors until out of memory; mempool_async: a
//! `cudaMallocAsync` pool; hf_trainer_mem: a HuggingFace Trainer) uploaded to an in-process server: the session page's memory chart per
//! device (live bytes over time, the peak marked, the holders at the peak with chips to their
//! line pages) and the line page's allocations. The figures shown are checked against the
//! analysis's memory view of the same session read here.

mod common;
mod webdriver;

use common::{
    bundled, enc, id_of, page, project, section, sqlite_config, upload, wait_ready, Server,
};
use gpufl_analysis::memview::{memory_view, MemoryView};
use gpufl_analysis::{Config, Model};
use std::path::Path;

fn view(dir: &Path) -> MemoryView {
    let mut reader = gpufl_trace::ParSessionReader::open(dir, 2).unwrap();
    let model = Model::load_items(&mut reader);
    memory_view(&model, &Config::default())
}

/// `fmt::bytes` of the dashboard, for the figures the test expects.
fn bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (b as f64, 0);
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

#[test]
fn memory_chart_holders_and_line_allocations() {
    let cfg = sqlite_config("memory");
    let (up, rd) = project(&cfg, "team-memory");
    let server = Server::start(&cfg);
    let url = server.url.clone();
    let dirs = vec![
        bundled("pytorch_oom-908-20261128T010827Z"),
        bundled("mempool_async-1273-20261128T010830Z"),
        bundled("pytorch_empty_cache-759-20261127T204130Z"),
        bundled("hf_trainer_mem-1401-20261128T030301Z"),
    ];
    upload(&url, &up, &dirs);
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    wait_ready(&url, &rd, &ids);

    for (i, (file, top_line)) in [
        ("/work/main/examples/pytorch_oom.py", 28u32),
        ("/work/main/examples/mempool_async.cu", 67u32),
    ]
    .into_iter()
    .enumerate()
    {
        let id = &ids[i];
        let mv = view(&dirs[i]);
        let dev = &mv.devices[0];
        let (st, html) = page(&url, &rd, &format!("/sessions/{id}"));
        assert_eq!(st, 200, "{html}");
        let m = section(&html, "memory");
        // One chart per device with allocations, its line drawn and its peak marked.
        assert_eq!(
            m.matches("class=\"panel device mem-device\"").count(),
            mv.devices.len()
        );
        assert!(m.contains("<polyline class=\"line s0\""), "{m}");
        let peak = format!("peak {}", bytes(dev.peak_bytes));
        assert!(m.contains("<g class=\"mark\">"), "{m}");
        assert!(m.contains(&peak), "{peak} not in\n{m}");
        // The holders at the peak: the largest is the line that allocates the most, linked to
        // its line page (the `&` of the query escaped), with its live bytes and allocations.
        let top = &dev.holders[0];
        assert_eq!(top.at.file, file);
        assert_eq!(top.at.line, Some(top_line));
        let href = format!(
            "href=\"/sessions/{id}/line?file={}&#38;line={top_line}\"",
            enc(file)
        );
        assert!(m.contains(&href), "{href} not in\n{m}");
        let row = &m[m.find(&href).unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains(&bytes(top.bytes)), "{row}");
        assert!(row.contains(&format!(">{}</td>", top.allocs)), "{row}");
        assert!(!m.contains("<script"), "{m}");

        // The line page: its allocations, live bytes at the peak as on the session page.
        let (st, html) = page(
            &url,
            &rd,
            &format!("/sessions/{id}/line?file={}&line={top_line}", enc(file)),
        );
        assert_eq!(st, 200, "{html}");
        let a = section(&html, "line-memory");
        let here: Vec<_> = mv
            .lines
            .iter()
            .filter(|l| l.at.file == file && l.at.line == Some(top_line))
            .collect();
        let allocs: u64 = here.iter().map(|l| l.allocs).sum();
        let live: u64 = here.iter().map(|l| l.peak_live).sum();
        assert!(live >= top.bytes, "{live} < {}", top.bytes);
        assert!(
            a.contains(&format!("<td>GPU 0</td><td class=\"num\">{allocs}</td>")),
            "{a}"
        );
        assert!(
            a.contains(&format!("<td class=\"num peak-live\">{}</td>", bytes(live))),
            "{a}"
        );
    }
    // The out-of-memory loop: the growing line holds nearly all of the 78 GiB peak, 300 and more
    // allocations of 256 MiB.
    let oom = view(&dirs[0]);
    assert!(oom.devices[0].peak_bytes > 70 << 30);
    assert!(oom.devices[0].holders[0].allocs >= 300);

    // No purpose but the program's own tensors: no "by what it is for" line.
    let (_, html) = page(&url, &rd, &format!("/sessions/{}", ids[0]));
    assert!(!section(&html, "memory").contains("mem-roles"));
    // A HuggingFace Trainer: the memory at the peak by what it is for, as the analysis has it.
    let trainer = view(&dirs[3]);
    let roles = &trainer.devices[0].roles;
    let names: Vec<&str> = roles.iter().map(|r| r.role.as_str()).collect();
    for want in ["activations", "gradients", "weights", "optimizer_state"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let (st, html) = page(&url, &rd, &format!("/sessions/{}", ids[3]));
    assert_eq!(st, 200);
    let m = section(&html, "memory");
    let line = &m[m.find("class=\"mem-roles\"").expect("roles line")..];
    let line = &line[..line.find("</p>").unwrap()];
    for r in roles {
        let shown = format!("{} <b>{}</b>", r.label, bytes(r.bytes));
        assert!(line.contains(&shown), "{shown} not in {line}");
    }
    // Largest first: activations lead.
    assert!(
        line.find("activations").unwrap() < line.find("weights").unwrap(),
        "{line}"
    );
    // Every holder is under the user's `trainer.train()` line: the library's line beside it tells
    // them apart (the largest: accelerate's backward), a chip to that line's page.
    let top = &trainer.devices[0].holders[0];
    let lib = top.at.library.as_ref().expect("the library line");
    assert!(lib.file.ends_with("accelerate/accelerator.py"), "{lib:?}");
    let table = &m[m.find("class=\"mem-holders\"").unwrap()..];
    let first = &table[table.find("<tbody>").unwrap()..];
    let first = &first[..first.find("</tr>").unwrap()];
    let lib_href = format!(
        "class=\"chip lib\" href=\"/sessions/{}/line?file={}&#38;line={}\"",
        ids[3],
        enc(&lib.file),
        lib.line.unwrap()
    );
    assert!(first.contains(&lib_href), "{lib_href} not in {first}");
    assert!(first.contains("accelerator.py:2861"), "{first}");

    // A session without `mem` records: no memory section; its line pages say nothing of it.
    let (st, html) = page(&url, &rd, &format!("/sessions/{}", ids[2]));
    assert_eq!(st, 200);
    assert!(!html.contains("id=\"memory\""));
    let (st, html) = page(
        &url,
        &rd,
        &format!(
            "/sessions/{}/line?file={}&line=45",
            ids[2],
            enc("/work/main/examples/pytorch_empty_cache.py")
        ),
    );
    assert_eq!(st, 200);
    assert!(!html.contains("id=\"line-memory\""));
    shot_memory_chart(&url, &rd, &ids[3]);
    drop(server);
    let _ = std::fs::remove_dir_all(&cfg.data);
}

/// In Chromium: log in, open the Trainer's session, the memory chart is drawn with its peak
/// mark and a holder's chip leads to its line page; a screenshot of the chart goes to
/// `$GPUFL_SCREENSHOTS/memory.png` (else target/dashboard-screenshots). Skipped without a
/// browser unless `GPUFL_REQUIRE_BROWSER=1`.
fn shot_memory_chart(url: &str, key: &str, id: &str) {
    let require = std::env::var("GPUFL_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let (chromium, driver) = match webdriver::find_browser() {
        Ok(x) => x,
        Err(why) => {
            assert!(!require, "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: {why}");
            return;
        }
    };
    let b = match webdriver::Browser::start(&chromium, &driver) {
        Ok(b) => b,
        Err(why) => {
            assert!(!require, "GPUFL_REQUIRE_BROWSER=1 but {why}");
            eprintln!("skipped: the browser did not start: {why}");
            return;
        }
    };
    b.goto(&format!("{url}/sessions"));
    let field = b.find("input[name=key]");
    b.send_keys(&field, key);
    let go = b.find("#login");
    b.click_nav(&go);
    b.goto(&format!("{url}/sessions/{id}"));
    let mark = b.find("#memory svg g.mark circle");
    let r = b.exec(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height];",
        vec![webdriver::Browser::arg(&mark)],
    );
    assert!(
        r[0].as_f64().unwrap_or(0.0) > 0.0,
        "the peak mark is not drawn: {r}"
    );
    b.set_window_size(1400, 1000);
    b.exec(
        "document.getElementById('memory').scrollIntoView();",
        vec![],
    );
    let png = b.screenshot();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let dir = match std::env::var("GPUFL_SCREENSHOTS") {
        Ok(d) if !d.is_empty() => common::root().join(d),
        _ => common::root().join("target/dashboard-screenshots"),
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("memory.png"), &png).unwrap();
    let chip = b.find("#memory table.mem-holders a.chip");
    b.click_nav(&chip);
    assert!(
        b.current_url().contains("/line?file="),
        "{}",
        b.current_url()
    );
    b.find("#line-memory table.line-allocs");
}
