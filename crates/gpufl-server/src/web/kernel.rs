//! The kernel page (`/sessions/{id}/kernel?name=K&device=D`): one kernel name on one device — its
//! launch configuration with registers, shared and local memory, its theoretical occupancy and
//! the limiting resource, the distribution of its durations, the lines that launched it and the
//! insights about it.
//!
//! Reads one kernel row (by name and device), the session's `lines` document (the kernels each
//! line launched) and the session's insight rows; nothing proportional to the kernels run.

use super::cards::Card;
use super::charts::Bars;
use super::data;
use super::{fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::InsightRow;
use crate::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use gpufl_analysis::kernels::short_name;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Launch sites listed, at most.
pub const MAX_SITES: usize = 100;

#[derive(Deserialize, Default)]
pub struct KernelQuery {
    name: Option<String>,
    device: Option<String>,
}

/// The parts of gpufl_analysis::kernels::KernelRow the page shows (absent fields read as empty).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct KernelDoc {
    pub launches: u64,
    pub graph_runs: u64,
    pub total_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub duration_log2: Vec<(u8, u64)>,
    pub busy_ns: u64,
    pub busy_share: f64,
    pub configs: u32,
    pub launch: LaunchDoc,
    pub blocks: u64,
    pub threads_per_block: u64,
    pub occupancy: Option<OccupancyDoc>,
    pub waves: Option<f64>,
    pub library: bool,
    pub comm: bool,
    pub stack_frame: Option<u32>,
    pub source: Option<SourceDoc>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct LaunchDoc {
    pub grid: [i64; 3],
    pub block: [i64; 3],
    pub regs: u32,
    pub smem_static: i64,
    pub smem_dynamic: i64,
    pub local_mem: u64,
    pub smem_executed: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct OccupancyDoc {
    pub warps_per_block: u32,
    pub limit_registers: Option<u32>,
    pub limit_shared_memory: Option<u32>,
    pub limit_warps: u32,
    pub limit_blocks: u32,
    pub blocks_per_sm: u32,
    pub warps_per_sm: u32,
    pub occupancy: f64,
    pub limited_by: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub struct SourceDoc {
    pub file: String,
    pub line: u32,
    pub note: Option<String>,
}

/// One row of the configuration table: a key (`data-k`), its label and value.
pub struct ConfigRow {
    pub key: &'static str,
    pub label: &'static str,
    pub value: String,
}

/// A line that launched the kernel.
pub struct Site {
    pub href: String,
    pub text: String,
    pub title: String,
    pub function: String,
    pub launches: String,
    pub gpu: String,
}

pub struct OtherDevice {
    pub href: String,
    pub device: i64,
}

#[derive(Template)]
#[template(path = "kernel.html")]
pub struct KernelPage {
    pub title: String,
    pub nav: Option<Nav>,
    pub session: String,
    pub session_href: String,
    pub name: String,
    pub short: String,
    pub device: i64,
    pub others: Vec<OtherDevice>,
    pub tags: Vec<&'static str>,
    pub config: Vec<ConfigRow>,
    pub source: String,
    pub launches: String,
    pub graph_runs: u64,
    pub total: String,
    pub mean: String,
    pub p50: String,
    pub p99: String,
    pub busy_share: String,
    /// The duration histogram's SVG (web::charts), empty when not stored.
    pub chart: String,
    pub sites: Vec<Site>,
    pub sites_total: usize,
    pub cards: Vec<Card>,
}

fn limiter_name(s: &str) -> &str {
    match s {
        "registers" => "registers",
        "shared_memory" => "shared memory",
        "warps" => "warps per SM",
        "blocks" => "blocks per SM",
        other => other,
    }
}

fn dims(d: &[i64; 3]) -> String {
    format!("{} × {} × {}", d[0], d[1], d[2])
}

/// The rows of the configuration table.
pub fn config_rows(k: &KernelDoc) -> Vec<ConfigRow> {
    let l = &k.launch;
    let row = |key, label, value| ConfigRow { key, label, value };
    let mut v = vec![
        row(
            "grid",
            "Grid (blocks)",
            format!(
                "{} = {}",
                dims(&l.grid),
                fmt::count(k.blocks.min(i64::MAX as u64) as i64)
            ),
        ),
        row("block", "Block (threads)", dims(&l.block)),
        row(
            "threads",
            "Threads per block",
            fmt::count(k.threads_per_block.min(i64::MAX as u64) as i64),
        ),
        row("registers", "Registers per thread", l.regs.to_string()),
        row(
            "smem-static",
            "Shared memory, static",
            fmt::bytes(l.smem_static),
        ),
        row(
            "smem-dynamic",
            "Shared memory, dynamic",
            fmt::bytes(l.smem_dynamic),
        ),
        row(
            "local",
            "Local memory per thread",
            fmt::bytes(l.local_mem.min(i64::MAX as u64) as i64),
        ),
    ];
    if let Some(c) = l.smem_executed {
        v.push(row(
            "carveout",
            "Shared memory per SM (carveout)",
            fmt::bytes(c.min(i64::MAX as u64) as i64),
        ));
    }
    v.push(row(
        "stack-frame",
        "Stack frame per thread",
        k.stack_frame
            .map(|b| fmt::bytes(i64::from(b)))
            .unwrap_or_else(|| "not recorded".into()),
    ));
    match &k.occupancy {
        Some(o) => {
            v.push(row(
                "occupancy",
                "Theoretical occupancy",
                format!(
                    "{} ({} warps, {} blocks per SM)",
                    fmt::pct(o.occupancy * 100.0),
                    o.warps_per_sm,
                    o.blocks_per_sm
                ),
            ));
            let limits = [
                ("registers", o.limit_registers),
                ("shared memory", o.limit_shared_memory),
                ("warps", Some(o.limit_warps)),
                ("blocks", Some(o.limit_blocks)),
            ]
            .iter()
            .filter_map(|(n, b)| b.map(|b| format!("{n} {b}")))
            .collect::<Vec<_>>()
            .join(", ");
            v.push(row(
                "limiter",
                "Limited by",
                if o.limited_by.is_empty() {
                    "–".into()
                } else {
                    format!(
                        "{} (blocks per SM under each limit: {limits})",
                        o.limited_by
                            .iter()
                            .map(|s| limiter_name(s))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            ));
        }
        None => {
            v.push(row(
                "occupancy",
                "Theoretical occupancy",
                "unknown (the device's limits were not recorded)".into(),
            ));
            v.push(row("limiter", "Limited by", "–".into()));
        }
    }
    v.push(row(
        "waves",
        "Waves",
        k.waves
            .filter(|w| w.is_finite())
            .map(|w| format!("{w:.2}"))
            .unwrap_or_else(|| "–".into()),
    ));
    v.push(row(
        "configs",
        "Launch configurations",
        if k.configs > 1 {
            format!("{} (the one with the most GPU time shown)", k.configs)
        } else {
            k.configs.to_string()
        },
    ));
    v
}

/// The duration histogram: power-of-2 buckets from the shortest to the longest (empty ones in
/// between drawn as zero).
pub fn duration_bars(hist: &[(u8, u64)]) -> String {
    let (Some(lo), Some(hi)) = (
        hist.iter().map(|h| h.0).min(),
        hist.iter().map(|h| h.0).max(),
    ) else {
        return String::new();
    };
    // At least MIN_BUCKETS buckets, the empty ones around the range, so one bucket reads as
    // a bar among others.
    const MIN_BUCKETS: u8 = 8;
    let (mut lo, mut hi) = (lo, hi.min(63));
    while hi - lo + 1 < MIN_BUCKETS && (lo > 0 || hi < 63) {
        lo = lo.saturating_sub(1);
        if hi - lo + 1 < MIN_BUCKETS && hi < 63 {
            hi += 1;
        }
    }
    let bars = (lo..=hi)
        .map(|k| {
            let n = hist.iter().filter(|h| h.0 == k).map(|h| h.1).sum::<u64>();
            let from = 1u64 << k;
            let to = from.saturating_mul(2);
            (
                fmt::dur_u(if k == 0 { 0 } else { from }),
                n as f64,
                format!(
                    "{} launch{} of {} to {}",
                    fmt::count(n.min(i64::MAX as u64) as i64),
                    if n == 1 { "" } else { "es" },
                    fmt::dur_u(if k == 0 { 0 } else { from }),
                    fmt::dur_u(to)
                ),
            )
        })
        .collect();
    Bars {
        title: "Kernel durations (launches per duration bucket, each twice the one before)".into(),
        height: 160.0,
        bars,
    }
    .render()
}

fn kernel_of(v: &Value) -> Option<&str> {
    v.get("kernel").and_then(Value::as_str)
}

/// Whether an insight is about the kernel `name` (on `device`): its rule's data names it (kernel
/// rules, kernel-detail sites, launch-bound's kernels), or its title or detail mentions it.
pub fn about(r: &InsightRow, name: &str, device: i64) -> bool {
    let dev_ok = |v: &Value| {
        v.get("device")
            .and_then(Value::as_i64)
            .is_none_or(|d| d == device)
    };
    if let Some(d) = r.body.get("data") {
        if kernel_of(d) == Some(name) && dev_ok(d) {
            return true;
        }
        if let Some(s) = d.get("site") {
            if kernel_of(s) == Some(name) && dev_ok(s) {
                return true;
            }
        }
        if let Some(ks) = d.get("kernels").and_then(Value::as_array) {
            if ks.iter().any(|k| {
                (k.get("name").and_then(Value::as_str) == Some(name) || kernel_of(k) == Some(name))
                    && dev_ok(k)
            }) {
                return true;
            }
        }
    }
    let short = short_name(name);
    let mentions = |t: &str| t.contains(name) || (short.len() >= 6 && t.contains(short));
    let detail = r.body.get("detail").and_then(Value::as_str).unwrap_or("");
    mentions(&r.title) || mentions(detail)
}

pub async fn page(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    v: Viewer,
    q: Result<Query<KernelQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, WebError> {
    let Query(q) = q.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let name = q
        .name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| WebError::BadRequest("no kernel name given (?name=…&device=…)".into()))?;
    let device: Option<i64> = match q.device.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(d) => Some(
            d.parse()
                .map_err(|_| WebError::BadRequest("device must be a GPU index".into()))?,
        ),
    };
    let session = data::session(&st, &v.project_id, &id).await?;
    // The kernel's rows on every device (one per device: few).
    let rows = st
        .db
        .kernels_named(&v.project_id, &id, &[name.as_str()])
        .await?;
    let row = match device {
        Some(d) => rows.iter().find(|r| r.device == d),
        None => rows.first(),
    }
    .ok_or_else(|| {
        WebError::NotFound(format!("no kernel {name:?} on that device in this session"))
    })?;
    let device = row.device;
    let k: KernelDoc = serde_json::from_value(row.body.clone()).unwrap_or_default();
    let mut others: Vec<OtherDevice> = rows
        .iter()
        .filter(|r| r.device != device)
        .map(|r| OtherDevice {
            href: format!(
                "/sessions/{}/kernel?name={}&device={}",
                url_encode(&id),
                url_encode(&name),
                r.device
            ),
            device: r.device,
        })
        .collect();
    others.sort_by_key(|o| o.device);

    // Lines that launched it.
    let lines: Vec<SiteDoc> = data::doc(&st, &v.project_id, &id, "lines")
        .await?
        .unwrap_or_default();
    // Per line (its locations through different library frames merged): GPU ns, launches, the
    // location of its first entry.
    let mut at: HashMap<(&str, u32), (u64, u64, &super::line::LocDoc)> = HashMap::new();
    for l in &lines {
        let (Some(k), Some(n)) = (l.kernels.iter().find(|k| k.name == name), l.location.line)
        else {
            continue;
        };
        if l.location.file.starts_with('<') {
            continue;
        }
        let e = at
            .entry((l.location.file.as_str(), n))
            .or_insert((0, 0, &l.location));
        e.0 = e.0.saturating_add(k.total_ns);
        e.1 = e.1.saturating_add(k.launches);
    }
    let mut sites: Vec<(u64, u64, &super::line::LocDoc)> = at.into_values().collect();
    sites.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then_with(|| (&a.2.file, a.2.line).cmp(&(&b.2.file, b.2.line)))
    });
    let sites_total = sites.len();
    let sites: Vec<Site> = sites
        .into_iter()
        .take(MAX_SITES)
        .map(|(ns, n, loc)| {
            let line = loc.line.unwrap_or(0);
            Site {
                href: format!(
                    "/sessions/{}/line?file={}&line={line}",
                    url_encode(&id),
                    url_encode(&loc.file)
                ),
                text: format!("{}:{line}", fmt::short_path(&loc.file, 48)),
                title: format!("{}:{line}", loc.file),
                function: loc
                    .function
                    .as_deref()
                    .map(|f| format!("{f}()"))
                    .unwrap_or_default(),
                launches: fmt::count(n.min(i64::MAX as u64) as i64),
                gpu: fmt::dur_u(ns),
            }
        })
        .collect();

    let cards: Vec<Card> = st
        .db
        .insights(&v.project_id, &id)
        .await?
        .iter()
        .filter(|r| about(r, &name, device))
        .map(|r| Card::from_row(r, &id))
        .collect();

    let mut tags = Vec::new();
    if k.library {
        tags.push("vendor library kernel");
    }
    if k.comm {
        tags.push("communication kernel");
    }
    let short = short_name(&name).to_string();
    render(&KernelPage {
        title: format!("{short} · GPU {device}"),
        nav: Some(v.nav()),
        session_href: format!("/sessions/{}", url_encode(&session.id)),
        session: session.id,
        short,
        device,
        others,
        tags,
        config: config_rows(&k),
        source: k
            .source
            .as_ref()
            .map(|s| match &s.note {
                Some(n) => format!("{}:{} ({n})", s.file, s.line),
                None => format!("{}:{}", s.file, s.line),
            })
            .unwrap_or_default(),
        launches: fmt::count(k.launches.min(i64::MAX as u64) as i64),
        graph_runs: k.graph_runs,
        total: fmt::dur_u(k.total_ns),
        mean: fmt::dur_u(k.mean_ns),
        p50: fmt::dur_u(k.p50_ns),
        p99: fmt::dur_u(k.p99_ns),
        busy_share: fmt::pct(k.busy_share * 100.0),
        chart: duration_bars(&k.duration_log2),
        sites,
        sites_total,
        cards,
        name,
    })
}

/// What the kernel page reads of a `lines` entry (the stack skipped).
#[derive(Deserialize, Default)]
#[serde(default)]
struct SiteDoc {
    location: super::line::LocDoc,
    kernels: Vec<super::line::LineKernelDoc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insight(title: &str, body: Value) -> InsightRow {
        InsightRow {
            ord: 0,
            severity: 2,
            category: "KERNELS".into(),
            rule: "low-occupancy".into(),
            title: title.into(),
            file: String::new(),
            line: 0,
            impact_ns: 0,
            body,
        }
    }

    #[test]
    fn insights_about_a_kernel_by_data_or_mention() {
        let k = "void ns::gemm_kernel<float>(float*, int)";
        let by_data = insight(
            "Low occupancy",
            serde_json::json!({"data": {"kernel": k, "device": 0}}),
        );
        assert!(about(&by_data, k, 0));
        assert!(!about(&by_data, k, 1));
        let site = insight(
            "x",
            serde_json::json!({"data": {"site": {"kernel": k, "device": 1}}}),
        );
        assert!(about(&site, k, 1));
        let listed = insight(
            "x",
            serde_json::json!({"data": {"kernels": [{"name": k, "device": 0}]}}),
        );
        assert!(about(&listed, k, 0));
        let mention = insight("ns::gemm_kernel spills registers", Value::Null);
        assert!(about(&mention, k, 0));
        let other = insight("Other", serde_json::json!({"data": {"kernel": "other"}}));
        assert!(!about(&other, k, 0));
    }

    #[test]
    fn duration_bars_fill_the_buckets_between() {
        assert_eq!(duration_bars(&[]), "");
        let svg = duration_bars(&[(10, 3), (15, 1)]);
        // Buckets 2^10..2^15 and the empty ones around them: eight bars.
        assert_eq!(svg.matches("<rect").count(), 8, "{svg}");
        let wide = duration_bars(&[(1, 3), (20, 1)]);
        assert_eq!(wide.matches("<rect").count(), 20, "{wide}");
        let edge = duration_bars(&[(0, 1)]);
        assert_eq!(edge.matches("<rect").count(), 8, "{edge}");
        assert!(svg.contains("3 launches of 1.0µs to 2.0µs"), "{svg}");
    }

    #[test]
    fn config_rows_name_every_figure() {
        let k: KernelDoc = serde_json::from_value(serde_json::json!({
            "launch": {"grid": [80, 1, 1], "block": [256, 1, 1], "regs": 64, "smem_static": 1024,
                       "smem_dynamic": 0, "local_mem": 16},
            "blocks": 80, "threads_per_block": 256, "configs": 2, "waves": 0.5,
            "occupancy": {"occupancy": 0.5, "warps_per_sm": 32, "blocks_per_sm": 4,
                          "limit_registers": 4, "limit_warps": 8, "limit_blocks": 32,
                          "limited_by": ["registers"]}
        }))
        .expect("parses");
        let rows = config_rows(&k);
        let get = |key: &str| {
            rows.iter()
                .find(|r| r.key == key)
                .map(|r| r.value.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("registers"), "64");
        assert_eq!(get("smem-static"), "1.0 KiB");
        assert!(get("occupancy").starts_with("50.0%"));
        assert!(get("limiter").starts_with("registers"));
        assert_eq!(get("waves"), "0.50");
    }
}
