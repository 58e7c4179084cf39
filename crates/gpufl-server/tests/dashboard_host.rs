//! The host on the dashboard (issue 35), on the real host-gaps sessions (malloc_free_loop, pytorch_empty_cache) uploaded to an
//! in-process server: the line page's "Host at this line" (host samples by thread state, the CUDA
//! calls that held the thread there) and the session page's idle breakdown (what the host was
//! doing while the GPU idled, from the idle findings' `data.host`).

mod common;

use common::{
    bundled, enc, id_of, page, project, section, sqlite_config, upload, wait_ready, Server,
};

#[test]
fn host_at_the_line_and_the_idle_breakdown() {
    let cfg = sqlite_config("host");
    let (up, rd) = project(&cfg, "team-host");
    let server = Server::start(&cfg);
    let url = server.url.clone();
    let dirs = vec![
        bundled("pytorch_empty_cache-759-20261127T204130Z"),
        bundled("malloc_free_loop-613-20261127T204121Z"),
    ];
    upload(&url, &up, &dirs);
    let ids: Vec<String> = dirs.iter().map(|d| id_of(d)).collect();
    wait_ready(&url, &rd, &ids);
    let (py, cpp) = (&ids[0], &ids[1]);
    let file = "/work/main/examples/pytorch_empty_cache.py";

    // torch.cuda.empty_cache() at line 45: the samples there (all inside cudaFree, on the main
    // thread) and its cudaFree calls.
    let (st, html) = page(
        &url,
        &rd,
        &format!("/sessions/{py}/line?file={}&line=45", enc(file)),
    );
    assert_eq!(st, 200, "{html}");
    let host = section(&html, "line-host");
    assert!(host.contains("id=\"host-samples\""), "{host}");
    assert!(host.contains("host samples standing for"), "{host}");
    assert!(host.contains("on 1 thread (759)"), "{host}");
    assert!(host.contains("<td>in a CUDA call</td>"), "{host}");
    assert!(host.contains("100.0%"), "{host}");
    assert!(
        host.contains("<td class=\"name\">cudaFree</td><td class=\"num\">205</td>"),
        "{host}"
    );

    // Line 36 holds only host samples (no sync, copy or launch there): still a page, with its
    // states.
    let (st, html) = page(
        &url,
        &rd,
        &format!("/sessions/{py}/line?file={}&line=36", enc(file)),
    );
    assert_eq!(st, 200, "{html}");
    let host = section(&html, "line-host");
    assert!(host.contains("<td>on CPU</td>"), "{host}");
    assert!(
        !host.contains("host-calls"),
        "no call held the thread there: {host}"
    );

    // A line where nothing happened: not found.
    let (st, _) = page(
        &url,
        &rd,
        &format!("/sessions/{py}/line?file={}&line=9999", enc(file)),
    );
    assert_eq!(st, 404);

    // The C++ loop: cudaFree at malloc_free_loop.cu:70, 300 calls; its thread runs no Python, so
    // no samples name a line.
    let cu = "/work/main/examples/malloc_free_loop.cu";
    let (st, html) = page(
        &url,
        &rd,
        &format!("/sessions/{cpp}/line?file={}&line=70", enc(cu)),
    );
    assert_eq!(st, 200, "{html}");
    let host = section(&html, "line-host");
    assert!(host.contains("No host samples at this line."), "{host}");
    assert!(
        host.contains("<td class=\"name\">cudaFree</td><td class=\"num\">300</td>"),
        "{host}"
    );

    // The session pages: the idle breakdown with the host lines linking to their line pages.
    for (id, line_href) in [
        (py, format!("line?file={}&#38;line=45", enc(file))),
        (cpp, format!("line?file={}&#38;line=70", enc(cu))),
    ] {
        let (st, html) = page(&url, &rd, &format!("/sessions/{id}"));
        assert_eq!(st, 200, "{html}");
        let b = section(&html, "idle-host");
        assert!(
            b.contains("What the host was doing while the GPU idled"),
            "{b}"
        );
        assert!(b.contains("GPU idle gap"), "{b}");
        assert!(b.contains("<td>in CUDA calls</td>"), "{b}");
        assert!(b.contains(&line_href), "{id}: {line_href} not in\n{b}");
        assert!(b.contains("<td>cudaFree</td>"), "{b}");
    }
    let (_, html) = page(&url, &rd, &format!("/sessions/{py}"));
    let b = section(&html, "idle-host");
    assert!(b.contains("Compilation"), "{b}");
    drop(server);
    let _ = std::fs::remove_dir_all(&cfg.data);
}
