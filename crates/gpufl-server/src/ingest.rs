//! Ingest: a background job per server instance claims a completed session (several instances
//! on one PostgreSQL share the backlog through `FOR UPDATE SKIP LOCKED`; a claim older than the
//! lease is taken over), reads its parts from the object store, analyses them with gpufl-analysis
//! and stores the summary, insights, kernel table and documents in one transaction — only if the
//! session was not uploaded again meanwhile (then it is pending again and analysed anew).
//! Independent of the HTTP layer: the claims and the results go through the store
//! ([`Db::claim_next_session`], [`Db::save_analysis`]), the manifest is `gpufl-protocol`'s.
//!
//! Bounded: one session's analysis runs within the worker's memory [`Budget`] whatever the
//! upload ([`crate::bounds`]: strings capped, records costed; over it the session is stored
//! `too_large` with the reason), its line documents keep each stack and string once
//! ([`crate::linedoc`]). A session whose analysis stopped the server [`MAX_ATTEMPTS`] times is
//! `failed` for good (until a newer [`ANALYSIS_VERSION`]); an error the worker survives (the
//! store, the disk) is retried after a backoff ([`backoff_ns`]), [`MAX_RETRIES`] times at most.

use crate::bounds::{Bounded, Budget};
use crate::store::{now_ns, ClaimKey, Db, Stored, StoredInsight, StoredKernel};
use crate::AppState;
use gpufl_analysis::{Analysis, Config, Model, Severity};
use gpufl_protocol::Manifest;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Bumped when what ingest stores changes (a newer analysis): sessions stored by an older one
/// are analysed again at start. 5: the `hostlines` document and the idle findings' `data.host`;
/// 6: severity from the impact's share of the session, one finding per line and cause (`facets`);
/// 7: fix texts in the program's own words (C/C++, PyTorch, JAX, CuPy, Python);
/// 8: the `headline` document (the analysis's headline figures) and low chunks without one-off pauses.
/// 9: the `memory` document (memory over time, holders at the peak, allocations by line).
/// 10: the memory at the peak by what it is for (`memory` document's `roles`, `memory-peak`'s).
pub const ANALYSIS_VERSION: i64 = 10;

/// A claim not finished after this long belongs to an instance that died: taken over.
pub const LEASE_NS: i64 = 10 * 60 * 1_000_000_000;

/// Claims of a session that never came back (its analysis stopped the server: killed, out of
/// memory) before it is `failed` for good.
pub const MAX_ATTEMPTS: i64 = 3;

/// Errors the worker survived (store, disk) before a session is `failed` for good.
pub const MAX_RETRIES: i64 = 8;

/// What a session `failed` after [`MAX_ATTEMPTS`] says.
pub const POISON_REASON: &str =
    "the analysis stopped the server 3 times (out of memory, or killed) \
     and is not tried again until a newer gpufl's analysis";

/// The wait before retrying a session whose analysis met an error for the `retries`-th time:
/// `base_ms` (10 s by default) doubling, at most 15 minutes.
pub fn backoff_ns(base_ms: u64, retries: i64) -> i64 {
    let ms = base_ms
        .saturating_mul(1 << retries.clamp(0, 20))
        .min(900_000);
    ms as i64 * 1_000_000
}

/// The category an insight's card is filed under on the dashboard.
pub fn category(rule: &str) -> &'static str {
    gpufl_analysis::rules::spec(rule).map_or("SYSTEM", |s| s.category.as_str())
}

fn severity_rank(s: Severity) -> i64 {
    match s {
        Severity::Low => 1,
        Severity::Medium => 2,
        Severity::High => 3,
    }
}

/// Mark every session stored by an older analysis as pending.
pub async fn requeue_old(db: &Db) -> Result<u64, sqlx::Error> {
    db.requeue_old(ANALYSIS_VERSION).await
}

/// Claims left by instances of this host that are gone (their process no longer exists): pending
/// again at once, instead of after the lease. Instances name themselves `host:pid:random`; a claim
/// of another host, or of a live process, is left to its lease.
pub async fn requeue_dead_local(db: &Db, me: &str) -> Result<u64, sqlx::Error> {
    let host = me.split(':').next().unwrap_or("");
    let mut n = 0;
    for who in db.claimants().await? {
        let mut parts = who.split(':');
        let (Some(h), Some(pid)) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if h != host || who == me || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        n += db.requeue_claims_of(&who).await?;
    }
    Ok(n)
}

/// A claimed session.
struct Claim {
    project: String,
    session: String,
    gen: i64,
    retries: i64,
    manifest: Manifest,
}

/// Claim the next session to analyse; a claim whose manifest does not read is `failed`.
async fn claim(db: &Db, instance: &str) -> Result<Option<Claim>, sqlx::Error> {
    loop {
        let Some(r) = db
            .claim_next_session(
                instance,
                now_ns(),
                LEASE_NS,
                MAX_ATTEMPTS,
                ANALYSIS_VERSION,
                POISON_REASON,
            )
            .await?
        else {
            return Ok(None);
        };
        match serde_json::from_str(&r.manifest) {
            Ok(manifest) => {
                return Ok(Some(Claim {
                    project: r.project,
                    session: r.session,
                    gen: r.gen,
                    retries: r.retries,
                    manifest,
                }))
            }
            Err(e) => {
                let why = format!("its manifest does not read: {e}");
                db.release_claim(
                    &r.project,
                    &r.session,
                    instance,
                    r.gen,
                    &why,
                    0,
                    true,
                    ANALYSIS_VERSION,
                )
                .await?;
            }
        }
    }
}

#[derive(Serialize)]
struct InsightDoc<'a> {
    category: &'static str,
    #[serde(flatten)]
    insight: &'a gpufl_analysis::Insight,
}

/// Warnings kept of a session, at most, and characters kept of one.
pub const MAX_WARNINGS: usize = 200;
const MAX_WARNING_CHARS: usize = 1000;

/// The stored documents of one session, bytes in all, at most: a fraction of the budget.
fn max_docs_bytes(budget: Budget) -> usize {
    usize::try_from(budget.bytes / 4).unwrap_or(usize::MAX)
}

/// `s` without the server's paths of the session's files (`dir/`): what the API shows.
fn unpathed(s: &str, dir: &str) -> String {
    s.replace(dir, "")
}

/// Read and analyse a session directory (blocking) within `budget` (see [`crate::bounds`]).
pub fn analyse_dir(dir: &Path, threads: usize, budget: Budget) -> Stored {
    let mut out = Stored::default();
    let prefix = format!("{}/", dir.display());
    let reader = match gpufl_trace::ParSessionReader::open_with(dir, budget.read_limits(), threads)
    {
        Ok(r) => r,
        Err(e) => {
            let e = unpathed(&e.to_string(), &prefix);
            out.corrupt = Some(e.clone());
            out.warnings.push(e);
            return out;
        }
    };
    let mut reader = Bounded::new(reader, budget.records());
    let mut model = Model::load_items(&mut reader);
    if reader.over() {
        drop(reader);
        if let Some(h) = model.header() {
            out.app = h.app_name.clone();
            out.host = h.host.clone();
            out.command = h.command_line.join(" ");
            out.start_ns = h.start_unix_ns.min(i64::MAX as u64) as i64;
        }
        out.too_large = Some(format!(
            "too large to analyse here: its records need more than the {} MiB this server gives \
             one session's analysis (gpufl serve --ingest-memory-mb, shared by the ingest workers)",
            budget.bytes >> 20
        ));
        return out;
    }
    let read_warnings: Vec<String> = reader
        .inner()
        .warnings()
        .iter()
        .map(|w| unpathed(w, &prefix))
        .collect();
    model.add_warnings(read_warnings);
    let cfg = Config::default();
    let a: Analysis = gpufl_analysis::analyze_on(&model, &cfg, threads);
    out.warnings = a
        .warnings
        .iter()
        .take(MAX_WARNINGS)
        .map(|w| {
            unpathed(
                &w.chars().take(MAX_WARNING_CHARS).collect::<String>(),
                &prefix,
            )
        })
        .collect();
    if a.warnings.len() > MAX_WARNINGS {
        out.warnings.push(format!(
            "… and {} more warnings",
            a.warnings.len() - MAX_WARNINGS
        ));
    }
    let Some(h) = model.header() else {
        out.corrupt = Some("no header record: the files hold no readable gpufl session".into());
        return out;
    };
    out.app = h.app_name.clone();
    out.host = h.host.clone();
    out.command = h.command_line.join(" ");
    out.start_ns = h.start_unix_ns.min(i64::MAX as u64) as i64;
    out.run_id = h.run_id.clone().unwrap_or_default();
    out.rank = h.rank.map_or(-1, i64::from);
    let t = &a.totals;
    out.wall_ns = t.wall_ns.min(i64::MAX as u64) as i64;
    out.kernels = t.kernels.min(i64::MAX as u64) as i64;
    out.syncs = t.syncs.min(i64::MAX as u64) as i64;
    out.blocked_ns = t.sync_blocked_ns.min(i64::MAX as u64) as i64;
    out.busy_ppm = (t.gpu_busy_pct.clamp(0.0, 100.0) * 10_000.0) as i64;
    if let Some(top) = a.insights.first() {
        out.top_insight = top.title.clone();
    }
    out.top_severity = a
        .insights
        .iter()
        .map(|i| severity_rank(i.severity))
        .max()
        .unwrap_or(0);
    for i in &a.insights {
        let cat = category(i.rule);
        let doc = serde_json::to_string(&InsightDoc {
            category: cat,
            insight: i,
        })
        .unwrap_or_default();
        out.insights.push(StoredInsight {
            severity: severity_rank(i.severity),
            category: cat,
            rule: i.rule.to_string(),
            title: i.title.clone(),
            file: i.location.file.clone(),
            line: i.location.line.map(i64::from).unwrap_or(0),
            impact_ns: i.impact_ns.min(i64::MAX as u64) as i64,
            body: doc,
        });
    }
    for k in &a.kernels.rows {
        out.kernels_rows.push(StoredKernel {
            device: i64::from(k.device),
            name: k.name.clone(),
            launches: k.launches.min(i64::MAX as u64) as i64,
            total_ns: k.total_ns.min(i64::MAX as u64) as i64,
            body: serde_json::to_string(k).unwrap_or_default(),
        });
    }
    let header = serde_json::to_string(h).unwrap_or_default();
    out.docs.push(("header", header));
    out.docs.push((
        "headline",
        serde_json::to_string(&a.headline).unwrap_or_default(),
    ));
    let profile = gpufl_analysis::diff::profile(&model, &a, &cfg);
    out.docs.push((
        "profile",
        serde_json::to_string(&profile).unwrap_or_default(),
    ));
    out.docs
        .push(("analysis", serde_json::to_string(&a).unwrap_or_default()));
    out.docs.push(("telemetry", telemetry_series(&model)));
    let details = gpufl_analysis::lines::line_details_by_stack(&model, &cfg);
    let (lines, stacks) = crate::linedoc::build(&model, &details);
    out.docs.push(("lines", lines));
    out.docs.push(("stacks", stacks));
    let focus: Vec<gpufl_analysis::lines::LineDetail> =
        details.into_iter().map(|(d, _)| d).collect();
    out.docs.push((
        "sources",
        serde_json::to_string(&gpufl_analysis::lines::source_texts(&model, &focus))
            .unwrap_or_default(),
    ));
    out.docs.push((
        "hostlines",
        serde_json::to_string(&gpufl_analysis::hostlines::host_line_details(&model, &cfg))
            .unwrap_or_default(),
    ));
    out.docs.push((
        "memory",
        serde_json::to_string(&gpufl_analysis::memview::memory_view(&model, &cfg))
            .unwrap_or_default(),
    ));
    out.docs.push(("timeline", timeline_doc(&a)));
    out.docs.push(("scopes", scopes_doc(&a)));
    let bytes: usize = out
        .docs
        .iter()
        .map(|(_, d)| d.len())
        .chain(out.insights.iter().map(|i| i.body.len()))
        .chain(out.kernels_rows.iter().map(|k| k.body.len()))
        .sum();
    if bytes > max_docs_bytes(budget) {
        out.docs.clear();
        out.insights.clear();
        out.kernels_rows.clear();
        out.too_large = Some(format!(
            "too large to store here: its analysis makes {} MiB of documents, more than the {} MiB \
             this server keeps of one session (a quarter of --ingest-memory-mb per worker)",
            bytes >> 20,
            max_docs_bytes(budget) >> 20
        ));
    }
    out
}

/// Samples kept per device and series: a chart's worth.
pub const MAX_POINTS: usize = 2000;

/// The NVML samples of each device, every k-th kept so that at most [`MAX_POINTS`] remain (`ts`
/// on the trace clock; `origin_ns` is the session's first record on it).
fn telemetry_series(model: &Model) -> String {
    let (origin, _) = model.time_range();
    let devices: Vec<serde_json::Value> = model
        .telemetry()
        .iter()
        .map(|s| {
            let step = s.len().div_ceil(MAX_POINTS).max(1);
            let samples: Vec<gpufl_trace::Telemetry> =
                (0..s.len()).step_by(step).map(|i| s.get(i)).collect();
            serde_json::json!({ "device": s.device, "every": step, "samples": samples })
        })
        .collect();
    serde_json::json!({ "origin_ns": origin, "devices": devices }).to_string()
}

/// Write a claimed session's parts into `dir/<session>/` (each file cut to its manifest size).
async fn fetch(st: &AppState, c: &Claim, dir: &Path) -> Result<PathBuf, crate::ServerError> {
    fetch_files(st, &c.project, &c.session, &c.manifest, dir).await
}

/// Write session `session`'s parts (listed by `manifest`) into `dir/<session>/`.
pub(crate) async fn fetch_files(
    st: &AppState,
    project: &str,
    session: &str,
    manifest: &Manifest,
    dir: &Path,
) -> Result<PathBuf, crate::ServerError> {
    let sdir = dir.join(session);
    tokio::fs::create_dir_all(&sdir)
        .await
        .map_err(|e| crate::ServerError::io(format!("creating {}", sdir.display()), e))?;
    let parts: std::collections::HashMap<(String, i64), String> = st
        .db
        .parts(project, session)
        .await?
        .into_iter()
        .map(|p| ((p.file, p.idx), p.blob))
        .collect();
    for f in &manifest.files {
        // Part by part to disk: one part in memory at a time, whatever the session's size.
        let p = sdir.join(&f.name);
        let io = |e| crate::ServerError::io(format!("writing {}", p.display()), e);
        let mut out = tokio::fs::File::create(&p).await.map_err(io)?;
        for i in 0..f.parts {
            let Some(name) = parts.get(&(f.name.clone(), i as i64)) else {
                return Err(crate::ServerError::Inconsistent(format!(
                    "part {i} of {} is not stored",
                    f.name
                )));
            };
            let b = st.blobs.get(name).await?;
            let want = f.part_len(i) as usize;
            out.write_all(&b[..want.min(b.len())]).await.map_err(io)?;
        }
        out.flush().await.map_err(io)?;
    }
    Ok(sdir)
}

/// Store the results of a claim, if the session is still ours at the claimed generation.
async fn store(st: &AppState, c: &Claim, s: &Stored, started: i64) -> Result<bool, sqlx::Error> {
    let key = ClaimKey {
        project: &c.project,
        session: &c.session,
        instance: &st.instance,
        gen: c.gen,
    };
    st.db.save_analysis(key, s, ANALYSIS_VERSION, started).await
}

/// The temporary directory of one ingest: `ingest-PID-RANDOM` under the server's `tmp/`.
fn tmp_name() -> String {
    format!(
        "ingest-{}-{}",
        std::process::id(),
        crate::auth::random_hex(8)
    )
}

/// Remove the temporary directories of ingests whose process is gone (killed mid-ingest): those
/// named by a pid that no longer runs, and (named before pids were) those older than the lease.
/// The number removed.
pub fn clean_tmp(tmp: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("ingest-") else {
            continue;
        };
        let gone = match rest
            .split_once('-')
            .and_then(|(p, _)| p.parse::<u32>().ok())
        {
            Some(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
            None => e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|d| d.as_nanos() > LEASE_NS as u128),
        };
        if gone && std::fs::remove_dir_all(e.path()).is_ok() {
            n += 1;
        }
    }
    n
}

/// One claim, analysed and stored. `Ok(false)`: nothing to claim. An error fetching the parts
/// or storing the results gives the claim back, to be retried after [`backoff_ns`] (`failed`
/// after [`MAX_RETRIES`]); a panic of the analysis fails the session at once.
pub async fn run_once(st: &Arc<AppState>) -> Result<bool, crate::ServerError> {
    let Some(c) = claim(&st.db, &st.instance).await? else {
        return Ok(false);
    };
    let started = now_ns();
    let tmp = st.tmp_dir.join(tmp_name());
    let result = async {
        let dir = fetch(st, &c, &tmp).await?;
        let (threads, budget) = (st.analysis_threads, st.ingest_budget);
        let stored = tokio::task::spawn_blocking(move || analyse_dir(&dir, threads, budget))
            .await
            .map_err(|e| Failure::Final(format!("the analysis failed: {e}")))?;
        let saved = store(st, &c, &stored, started)
            .await
            .map_err(|e| Failure::Retry(format!("storing the results: {e}")))?;
        if saved && !stored.run_id.is_empty() {
            // The run's cross-rank analysis, over its members analysed so far: a failure there
            // is the run's, not this session's.
            if let Err(e) = crate::runs::analyse_run(st, &c.project, &stored.run_id, &tmp).await {
                eprintln!("gpufl serve: run analysis of {}: {e}", stored.run_id);
            }
        }
        Ok::<_, Failure>(())
    }
    .await;
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    if let Err(f) = result {
        let (why, fail) = match f {
            Failure::Retry(why) => (why, c.retries + 1 >= MAX_RETRIES),
            Failure::Final(why) => (why, true),
        };
        let why = why.replace(&format!("{}/", tmp.display()), "");
        eprintln!("gpufl serve: ingest of {}: {why}", c.session);
        st.db
            .release_claim(
                &c.project,
                &c.session,
                &st.instance,
                c.gen,
                &why,
                now_ns() + backoff_ns(st.ingest_retry_ms, c.retries),
                fail,
                ANALYSIS_VERSION,
            )
            .await?;
    }
    Ok(true)
}

/// Why a claimed session was not stored.
enum Failure {
    /// An error the worker survived: retried later.
    Retry(String),
    /// The analysis itself failed: not retried.
    Final(String),
}

impl From<crate::ServerError> for Failure {
    fn from(e: crate::ServerError) -> Self {
        Failure::Retry(e.to_string())
    }
}

/// The ingest loop of one worker: claim until none is left, then wait for an upload (or a
/// second, to pick up other instances' uploads and expired claims).
pub async fn worker(st: Arc<AppState>) {
    loop {
        match run_once(&st).await {
            Ok(true) => continue,
            Ok(false) => {
                // Idle: take over the claims of an instance of this host that died.
                if let Err(e) = requeue_dead_local(&st.db, &st.instance).await {
                    eprintln!("gpufl serve: ingest: {e}");
                }
            }
            Err(e) => {
                eprintln!("gpufl serve: ingest: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        let wake = st.ingest_wake.notified();
        let _ = tokio::time::timeout(Duration::from_millis(st.poll_ms), wake).await;
    }
}

/// The session page's utilization over time: per device its idle summary and, per chunk of the
/// utilization series, busy time and idle time by class (which the analysis's JSON leaves out).
fn timeline_doc(a: &Analysis) -> String {
    let devices: Vec<serde_json::Value> = a
        .gpu_idle
        .iter()
        .map(|d| {
            let chunks: Vec<serde_json::Value> = d
                .utilization
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let idle = d.chunk_idle.get(i).map_or([0; 4], |x| x.by_class);
                    serde_json::json!({
                        "start_offset_ns": c.start_offset_ns,
                        "duration_ns": c.duration_ns,
                        "busy_ns": c.busy_ns,
                        "busy_share": c.busy_share,
                        "low": c.low,
                        "unobserved_ns": c.unobserved_ns,
                        "idle_ns": {
                            "kernel_wait": idle[0],
                            "launch": idle[1],
                            "sync": idle[2],
                            "other": idle[3],
                        },
                    })
                })
                .collect();
            serde_json::json!({
                "device": d.device,
                "active_start_offset_ns": d.active_start_offset_ns,
                "active_ns": d.active_ns,
                "busy_ns": d.busy_ns,
                "idle_ns": d.idle_ns,
                "paused_ns": d.paused_ns,
                "unobserved_ns": d.unobserved_ns,
                "gaps": d.gaps,
                "by_class": d.by_class,
                "top_gaps": d.top_gaps,
                "low_utilization_chunks": d.low_utilization_chunks,
                "chunks": chunks,
            })
        })
        .collect();
    serde_json::json!({ "devices": devices }).to_string()
}

/// Scope rows kept in the `scopes` document: the first of the tree order (parents first).
pub const MAX_SCOPE_ROWS: usize = 2000;
/// Range rows kept in the `scopes` document: the longest in total.
pub const MAX_RANGE_ROWS: usize = 500;

/// The session page's scope tree and ranges, cut to [`MAX_SCOPE_ROWS`] / [`MAX_RANGE_ROWS`]
/// rows (`scopes_total` / `ranges_total`: how many there are).
fn scopes_doc(a: &Analysis) -> String {
    let scopes = &a.scopes[..a.scopes.len().min(MAX_SCOPE_ROWS)];
    let ranges = &a.ranges[..a.ranges.len().min(MAX_RANGE_ROWS)];
    serde_json::json!({
        "scopes_total": a.scopes.len(),
        "scopes": scopes,
        "ranges_total": a.ranges.len(),
        "ranges": ranges,
    })
    .to_string()
}
