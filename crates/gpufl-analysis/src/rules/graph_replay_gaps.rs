//! Rule `graph-replay-gaps`: a CUDA graph replayed again and again with the GPU idle between its
//! replays — the host waits for each replay (a synchronization after it) or does its own work
//! before launching the next, so the graph saves launch overhead inside a replay but the GPU still
//! waits for the host between them.
//!
//! - **Graphs** come from the shared graph summary ([`crate::shared::graphs`]): replays, the gaps between
//!   consecutive replays, the device's idle time inside them, and the host synchronizations of
//!   the launching thread that returned inside a gap.
//! - **Fires** for a graph with at least [`MIN_REPLAYS`] replays whose gaps hold device idle time
//!   of at least [`MIN_SHARE_PCT`] % of its **span** (the replays and the gaps between them).
//! - **Two findings:** when at least half the gaps hold a synchronization, *a host sync after each
//!   replay*: the line is the synchronization's, the impact the idle time in the gaps with one;
//!   otherwise, *GPU idle between replays* (the host launches the next replay late), at the graph
//!   launch's line, with the idle time in all gaps; the title says when a replay is shorter than
//!   the gap after it (tiny replays).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::{fmt_duration, in_function, Insight};
use crate::shared::graphs::GraphSummary;
use crate::shared::timeline::unknown_loc;
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "graph-replay-gaps";
/// Fewest replays of a graph for the rule to look at it.
pub const MIN_REPLAYS: u64 = 5;
/// Least share (percent) of the graph's span its idle gaps must reach.
pub const MIN_SHARE_PCT: u64 = 10;

const FIX_SYNC: &str = "Do not wait for each replay: read results every N replays (or copy them \
into pinned memory with a non-blocking copy and check an event later), and keep the next replays \
queued while the host works — or capture several steps into one graph so that one launch keeps \
the GPU busy for longer.";

const FIX_GAP: &str = "Launch the next replay before the host does its own work (queue replays \
ahead, move the host work out of the loop or onto another thread), or capture more of the step \
— several iterations, the optimizer, the data copies — into the graph, so that each launch keeps \
the GPU busy for longer.";

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub graph: GraphSummary,
}

pub(crate) fn run(cx: &Ctx, graphs: &[GraphSummary]) -> Vec<Insight> {
    let mut out = Vec::new();
    for g in graphs {
        if g.replays < MIN_REPLAYS || g.gaps == 0 {
            continue;
        }
        let window = g.replay_total_ns.saturating_add(g.gap_total_ns);
        if (g.gap_idle_ns as u128) * 100 < (window as u128) * MIN_SHARE_PCT as u128 {
            continue;
        }
        let synced = g.gaps_with_sync * 2 >= g.gaps && g.sync_gap_idle_ns > 0;
        let launch_at = g
            .launch_location
            .as_ref()
            .map(|l| format!(" launched at {}{}", l.short(), in_function(l)))
            .unwrap_or_default();
        let per_replay = format!(
            "{} per replay (median; {} nodes, {} operations in all)",
            fmt_duration(g.replay_median_ns),
            g.nodes,
            g.ops
        );
        let top = g
            .top
            .iter()
            .take(3)
            .map(|o| {
                format!(
                    "{} {:.0}%",
                    crate::insight::short_function(&o.name),
                    o.share * 100.0
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let (title, impact, location, fix, detail) = if synced {
            let location = g
                .sync_location
                .clone()
                .or_else(|| g.launch_location.clone())
                .unwrap_or_else(unknown_loc);
            let impact = g.sync_gap_idle_ns;
            (
                format!(
                    "CUDA graph {} × {} replays, a host sync after each @ {} · GPU idle {} between replays",
                    g.graph,
                    g.replays,
                    location.short(),
                    fmt_duration(impact)
                ),
                impact,
                location,
                FIX_SYNC,
                format!(
                    "Graph {}{launch_at} ran {} replays on GPU {}: {per_replay}. In {} of the {} gaps \
                     between replays the launching thread waited in a synchronization ({} blocked \
                     in all) before launching the next replay, and the GPU idled {} in those gaps \
                     (median gap {}). Most of a replay's time: {top}.",
                    g.graph,
                    g.replays,
                    g.device,
                    g.gaps_with_sync,
                    g.gaps,
                    fmt_duration(g.sync_blocked_ns),
                    fmt_duration(impact),
                    fmt_duration(g.gap_median_ns),
                ),
            )
        } else {
            let location = g.launch_location.clone().unwrap_or_else(unknown_loc);
            let impact = g.gap_idle_ns;
            let tiny = g.replay_median_ns < g.gap_median_ns;
            (
                format!(
                    "CUDA graph {} × {} replays @ {} · {}GPU idle {} between replays",
                    g.graph,
                    g.replays,
                    location.short(),
                    if tiny { "tiny replays, " } else { "" },
                    fmt_duration(impact)
                ),
                impact,
                location,
                FIX_GAP,
                format!(
                    "Graph {}{launch_at} ran {} replays on GPU {}: {per_replay}; the gaps between \
                     replays (median {}) left the GPU idle {} in all{}. Most of a replay's time: {top}.",
                    g.graph,
                    g.replays,
                    g.device,
                    fmt_duration(g.gap_median_ns),
                    fmt_duration(impact),
                    if tiny {
                        ": a replay is shorter than the wait before the next"
                    } else {
                        ""
                    },
                ),
            )
        };
        out.push(
            Insight::new(RULE, location, title, detail, fix)
                .count(g.replays)
                .impact(impact, window, cx.wall_ns)
                .blocked(if synced { g.sync_blocked_ns } else { 0 })
                .gpu_idle(impact)
                .data(Data { graph: g.clone() }),
        );
    }
    out
}
