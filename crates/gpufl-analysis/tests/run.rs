//! Runs: several sessions of one job analysed together (`analyze_run`), over the synthetic 2-rank
//! DDP run of `common/ddp_run.rs` (a straggler planted on rank 1, and its balanced twin).

#[path = "common/ddp_run.rs"]
mod ddp_run;

use ddp_run::*;
use gpufl_analysis::insights::collective_wait::ClockMethod;
use gpufl_analysis::{analyze, analyze_run, Analysis, Config, Model, RuleData, RunMember};
use std::path::{Path, PathBuf};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "gpufl-run-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(dir: &Path) -> (String, Model, Analysis) {
    let mut r = gpufl_trace::SessionReader::open(dir).unwrap();
    let mut m = Model::load(r.by_ref());
    m.add_warnings(r.warnings());
    let a = analyze(&m, &Config::default());
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    (name, m, a)
}

fn run_of(plan: Plan, tag: &str) -> (gpufl_analysis::RunAnalysis, Vec<(String, Model, Analysis)>) {
    let tmp = TempDir::new(tag);
    let dir = write_run_dir(&tmp.0, plan);
    let sessions: Vec<_> = gpufl_trace::session::find_sessions(&dir)
        .iter()
        .map(|d| load(d))
        .collect();
    assert_eq!(sessions.len(), 3, "launcher + 2 ranks");
    let members: Vec<RunMember> = sessions
        .iter()
        .map(|(n, m, a)| RunMember {
            name: n.clone(),
            model: m,
            analysis: a,
        })
        .collect();
    let run = analyze_run(&members, &Config::default());
    drop(members);
    (run, sessions)
}

#[test]
fn straggler_rank_and_its_line_are_named() {
    let (run, _) = run_of(Plan::straggler(), "straggler");
    // Two ranks side by side, the launcher folded.
    assert_eq!(run.processes, 3);
    let ranks: Vec<Option<u32>> = run.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, vec![Some(0), Some(1)]);
    let gpus: Vec<u32> = run
        .ranks
        .iter()
        .map(|r| r.gpu.as_ref().unwrap().index)
        .collect();
    assert_eq!(
        gpus,
        vec![0, 1],
        "each rank's GPU is the one with its kernels"
    );
    assert!(run.ranks.iter().all(|r| r.comm_kernels == 2 * STEPS));
    let f = run
        .without_cuda_work
        .as_ref()
        .expect("the launcher is folded");
    assert_eq!((f.processes, f.telemetry_samples), (1, 8));
    assert_eq!(f.apps, vec!["torchrun".to_string()]);
    // Clocks: one host, aligned by the header pairs despite rank 1's 777 ms CUPTI offset; the
    // collectives then end together (the generator ends them at one instant).
    let clock = run.clock.as_ref().unwrap();
    assert_eq!(clock.method, ClockMethod::SameHost);
    assert_eq!(clock.end_spread_ns, Some(0));
    assert_eq!(clock.collectives, 2 * STEPS);

    let cw: Vec<_> = run
        .insights
        .iter()
        .filter(|i| i.rule == "collective-wait")
        .collect();
    assert_eq!(cw.len(), 1, "{:#?}", run.insights);
    let i = cw[0];
    let Some(RuleData::CollectiveWait(d)) = &i.data else {
        panic!("no data")
    };
    assert_eq!(d.late_rank, 1);
    assert_eq!(d.waiting_ranks, vec![0]);
    // Late by 4 ms at each step's first bucket; at the second, last by the rest of its
    // backward pass only (under MIN_LATE_NS).
    assert_eq!(d.late_collectives, STEPS);
    assert_eq!(d.last_collectives, 2 * STEPS);
    assert_eq!(d.collectives, 2 * STEPS);
    assert!(d.lateness_share > 0.99);
    assert_eq!(d.op.as_deref(), Some("AllReduce"));
    // Rank 1 starts 4 ms late each step: its forward is 4 ms late, the rest of its step the same.
    assert_eq!(d.median_late_ns, STRAGGLE_US * 1000);
    assert!(d.wait_share > 0.9, "{}", d.wait_share);
    assert!(d.host_bound);
    // The stretch without CUDA calls: from the previous step's loss.item() to the forward
    // launch (the planted 4 ms plus the 30 µs between steps).
    assert_eq!(d.host_gap_median_ns, Some((STRAGGLE_US + 30) * 1000));
    assert_eq!(i.location.file, SCRIPT);
    assert_eq!(i.location.line, Some(FORWARD_LINE));
    assert_eq!(d.gap_before.as_ref().and_then(|l| l.line), Some(ITEM_LINE));
    assert!(
        i.title.contains("rank 1 arrives 4.00ms late"),
        "{}",
        i.title
    );
    assert!(i.title.contains("ddp_train.py:61"), "{}", i.title);
    assert!(
        i.detail
            .contains("between ddp_train.py:67 (`losses.append(loss.item())`) and the next CUDA call at ddp_train.py:61 (`out = model(x)`)"),
        "{}",
        i.detail
    );
    assert_eq!(i.severity, gpufl_analysis::Severity::High);
}

#[test]
fn balanced_twin_raises_no_collective_wait() {
    let (run, _) = run_of(Plan::balanced(), "balanced");
    assert_eq!(run.ranks.len(), 2);
    assert_eq!(run.clock.as_ref().unwrap().collectives, 2 * STEPS);
    assert!(
        run.insights.iter().all(|i| i.rule != "collective-wait"),
        "{:#?}",
        run.insights
    );
}

#[test]
fn communication_kernels_are_not_under_filled_but_the_same_shape_otherwise_is() {
    // Rank 0 spends most of its GPU time in a 24-block kernel on a 132-SM GPU.
    let (_, sessions) = run_of(Plan::straggler(), "comm-kernel");
    let rank0 = &sessions
        .iter()
        .find(|s| s.0.starts_with("ddp_train-4101-"))
        .unwrap()
        .2;
    assert!(rank0
        .kernels
        .rows
        .iter()
        .any(|r| r.comm && r.busy_share > 0.5));
    for rule in ["under-filled-grid", "low-occupancy", "launch-bound"] {
        assert!(
            rank0
                .insights
                .iter()
                .all(|i| i.rule != rule || !i.title.contains("nccl")),
            "{rule}: {:#?}",
            rank0.insights
        );
    }
    assert!(rank0.insights.iter().all(|i| i.rule != "under-filled-grid"));
    // The same kernel under another name is called under-filled: the classifier is what keeps
    // the NCCL kernel out.
    let plan = Plan {
        comm_kernel: "my_allreduce_kernel(float*, int)",
        ..Plan::straggler()
    };
    let (run, sessions) = run_of(plan, "non-comm");
    let rank0 = &sessions
        .iter()
        .find(|s| s.0.starts_with("ddp_train-4101-"))
        .unwrap()
        .2;
    assert!(
        rank0
            .insights
            .iter()
            .any(|i| i.rule == "under-filled-grid" && i.title.contains("my_allreduce_kernel")),
        "{:#?}",
        rank0.insights
    );
    // Not a communication kernel: no cross-rank rule either.
    assert!(run.insights.is_empty());
    assert!(run.clock.is_none());
}

#[test]
fn ranks_on_two_hosts_are_aligned_on_the_collectives() {
    let plan = Plan {
        two_hosts: true,
        ..Plan::straggler()
    };
    let (run, _) = run_of(plan, "two-hosts");
    let clock = run.clock.as_ref().unwrap();
    assert_eq!(clock.method, ClockMethod::CollectiveEnds);
    assert_eq!(
        clock.hosts,
        vec!["node01".to_string(), "node02".to_string()]
    );
    assert!(
        run.warnings.iter().any(|w| w.contains("2 hosts")),
        "{:?}",
        run.warnings
    );
    // The skew of rank 1's clock is taken out by the ends: the same straggler is found.
    let d = run
        .insights
        .iter()
        .find_map(|i| match &i.data {
            Some(RuleData::CollectiveWait(d)) => Some(d),
            _ => None,
        })
        .expect("collective-wait");
    assert_eq!((d.late_rank, d.median_late_ns), (1, STRAGGLE_US * 1000));
}

#[test]
fn a_watchdog_polling_during_the_stretch_does_not_split_it() {
    // PyTorch's NCCL watchdog polls events from its own thread whatever the host does.
    let plan = Plan {
        watchdog: true,
        ..Plan::straggler()
    };
    let (run, _) = run_of(plan, "watchdog");
    let i = run
        .insights
        .iter()
        .find(|i| i.rule == "collective-wait")
        .expect("collective-wait");
    let Some(RuleData::CollectiveWait(d)) = &i.data else {
        panic!("no data")
    };
    assert_eq!(d.host_gap_median_ns, Some((STRAGGLE_US + 30) * 1000));
    assert_eq!(i.location.line, Some(FORWARD_LINE));
}

#[test]
fn the_stragglers_host_samples_name_the_line_of_its_host_work() {
    let plan = Plan {
        host_samples: true,
        ..Plan::straggler()
    };
    let (run, _) = run_of(plan, "host-samples");
    let i = run
        .insights
        .iter()
        .find(|i| i.rule == "collective-wait")
        .expect("collective-wait");
    let Some(RuleData::CollectiveWait(d)) = &i.data else {
        panic!("no data")
    };
    assert!(d.host_bound);
    // The samples in the stretches are at the host work's line; the call that ended them (the
    // forward launch) stays as where the stretches ended.
    assert_eq!(i.location.line, Some(STRAGGLE_WORK_LINE), "{}", i.title);
    assert_eq!(i.location.function.as_deref(), Some("busy_host_work"));
    assert_eq!(
        d.gap_ended_at.as_ref().and_then(|l| l.line),
        Some(FORWARD_LINE)
    );
    let h = d.host.as_ref().expect("host");
    assert_eq!(
        h.gaps,
        d.late_collectives - 1,
        "the first step has no stretch before it"
    );
    assert!(h.lines[0].share > 0.9, "{:?}", h.lines[0]);
    assert!(
        i.detail
            .contains("Over those stretches, during 29 gaps (116.87ms) rank 1's host was 99% on CPU @ ddp_train.py:36 (100% estimated from 234 host samples)"),
        "{}",
        i.detail
    );
    assert!(i.title.ends_with("@ ddp_train.py:36"), "{}", i.title);
}

#[test]
fn a_gpu_work_straggler_names_its_extra_kernels_and_their_launch_line() {
    let plan = Plan {
        straggle: false,
        extra_gpu: true,
        ..Plan::straggler()
    };
    let (run, _) = run_of(plan, "extra-gpu");
    let i = run
        .insights
        .iter()
        .find(|i| i.rule == "collective-wait")
        .expect("collective-wait");
    let Some(RuleData::CollectiveWait(d)) = &i.data else {
        panic!("no data")
    };
    assert_eq!(d.late_rank, 1);
    assert!(!d.host_bound);
    assert_eq!(d.extra_kernels.len(), 1, "{:#?}", d.extra_kernels);
    let k = &d.extra_kernels[0];
    assert_eq!(k.name, EXTRA_KERNEL);
    assert_eq!(k.others_launches, 0);
    assert_eq!(
        k.per_late_collective_ns,
        4 * 500 * 1000 * k.launches / 4 / d.late_collectives
    );
    assert_eq!(
        k.launch_line.as_ref().and_then(|l| l.line),
        Some(EXTRA_LINE)
    );
    assert_eq!(i.location.line, Some(EXTRA_LINE), "{}", i.title);
    assert_eq!(
        d.gap_ended_at.as_ref().and_then(|l| l.line),
        Some(BACKWARD_LINE)
    );
    assert!(
        i.detail.contains("at::native::tanh_kernel × "),
        "{}",
        i.detail
    );
    assert!(
        i.detail.contains("launched @ ddp_train.py:88"),
        "{}",
        i.detail
    );
}
