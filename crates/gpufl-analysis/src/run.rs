//! Runs: the sessions of one job analysed together — one `gpufl record` of a launcher such as
//! `torchrun` writes one session per process (docs/trace-format.md, "Run directories"). A run has
//! a summary per rank (processes with CUDA work, side by side), the processes without CUDA work
//! folded into one line, and the cross-rank rule `collective-wait`
//! ([`crate::rules::collective_wait`]). Each session keeps its own [`Analysis`].

use crate::insight::{Insight, Severity};
use crate::rules::collective_wait::{self, ClockAlignment};
use crate::{Analysis, Config, Model};
use serde::Serialize;

/// One session of a run, already analysed.
pub struct RunMember<'a> {
    /// The session's name (its directory's name).
    pub name: String,
    pub model: &'a Model,
    pub analysis: &'a Analysis,
}

/// The GPU a rank used: the device with most of its kernel time.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GpuUsed {
    /// CUDA device ordinal in the process (as `dev` of its records).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// Other devices with work in the process.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<u32>,
}

/// The highest-ranked insight of a session.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct TopInsight {
    pub rule: &'static str,
    pub severity: Severity,
    pub title: String,
}

/// One process with CUDA work (a rank, when its launcher said so).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct RankSummary {
    /// Index of the session among the run's members.
    pub member: usize,
    pub session: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    pub host: String,
    pub pid: u32,
    pub app: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuUsed>,
    pub wall_ns: u64,
    pub gpu_busy_pct: f64,
    pub kernels: u64,
    /// Communication kernels ([`crate::comm::is_comm_kernel`]) and their GPU time.
    pub comm_kernels: u64,
    pub comm_ns: u64,
    pub syncs: u64,
    pub sync_blocked_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_insight: Option<TopInsight>,
}

/// The processes without CUDA work (no kernel, copy or memset: a launcher, a data loader
/// worker), folded into one line.
#[derive(Serialize, Clone, Debug, PartialEq, Default)]
pub struct Folded {
    pub processes: u32,
    pub pids: Vec<u32>,
    /// Distinct application names.
    pub apps: Vec<String>,
    /// Their NVML telemetry samples (the recorder samples every GPU in every process).
    pub telemetry_samples: u64,
}

/// What [`analyze_run`] finds.
#[derive(Serialize, Clone, Debug)]
pub struct RunAnalysis {
    /// Sessions in the run.
    pub processes: u32,
    /// Processes with CUDA work, by rank (processes without one last, by pid).
    pub ranks: Vec<RankSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without_cuda_work: Option<Folded>,
    /// How the ranks' clocks were aligned (absent with fewer than two ranks with communication
    /// kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockAlignment>,
    /// Cross-rank insights, ranked by impact.
    pub insights: Vec<Insight>,
    pub warnings: Vec<String>,
}

/// Summarize the sessions of one run side by side and run the cross-rank rules.
pub fn analyze_run(members: &[RunMember], cfg: &Config) -> RunAnalysis {
    let mut ranks = Vec::new();
    let mut folded = Folded::default();
    let mut warnings = Vec::new();
    for (i, mb) in members.iter().enumerate() {
        let m = mb.model;
        let h = m.header();
        let t = &mb.analysis.totals;
        if t.kernels + t.copies + t.memsets == 0 {
            folded.processes += 1;
            folded.pids.push(h.map_or(0, |h| h.pid));
            let app = h.map(|h| h.app_name.clone()).unwrap_or_default();
            if !folded.apps.contains(&app) {
                folded.apps.push(app);
            }
            folded.telemetry_samples += m.telemetry().iter().map(|s| s.len() as u64).sum::<u64>();
            continue;
        }
        // Kernel time per device, and communication kernels.
        let mut per_dev: Vec<(u32, u64)> = Vec::new();
        let (mut comm_kernels, mut comm_ns) = (0u64, 0u64);
        for k in m.kernels() {
            let d = k.end.saturating_sub(k.start);
            match per_dev.iter_mut().find(|x| x.0 == k.dev) {
                Some(x) => x.1 += d,
                None => per_dev.push((k.dev, d)),
            }
            if crate::comm::is_comm_kernel(m.str(k.name)) {
                comm_kernels += 1;
                comm_ns += d;
            }
        }
        per_dev.sort_by_key(|x| (std::cmp::Reverse(x.1), x.0));
        let gpu = per_dev.first().map(|&(dev, _)| {
            let g = h.and_then(|h| h.gpus.iter().find(|g| g.index == dev));
            GpuUsed {
                index: dev,
                name: g.map(|g| g.name.clone()).unwrap_or_default(),
                uuid: g.map(|g| g.uuid.clone()).unwrap_or_default(),
                others: per_dev[1..].iter().map(|x| x.0).collect(),
            }
        });
        ranks.push(RankSummary {
            member: i,
            session: mb.name.clone(),
            rank: h.and_then(|h| h.rank),
            local_rank: h.and_then(|h| h.local_rank),
            world_size: h.and_then(|h| h.world_size),
            host: h.map(|h| h.host.clone()).unwrap_or_default(),
            pid: h.map_or(0, |h| h.pid),
            app: h.map(|h| h.app_name.clone()).unwrap_or_default(),
            gpu,
            wall_ns: t.wall_ns,
            gpu_busy_pct: t.gpu_busy_pct,
            kernels: t.kernels,
            comm_kernels,
            comm_ns,
            syncs: t.syncs,
            sync_blocked_ns: t.sync_blocked_ns,
            top_insight: mb.analysis.insights.first().map(|i| TopInsight {
                rule: i.rule,
                severity: i.severity,
                title: i.title.clone(),
            }),
        });
    }
    ranks.sort_by_key(|r| (r.rank.is_none(), r.rank, r.pid, r.member));
    // Two processes claiming one rank: the launcher's variables leaked into a child, or sessions
    // of several runs were given together.
    for w in ranks.windows(2) {
        if let (Some(a), Some(b)) = (w[0].rank, w[1].rank) {
            if a == b && w[0].host == w[1].host {
                warnings.push(format!(
                    "pids {} and {} both say rank {a}: ranks are told apart by position for the cross-rank rules",
                    w[0].pid, w[1].pid
                ));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    let unique = ranks.iter().all(|r| r.rank.is_some_and(|x| seen.insert(x)));
    let parts = ranks
        .iter()
        .enumerate()
        .map(|(pos, r)| {
            collective_wait::Rank::new(
                members[r.member].model,
                if unique {
                    r.rank.unwrap_or(pos as u32)
                } else {
                    pos as u32
                },
                r.session.clone(),
            )
        })
        .collect();
    let (mut insights, clock, w) = collective_wait::run(parts, cfg);
    warnings.extend(w);
    // Rated on the longest rank's wall time (the run's span, as near as one rank says); in an
    // always-on run on the time every rank observed (the shared windows), where the impacts were
    // measured, as an always-on session's insights are rated on its observed time.
    let run_wall = ranks.iter().map(|r| r.wall_ns).max().unwrap_or(0);
    let rated_on = clock
        .as_ref()
        .and_then(|c| c.windows.as_ref())
        .map(|w| w.observed_ns)
        .filter(|&ns| ns > 0)
        .map_or(run_wall, |ns| ns.min(run_wall.max(1)));
    crate::shared::finish::rate(&mut insights, rated_on);
    // The rule sees the ranks, not the run: its share of the wall is the run's.
    for i in insights.iter_mut() {
        i.share_of_wall = crate::insight::share(i.impact_ns, run_wall);
    }
    crate::shared::finish::rank(&mut insights);
    let insights = crate::shared::finish::merge(insights);
    RunAnalysis {
        processes: members.len() as u32,
        ranks,
        without_cuda_work: (folded.processes > 0).then_some(folded),
        clock,
        insights,
        warnings,
    }
}
