//! The CUDA graphs section of `gpufl report`: per graph, its replays, the graph launch's line,
//! time per replay, the gaps between replays and the host syncs in them, and the operations with
//! the most time (`--json` has every figure).

use crate::term::esc;
use gpufl_analysis::{fmt_duration, GraphSummary, SourceLoc};
use std::fmt::Write;

/// Graphs shown at most (the most GPU time first); the rest are counted.
pub const MAX_GRAPHS: usize = 8;

fn at(loc: &Option<SourceLoc>) -> String {
    match loc {
        Some(l) => {
            let f = l
                .function
                .as_deref()
                .map(|f| format!(" in {}()", gpufl_analysis::insights::short_function(f)))
                .unwrap_or_default();
            format!(" at {}", esc(&format!("{}{f}", l.short())))
        }
        None => String::new(),
    }
}

pub fn render(out: &mut String, graphs: &[GraphSummary]) {
    if graphs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n  CUDA graphs ({}, most GPU time first)",
        graphs.len()
    );
    for g in graphs.iter().take(MAX_GRAPHS) {
        let busy = if g.replay_total_ns > 0 {
            100.0 * g.busy_ns as f64 / g.replay_total_ns as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "    graph {} on GPU {} · {} replays{} · {} per replay (p99 {}) · {} nodes · GPU busy {:.0} % of a replay",
            g.graph,
            g.device,
            g.replays,
            at(&g.launch_location),
            fmt_duration(g.replay_median_ns),
            fmt_duration(g.replay_p99_ns),
            g.nodes,
            busy
        );
        if g.gaps > 0 {
            let mut line = format!(
                "      between replays: median {}, GPU idle {} in all",
                fmt_duration(g.gap_median_ns),
                fmt_duration(g.gap_idle_ns)
            );
            if g.gaps_with_sync > 0 {
                let _ = write!(
                    line,
                    "; the host waited in a sync in {} of {} gaps{} ({} blocked)",
                    g.gaps_with_sync,
                    g.gaps,
                    at(&g.sync_location),
                    fmt_duration(g.sync_blocked_ns)
                );
            }
            let _ = writeln!(out, "{line}");
        }
        if g.capture_location.is_some() {
            let _ = writeln!(out, "      captured{}", at(&g.capture_location));
        }
        if let Some(l) = g.launch_call_median_ns {
            let _ = writeln!(
                out,
                "      launch call: median {} for {} operations",
                fmt_duration(l),
                g.ops / g.replays.max(1)
            );
        }
        let top: Vec<String> = g
            .top
            .iter()
            .map(|o| {
                let at = o
                    .created_at
                    .as_ref()
                    .map(|l| format!(" from {}", esc(&l.short())))
                    .unwrap_or_default();
                format!(
                    "{} {:.0} %{at}",
                    esc(gpufl_analysis::insights::short_function(&o.name)),
                    o.share * 100.0
                )
            })
            .collect();
        if !top.is_empty() {
            let _ = writeln!(out, "      most time: {}", top.join(", "));
        }
    }
    if graphs.len() > MAX_GRAPHS {
        let _ = writeln!(
            out,
            "    … {} more graphs (--json lists every one)",
            graphs.len() - MAX_GRAPHS
        );
    }
}
