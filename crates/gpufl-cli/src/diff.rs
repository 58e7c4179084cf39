//! `gpufl diff BASE NEW`: two sessions compared (the comparison is `gpufl_analysis::diff`'s).
//!
//! Exit status: 0 (compared; no regression beyond `--fail-on-regression`, or no such option),
//! [`EXIT_REGRESSION`] (something regressed beyond it), 2 (an error: a path that is not one
//! session, a bad option).

use crate::report::style::{clip, secs};
use crate::summary::expand_sessions;
use crate::term::{esc, esc_path};
use anyhow::{bail, Result};
use clap::Args;
use gpufl_analysis::diff::{
    self, describe, pct_text, Delta, Diff, FDelta, GraphDelta, GraphMatch, InsightDelta, Options,
    Profile, Status,
};
use gpufl_analysis::kernels::short_name;
use gpufl_analysis::{analyze_on, fmt_bytes, Config, FrameOrigin, Model, Severity, SourceLoc};
use gpufl_trace::ParSessionReader;
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Exit status of a diff that found a regression beyond `--fail-on-regression`.
pub const EXIT_REGRESSION: i32 = 3;

#[derive(Args)]
pub struct DiffArgs {
    /// The baseline: a session directory (or a directory holding exactly one session).
    base: PathBuf,
    /// The session to compare with it.
    new: PathBuf,
    /// Print the comparison as JSON (stable field names) instead of text.
    #[arg(long)]
    json: bool,
    /// Hide changes smaller than PCT of the baseline's figure (`1`, `1%`, `0.5 %`; 0 shows every
    /// change).
    #[arg(long, value_name = "PCT", default_value = "1%", value_parser = parse_pct)]
    threshold: f64,
    /// Exit with status 3 when wall time, host blocked time (in syncs and blocking copies) or GPU
    /// busy time grew by more than PCT of the baseline, or a HIGH insight is new (the regressions are listed).
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    fail_on_regression: Option<f64>,
    /// Rows per table in the text output (0 = all).
    #[arg(long, value_name = "N", default_value_t = 20)]
    limit: usize,
    /// Count frames whose file or module contains PATTERN as user code (repeatable; as `report`).
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Never pick frames whose file or module contains PATTERN as the user frame (repeatable).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Your own code where it would count as a library (repeatable; also GPUFL_USER_PATHS).
    #[arg(long = "user-path", value_name = "PATTERN")]
    user_path: Vec<String>,
    /// Threads to decode and analyse with (default: GPUFL_THREADS, else every available core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// `5`, `5%`, `5 %`, `0.5%` → 5.0, 5.0, 5.0, 0.5.
fn parse_pct(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim_end();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "expected a percentage ≥ 0 such as 5 or 5%, got {s:?}"
        )),
    }
}

/// One side of the comparison, as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct Side {
    session: String,
    command: Vec<String>,
    warnings: Vec<String>,
}

/// The `--json` output.
#[derive(Serialize)]
struct Output<'a> {
    base: &'a Side,
    new: &'a Side,
    #[serde(flatten)]
    diff: &'a Diff,
    regressed: bool,
    exit_status: i32,
}

/// The one session `p` names.
fn one_session(p: &Path) -> Result<PathBuf> {
    let mut found = expand_sessions(&[p.to_path_buf()])?;
    if found.len() > 1 {
        bail!(
            "{} holds {} sessions; pass one session directory (e.g. {})",
            esc_path(p),
            found.len(),
            esc_path(&found[0])
        );
    }
    Ok(found.remove(0))
}

pub(crate) fn load(p: &Path, cfg: &Config, threads: usize) -> Result<(Side, Profile)> {
    let dir = one_session(p)?;
    let mut reader = ParSessionReader::open(&dir, threads)?;
    let mut model = Model::load(reader.by_ref());
    model.add_warnings(reader.warnings());
    let analysis = analyze_on(&model, cfg, threads);
    let profile = diff::profile(&model, &analysis, cfg);
    let side = Side {
        session: dir.display().to_string(),
        command: model
            .header()
            .map(|h| h.command_line.clone())
            .unwrap_or_default(),
        warnings: analysis.warnings,
    };
    Ok((side, profile))
}

pub fn run(args: DiffArgs) -> Result<i32> {
    let cfg = crate::options::analysis_config(&args.include, &args.exclude, &args.user_path);
    let threads = crate::options::threads(args.threads);
    let (base, bp) = load(&args.base, &cfg, threads)?;
    let (new, np) = load(&args.new, &cfg, threads)?;
    let opts = Options {
        threshold_pct: args.threshold,
        fail_on_regression_pct: args.fail_on_regression,
    };
    let d = diff::diff(&bp, &np, &opts)?;
    let code = if d.regressed() { EXIT_REGRESSION } else { 0 };
    if args.json {
        let out = Output {
            base: &base,
            new: &new,
            diff: &d,
            regressed: d.regressed(),
            exit_status: code,
        };
        let mut s = serde_json::to_string_pretty(&out)?;
        s.push('\n');
        crate::term::print(&s)?;
    } else {
        crate::term::print(&render_text(&base, &new, &d, args.limit))?;
    }
    Ok(code)
}

/// `+1.20 ms`, `-3.4 µs`, `0`.
fn signed_secs(d: i64) -> String {
    match d.signum() {
        0 => "0".to_string(),
        1 => format!("+{}", secs(d.unsigned_abs())),
        _ => format!("-{}", secs(d.unsigned_abs())),
    }
}

/// `+12`, `-3`, `0`.
fn signed(d: i64) -> String {
    if d > 0 {
        format!("+{d}")
    } else {
        d.to_string()
    }
}

/// A time in one session: `-` where the thing is absent there.
fn side_secs(ns: u64, present: bool) -> String {
    if present {
        secs(ns)
    } else {
        "-".to_string()
    }
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::High => "HIGH",
        Severity::Medium => "MEDIUM",
        Severity::Low => "LOW",
    }
}

/// `… and 12 more (--limit 0 shows all)`.
fn more(out: &mut String, total: usize, shown: usize) {
    if total > shown {
        let _ = writeln!(
            out,
            "    … and {} more (--limit 0 shows all)",
            total - shown
        );
    }
}

/// Counts by status: `2 new, 1 gone, 3 changed, 4 unchanged`.
fn counts(statuses: impl Iterator<Item = Status>, hidden: u64) -> String {
    let (mut n, mut g, mut c) = (0, 0, 0);
    for s in statuses {
        match s {
            Status::New => n += 1,
            Status::Gone => g += 1,
            Status::Changed => c += 1,
        }
    }
    format!("{n} new, {g} gone, {c} changed, {hidden} unchanged or under the threshold")
}

fn total_row(out: &mut String, what: &str, d: &Delta, time: bool) {
    let (b, n, delta) = if time {
        (secs(d.base), secs(d.new), signed_secs(d.delta))
    } else {
        (d.base.to_string(), d.new.to_string(), signed(d.delta))
    };
    let pct = if d.delta == 0 {
        String::new()
    } else {
        pct_text(d.pct)
    };
    let row = format!("    {what:<20} {b:>12} {n:>12} {delta:>13} {pct:>10}");
    let _ = writeln!(out, "{}", row.trim_end());
}

fn rate_text(r: &FDelta, unit: &str) -> String {
    format!("{:.1} → {:.1}{unit}", r.base, r.new)
}

/// The text comparison. Every string from a trace is escaped for the terminal ([`esc`]).
pub(crate) fn render_text(base: &Side, new: &Side, d: &Diff, limit: usize) -> String {
    let mut out = String::new();
    let o = &mut out;
    heading(o, base, new, d);
    totals(o, d);
    kernels(o, d, limit);
    graphs(o, d, limit);
    memory(o, d, limit);
    lines(o, d, limit);
    insights(o, d, limit);
    regressions(o, d);
    out
}

/// Rows shown of `n`: all with `--limit 0`, else at most `limit`.
fn cap(limit: usize, n: usize) -> usize {
    if limit == 0 {
        n
    } else {
        n.min(limit)
    }
}

/// The two sessions (path, command, warnings) and the threshold.
fn heading(o: &mut String, base: &Side, new: &Side, d: &Diff) {
    let _ = writeln!(o, "gpufl diff");
    for (label, s) in [("base", base), ("new ", new)] {
        let _ = writeln!(o, "  {label}  {}", esc(&s.session));
        if !s.command.is_empty() {
            let _ = writeln!(o, "        {}", esc(&s.command.join(" ")));
        }
        for w in &s.warnings {
            let _ = writeln!(o, "        warning: {}", esc(w));
        }
    }
    let _ = writeln!(
        o,
        "  changes under {} % of the base are hidden; relative changes are against the base",
        d.threshold_pct
    );
    if d.is_unchanged() {
        let _ = writeln!(o, "  No change beyond the threshold.");
    }
}

/// Totals: the sessions' headline figures under the names `gpufl report`, `gpufl info` and the
/// dashboard give them (wall, GPU busy share and time, kernels, syncs, host blocked in syncs and
/// in blocking copies, GPU idle), then copies and memsets; rates per second where the sessions'
/// lengths differ.
fn totals(o: &mut String, d: &Diff) {
    use gpufl_analysis::headline::names;
    let t = &d.totals;
    let _ = writeln!(
        o,
        "\n  {:<22} {:>12} {:>12} {:>13} {:>10}",
        "Totals", "base", "new", "delta", "change"
    );
    total_row(o, names::WALL, &t.wall_ns, true);
    let _ = writeln!(
        o,
        "    {:<20} {:>12} {:>12} {:>13}",
        names::GPU_BUSY,
        format!("{:.1} %", t.gpu_busy_pct.base),
        format!("{:.1} %", t.gpu_busy_pct.new),
        format!("{:+.1} pts", t.gpu_busy_pct.delta)
    );
    total_row(o, names::GPU_BUSY_TIME, &t.gpu_busy_ns, true);
    total_row(o, names::KERNELS, &t.kernels, false);
    total_row(o, names::SYNCS, &t.syncs, false);
    total_row(o, names::HOST_BLOCKED, &t.host_blocked_ns, true);
    total_row(
        o,
        &format!("  {}", names::IN_SYNCS),
        &t.sync_blocked_ns,
        true,
    );
    total_row(
        o,
        &format!("  {}", names::IN_BLOCKING_COPIES),
        &t.copy_blocked_ns,
        true,
    );
    total_row(o, names::GPU_IDLE, &t.gpu_idle_ns, true);
    total_row(o, names::COPIES, &t.copies, false);
    total_row(o, names::MEMSETS, &t.memsets, false);
    if t.wall_ns.moved(d.threshold_pct) {
        let r = &t.per_second;
        let share =
            |f: &FDelta| format!("{:.2} % → {:.2} % of the time", f.base / 1e7, f.new / 1e7);
        let _ = writeln!(
            o,
            "  The sessions differ in length ({} wall): absolute deltas include that. Per second of wall: kernels {}, syncs {}, copies {}, host blocked in syncs {}, GPU busy {}.",
            pct_text(t.wall_ns.pct),
            rate_text(&r.kernels, "/s"),
            rate_text(&r.syncs, "/s"),
            rate_text(&r.copies, "/s"),
            share(&r.sync_blocked_ns),
            share(&r.gpu_busy_ns),
        );
    }
}

/// Kernels matched by name, their launches and GPU time.
fn kernels(o: &mut String, d: &Diff, limit: usize) {
    let _ = writeln!(
        o,
        "\n  Kernels ({}; matched by name over all GPUs)",
        counts(d.kernels.iter().map(|k| k.status), d.kernels_hidden)
    );
    if !d.kernels.is_empty() {
        let _ = writeln!(
            o,
            "    {:<8} {:>17} {:>25} {:>12} {:>9}  kernel",
            "", "launches", "GPU time", "delta", "change"
        );
        let shown = &d.kernels[..cap(limit, d.kernels.len())];
        let shorts: Vec<&str> = shown.iter().map(|k| short_name(&k.name)).collect();
        // The short name, unless another row shares it: then the name with its template
        // arguments (the parameter list clipped), told apart where those read the same clipped.
        let names: Vec<String> = shown
            .iter()
            .zip(&shorts)
            .map(|(k, short)| {
                if shorts.iter().filter(|s| *s == short).count() > 1 {
                    k.name.strip_prefix("void ").unwrap_or(&k.name).to_string()
                } else {
                    short.to_string()
                }
            })
            .collect();
        let full: Vec<&str> = shown.iter().map(|k| k.name.as_str()).collect();
        let names = gpufl_analysis::kernels::distinct_names(&names, &full, 70);
        for (k, name) in shown.iter().zip(&names) {
            let (inb, inn) = (k.status != Status::New, k.status != Status::Gone);
            let _ = writeln!(
                o,
                "    {:<8} {:>17} {:>25} {:>12} {:>9}  {}",
                k.status.as_str(),
                format!("{} → {}", k.launches.base, k.launches.new),
                format!(
                    "{} → {}",
                    side_secs(k.total_ns.base, inb),
                    side_secs(k.total_ns.new, inn)
                ),
                signed_secs(k.total_ns.delta),
                if k.status == Status::New {
                    String::new()
                } else {
                    pct_text(k.total_ns.pct)
                },
                clip(&esc(name), 70)
            );
        }
        more(o, d.kernels.len(), cap(limit, d.kernels.len()));
    }
}

/// CUDA graphs, when the sessions replayed any: replays, time per replay, GPU idle between.
fn graphs(o: &mut String, d: &Diff, limit: usize) {
    if !d.graphs.is_empty() || d.graphs_hidden > 0 {
        let _ = writeln!(
            o,
            "\n  CUDA graphs ({}; matched by launch line, else by their top operations)",
            counts(d.graphs.iter().map(|g| g.status), d.graphs_hidden)
        );
        if !d.graphs.is_empty() {
            let _ = writeln!(
                o,
                "    {:<8} {:>11} {:>25} {:>12} {:>9} {:>25} {:>25}  graph",
                "",
                "replays",
                "time per replay",
                "delta",
                "change",
                "replay time",
                "GPU idle between"
            );
            for g in d.graphs.iter().take(cap(limit, d.graphs.len())) {
                graph_row(o, g);
            }
            more(o, d.graphs.len(), cap(limit, d.graphs.len()));
        }
    }
}

/// Bytes with a sign: `+256.0 MiB`, `-1.00 GiB`, `0 B`.
fn signed_bytes(d: i64) -> String {
    let b = fmt_bytes(d.unsigned_abs());
    match d.signum() {
        1 => format!("+{b}"),
        -1 => format!("-{b}"),
        _ => b,
    }
}

/// Memory, when either session has `mem` records: each device's peak, then the allocating lines
/// whose live bytes at the peak (or allocations) moved.
fn memory(o: &mut String, d: &Diff, limit: usize) {
    let Some(m) = &d.memory else {
        return;
    };
    let _ = writeln!(o, "\n  Memory: peak live bytes of the process per device");
    for dv in &m.devices {
        let p = &dv.peak_bytes;
        let row = format!(
            "    {:<8} GPU {:<3} {:>12} {:>12} {:>13} {:>10}",
            dv.status.map_or("", |s| s.as_str()),
            dv.device,
            fmt_bytes(p.base),
            fmt_bytes(p.new),
            signed_bytes(p.delta),
            if p.delta == 0 {
                String::new()
            } else {
                pct_text(p.pct)
            }
        );
        let _ = writeln!(o, "{}", row.trim_end());
    }
    let _ = writeln!(
        o,
        "\n  Memory by allocating line: live at the peak ({})",
        counts(m.lines.iter().map(|l| l.status), m.lines_hidden)
    );
    if !m.lines.is_empty() {
        let _ = writeln!(
            o,
            "    {:<8} {:>25} {:>13} {:>13}  line",
            "", "live at the peak", "delta", "allocations"
        );
        for l in m.lines.iter().take(cap(limit, m.lines.len())) {
            let _ = writeln!(
                o,
                "    {:<8} {:>25} {:>13} {:>13}  GPU {} {}",
                l.status.as_str(),
                format!(
                    "{} → {}",
                    fmt_bytes(l.peak_live.base),
                    fmt_bytes(l.peak_live.new)
                ),
                signed_bytes(l.peak_live.delta),
                format!("{} → {}", l.allocs.base, l.allocs.new),
                l.device,
                esc(&l.location.location)
            );
        }
        more(o, m.lines.len(), cap(limit, m.lines.len()));
    }
}

/// Sync and copy time per source line.
fn lines(o: &mut String, d: &Diff, limit: usize) {
    let _ = writeln!(
        o,
        "\n  Lines: sync and copy time per source line ({})",
        counts(d.lines.iter().map(|l| l.status), d.lines_hidden)
    );
    if !d.lines.is_empty() {
        let _ = writeln!(
            o,
            "    {:<8} {:>11} {:>25} {:>12} {:>11} {:>25}  line",
            "", "syncs", "blocked in syncs", "delta", "copies", "copy time (GPU)"
        );
        for l in d.lines.iter().take(cap(limit, d.lines.len())) {
            line_row(o, l);
        }
        more(o, d.lines.len(), cap(limit, d.lines.len()));
    }
}

/// One source line: syncs and time blocked in them, copies and their GPU time.
fn line_row(o: &mut String, l: &diff::LineDelta) {
    let (inb, inn) = (l.status != Status::New, l.status != Status::Gone);
    // Columns of a kind the line has in neither session stay blank.
    let (syncs, blocked, delta) = if l.syncs.base == 0 && l.syncs.new == 0 {
        Default::default()
    } else {
        (
            format!("{} → {}", l.syncs.base, l.syncs.new),
            format!(
                "{} → {}",
                side_secs(l.sync_blocked_ns.base, inb),
                side_secs(l.sync_blocked_ns.new, inn)
            ),
            signed_secs(l.sync_blocked_ns.delta),
        )
    };
    let (copies, copy_ns) = if l.copies.base == 0 && l.copies.new == 0 {
        Default::default()
    } else {
        (
            format!("{} → {}", l.copies.base, l.copies.new),
            format!(
                "{} → {}",
                side_secs(l.copy_ns.base, inb),
                side_secs(l.copy_ns.new, inn)
            ),
        )
    };
    let _ = writeln!(
        o,
        "    {:<8} {:>11} {:>25} {:>12} {:>11} {:>25}  {}",
        l.status.as_str(),
        syncs,
        blocked,
        delta,
        copies,
        copy_ns,
        place(&l.location)
    );
}

/// Insights matched by rule and location.
fn insights(o: &mut String, d: &Diff, limit: usize) {
    let _ = writeln!(
        o,
        "\n  Insights ({}; matched by rule and location)",
        counts(d.insights.iter().map(|i| i.status), d.insights_hidden)
    );
    for i in d.insights.iter().take(cap(limit, d.insights.len())) {
        insight_row(o, i);
    }
    more(o, d.insights.len(), cap(limit, d.insights.len()));
}

/// With `--fail-on-regression`: what regressed beyond it, or that nothing did.
fn regressions(o: &mut String, d: &Diff) {
    if let Some(f) = d.fail_on_regression_pct {
        if d.regressions.is_empty() {
            let _ = writeln!(o, "\n  No regression beyond {f} %.");
        } else {
            let _ = writeln!(
                o,
                "\n  Regressions beyond {f} % (exit status {EXIT_REGRESSION}):"
            );
            for r in &d.regressions {
                let _ = writeln!(o, "    {}", esc(&r.detail));
            }
        }
    }
}

/// Where a line or insight is, escaped: `file:line  function`, `kernel NAME`, `GPU 0`.
fn place(l: &SourceLoc) -> String {
    match l.origin {
        FrameOrigin::Kernel => format!("kernel {}", esc(&l.file)),
        FrameOrigin::Device => esc(&l.file).into_owned(),
        _ => esc(&describe(l)).into_owned(),
    }
}

/// One graph: its figures, then the launch line (or its top operations) and CUPTI's ids.
fn graph_row(o: &mut String, g: &GraphDelta) {
    let (inb, inn) = (g.status != Status::New, g.status != Status::Gone);
    let both = |d: &Delta| format!("{} → {}", side_secs(d.base, inb), side_secs(d.new, inn));
    let what = match (&g.launch_location, g.matched_by) {
        (Some(l), GraphMatch::Line) => place(l),
        _ => {
            let ops: Vec<&str> = g.ops.iter().map(|n| short_name(n)).collect();
            format!("no launch line · {}", clip(&esc(&ops.join(", ")), 70))
        }
    };
    let dev = |s: &diff::GraphSide| {
        if s.device == 0 {
            format!("{}", s.graph)
        } else {
            format!("{} on GPU {}", s.graph, s.device)
        }
    };
    let ids = match (&g.base, &g.new) {
        (Some(b), Some(n)) if b == n => format!("graph {}", dev(b)),
        (Some(b), Some(n)) => format!("graph {} → {}", dev(b), dev(n)),
        (Some(s), None) | (None, Some(s)) => format!("graph {}", dev(s)),
        (None, None) => String::new(),
    };
    let _ = writeln!(
        o,
        "    {:<8} {:>11} {:>25} {:>12} {:>9} {:>25} {:>25}  {what} · {ids}",
        g.status.as_str(),
        format!("{} → {}", g.replays.base, g.replays.new),
        both(&g.replay_median_ns),
        signed_secs(g.replay_median_ns.delta),
        if g.status == Status::Changed && g.replay_median_ns.delta != 0 {
            pct_text(g.replay_median_ns.pct)
        } else {
            String::new()
        },
        both(&g.replay_total_ns),
        both(&g.gap_idle_ns),
    );
}

fn insight_row(o: &mut String, i: &InsightDelta) {
    let sev = match (&i.base, &i.new) {
        (Some(b), Some(n)) if b.severity != n.severity => {
            format!("{} → {}", severity(b.severity), severity(n.severity))
        }
        _ => severity(i.side().severity).to_string(),
    };
    let impact = match i.status {
        Status::New => format!("impact {}", secs(i.impact_ns.new)),
        Status::Gone => format!("impact was {}", secs(i.impact_ns.base)),
        Status::Changed if i.impact_ns.delta == 0 => format!("impact {}", secs(i.impact_ns.new)),
        Status::Changed => format!(
            "impact {} → {} ({})",
            secs(i.impact_ns.base),
            secs(i.impact_ns.new),
            pct_text(i.impact_ns.pct)
        ),
    };
    let _ = writeln!(
        o,
        "    {:<8} {:<15} [{}] {}",
        i.status.as_str(),
        sev,
        esc(&i.rule),
        esc(&i.side().title)
    );
    let mut count = String::new();
    if i.status == Status::Changed && i.count.delta != 0 {
        count = format!(" · count {} → {}", i.count.base, i.count.new);
    }
    let _ = writeln!(
        o,
        "    {:<8} {:<15} {impact}{count} · at {}",
        "",
        "",
        place(&i.location)
    );
}

#[cfg(test)]
mod tests {
    use super::parse_pct;

    #[test]
    fn percentages_parse_with_or_without_the_sign() {
        assert_eq!(parse_pct("5"), Ok(5.0));
        assert_eq!(parse_pct("5%"), Ok(5.0));
        assert_eq!(parse_pct(" 2.5 % "), Ok(2.5));
        assert_eq!(parse_pct("0"), Ok(0.0));
        assert!(parse_pct("-1%").is_err());
        assert!(parse_pct("NaN").is_err());
        assert!(parse_pct("five").is_err());
        assert!(parse_pct("%").is_err());
    }
}
