//! A synthetic `gpufl record -- torchrun --nproc_per_node=2 ddp_train.py` run, written with the
//! trace crate's writer: a run directory with `run.json`, the torchrun parent's session (no CUDA
//! work, a few telemetry samples) and one session per rank. Shared by the analysis and CLI tests.
//!
//! Each step of each rank (times in µs from the step's start, on the host's wall clock):
//! - `D`: the rank's host delay — with a straggler, rank 1 spends 4 ms in code that makes no CUDA
//!   call (`STRAGGLE_LINE`) before its forward pass; balanced, the ranks take turns being
//!   [`JITTER_US`] late;
//! - `D+0..60`: 6 forward launches from `main` at `FORWARD_LINE` (kernels 50 µs each);
//! - `D+100..160`: 6 backward launches from the autograd thread (80 µs each);
//! - two gradient buckets, as DDP all-reduces them: `D+135` (after the third backward launch)
//!   and `D+170`, all-reduce launches (24 blocks on a 132-SM GPU) on the communication stream;
//!   each kernel starts when its gradients are ready (and the previous bucket is done) and ends
//!   100 µs after the last rank's start, on every rank;
//! - `D+200, D+210`: two optimizer launches (20 µs kernels after the all-reduce);
//! - `D+220`: `loss.item()` at `ITEM_LINE`, a StreamSynchronize until the optimizer is done;
//! - the next step starts 30 µs after the last rank's sync returns.
//!
//! With `host_samples`, each rank's main thread is sampled every 500 µs (`hsample` records): in
//! the straggle at `STRAGGLE_WORK_LINE` (in `busy_host_work`, on the CPU), else at
//! `FORWARD_LINE`. With `extra_gpu` (and no straggle), rank 1 launches 4 more kernels
//! (`EXTRA_KERNEL`, 500 µs each) at `EXTRA_LINE` after each step's sync: its next forward pass
//! queues behind them, so its all-reduce starts 2 ms late while its host keeps launching.
//!
//! Rank 1's CUPTI clock is offset from rank 0's by [`RANK1_CLOCK_SKEW`] (each session's header
//! clock pair maps it back), so matching starts without aligning them would be 777 ms off.

#![allow(dead_code)]

use gpufl_trace::run::{write_run, RunRecord, RUN_FORMAT, RUN_VERSION};
use gpufl_trace::*;
use std::path::{Path, PathBuf};

pub const STEPS: u64 = 30;
pub const STRAGGLE_US: u64 = 4_000;
pub const JITTER_US: u64 = 30;
pub const SCRIPT: &str = "/work/examples/ddp_train.py";
pub const STRAGGLE_LINE: u32 = 60;
pub const FORWARD_LINE: u32 = 61;
pub const BACKWARD_LINE: u32 = 63;
pub const OPT_LINE: u32 = 66;
pub const ITEM_LINE: u32 = 67;
pub const STRAGGLE_WORK_LINE: u32 = 36;
pub const EXTRA_LINE: u32 = 88;
pub const EXTRA_KERNEL: &str = "void at::native::tanh_kernel<float>(float*, int)";
pub const NCCL_KERNEL: &str =
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
pub const RANK1_CLOCK_SKEW: u64 = 777_000_000;
const UNIX0: u64 = 1_795_000_000_000_000_000;
const TRACE0: u64 = 5_000_000_000_000;
const US: u64 = 1_000;

/// What to plant.
#[derive(Clone, Copy)]
pub struct Plan {
    /// Rank 1 spends [`STRAGGLE_US`] before each step's forward pass.
    pub straggle: bool,
    /// Name of the collective's kernel (a non-communication name checks the kernel rules).
    pub comm_kernel: &'static str,
    /// The two ranks on two hosts.
    pub two_hosts: bool,
    /// A watchdog thread polls an event (`cudaEventQuery`) 2 ms into each step.
    pub watchdog: bool,
    /// The ranks' main threads are sampled (`hsample` records).
    pub host_samples: bool,
    /// Rank 1 runs extra GPU work after each step (the straggle off).
    pub extra_gpu: bool,
}

impl Plan {
    pub fn straggler() -> Plan {
        Plan {
            straggle: true,
            comm_kernel: NCCL_KERNEL,
            two_hosts: false,
            watchdog: false,
            host_samples: false,
            extra_gpu: false,
        }
    }
    pub fn balanced() -> Plan {
        Plan {
            straggle: false,
            ..Plan::straggler()
        }
    }
}

fn gpu(i: u32) -> Gpu {
    Gpu {
        index: i,
        name: "NVIDIA H200".into(),
        uuid: format!("GPU-0000000{i}-1111-2222-3333-444444444444"),
        sm_count: 132,
        cc_major: 9,
        cc_minor: 0,
        total_mem_bytes: 150_000_000_000,
        limits: None,
    }
}

fn header(app: &str, pid: u32, rank: Option<u32>, host: &str, trace0: u64) -> Header {
    let name = session::session_dir_name(app, pid, UNIX0);
    Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        session_id: name,
        app_name: app.into(),
        host: host.into(),
        pid,
        ppid: 4100,
        command_line: match rank {
            Some(_) => vec![
                "python3".into(),
                SCRIPT.into(),
                "--straggle-ms".into(),
                "4".into(),
            ],
            None => vec![
                "torchrun".into(),
                "--nproc_per_node=2".into(),
                SCRIPT.into(),
            ],
        },
        start_unix_ns: UNIX0,
        clock: ClockSync {
            trace_ns: trace0,
            unix_ns: UNIX0,
        },
        gpus: vec![gpu(0), gpu(1)],
        rank,
        local_rank: rank,
        world_size: rank.map(|_| 2),
        run_id: Some(RUN_ID.into()),
        options: CaptureOptions {
            enable_synchronization: true,
            enable_stack_trace: true,
            api_records: "default".into(),
            log_path: "/tmp/out".into(),
            started_by: "injection".into(),
            telemetry_ms: Some(100),
            mode: None,
            call_sites: None,
            host_samples_hz: None,
            hostcall_us: None,
            mem_records: None,
            mem_stack_bytes: None,
        },
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    }
}

pub const RUN_ID: &str = "run-torchrun-4099-20261118T110640Z";

/// Host-side plan of one step of one rank, in wall-clock ns.
struct Step {
    base: u64,
    delay: u64,
}

/// Write the run under `root`; returns the run directory.
pub fn write_run_dir(root: &Path, plan: Plan) -> PathBuf {
    let dir = root.join(RUN_ID);
    std::fs::create_dir_all(&dir).unwrap();
    write_run(
        &dir,
        &RunRecord {
            format: RUN_FORMAT.into(),
            version: RUN_VERSION,
            run_id: RUN_ID.into(),
            gpufl_version: "0.1.0".into(),
            host: "node01".into(),
            command: vec![
                "torchrun".into(),
                "--nproc_per_node=2".into(),
                SCRIPT.into(),
            ],
            pid: 4099,
            start_unix_ns: UNIX0,
            end_unix_ns: Some(UNIX0 + 2_000_000_000),
            exit_code: Some(0),
            signal: None,
        },
    )
    .unwrap();
    // The launcher: no CUDA work, NVML samples of both GPUs.
    {
        let h = header("torchrun", 4100, None, "node01", TRACE0);
        let sd = dir.join(&h.session_id);
        std::fs::create_dir_all(&sd).unwrap();
        let f = std::fs::File::create(sd.join(session::FIRST_TRACE_FILE)).unwrap();
        let mut w = TraceWriter::new(f, &h).unwrap();
        for i in 0..4u64 {
            for dev in 0..2 {
                w.write(&Record::Telemetry(Box::new(Telemetry {
                    ts: TRACE0 + i * 100_000_000,
                    dev,
                    gpu_util: Some(50),
                    ..Telemetry::default()
                })))
                .unwrap();
            }
        }
        w.finish(UNIX0 + 2_000_000_000, "exit").unwrap();
    }
    // Per step and rank: the host delay; all ranks' timelines are computed together so that the
    // collective ends when the last rank arrives.
    let mut events: Vec<Vec<Ev>> = vec![Vec::new(), Vec::new()];
    let mut base = UNIX0 + 50_000 * US;
    // Per rank: when its stream is free (extra GPU work runs past a step's end).
    let mut busy_until = [0u64; 2];
    let mut next_sample = [base; 2];
    for s in 0..STEPS {
        let delay = |r: u64| -> u64 {
            if plan.straggle {
                if r == 1 {
                    STRAGGLE_US * US
                } else {
                    0
                }
            } else if s % 2 == r {
                JITTER_US * US
            } else {
                0
            }
        };
        let steps: Vec<Step> = (0..2)
            .map(|r| Step {
                base,
                delay: delay(r),
            })
            .collect();
        // Per rank: when each bucket's gradients are ready on the GPU, and its launch.
        let mut ready = [[0u64; 2]; 2];
        let mut bucket_launch = [[0u64; 2]; 2];
        let mut per_rank: Vec<Vec<Ev>> = vec![Vec::new(), Vec::new()];
        for r in 0..2 {
            let st = &steps[r];
            let t = st.base + st.delay;
            let ev = &mut per_rank[r];
            if plan.watchdog {
                ev.push(Ev::Poll {
                    at: st.base + 2_000 * US,
                });
            }
            let mut gpu_free = t.max(busy_until[r]);
            for i in 0..6 {
                let l = t + i * 10 * US;
                let k0 = (l + 8 * US).max(gpu_free);
                gpu_free = k0 + 50 * US;
                ev.push(Ev::launch(
                    10,
                    l,
                    FORWARD_LINE,
                    "gemm_fwd",
                    k0,
                    gpu_free,
                    7,
                    [264, 1, 1],
                ));
            }
            for i in 0..6 {
                let l = t + (100 + i * 10) * US;
                let k0 = (l + 8 * US).max(gpu_free);
                gpu_free = k0 + 80 * US;
                ev.push(Ev::launch(
                    11,
                    l,
                    BACKWARD_LINE,
                    "gemm_bwd",
                    k0,
                    gpu_free,
                    7,
                    [264, 1, 1],
                ));
                if i == 2 || i == 5 {
                    let b = (i / 3) as usize;
                    bucket_launch[r][b] = t + (135 + 35 * b as u64) * US;
                    ready[r][b] = (bucket_launch[r][b] + 10 * US).max(gpu_free);
                }
            }
        }
        // The buckets' collectives: each starts on a rank when its gradients are ready and its
        // previous bucket is done, and ends on every rank 100 µs after the last rank's start.
        let mut done = [0u64; 2];
        for b in 0..2 {
            let mut starts = [0u64; 2];
            for r in 0..2 {
                starts[r] = ready[r][b].max(if b > 0 { done[b - 1] } else { 0 });
            }
            done[b] = starts[0].max(starts[1]) + 100 * US;
            for r in 0..2 {
                per_rank[r].push(Ev::launch(
                    11,
                    bucket_launch[r][b],
                    BACKWARD_LINE,
                    plan.comm_kernel,
                    starts[r],
                    done[b],
                    20,
                    [24, 1, 1],
                ));
            }
        }
        let done = done[1];
        let mut sync_end = [0u64; 2];
        for r in 0..2 {
            let st = &steps[r];
            let t = st.base + st.delay;
            let ev = &mut per_rank[r];
            let mut gpu_free = done;
            for i in 0..2 {
                let l = t + (200 + i * 10) * US;
                let k0 = (l + 8 * US).max(gpu_free);
                gpu_free = k0 + 20 * US;
                ev.push(Ev::launch(
                    10,
                    l,
                    OPT_LINE,
                    "adam_step",
                    k0,
                    gpu_free,
                    7,
                    [528, 1, 1],
                ));
            }
            let s0 = t + 220 * US;
            sync_end[r] = gpu_free.max(s0) + 5 * US;
            ev.push(Ev::Sync {
                start: s0,
                end: sync_end[r],
            });
            if plan.extra_gpu && r == 1 {
                let mut free = sync_end[r];
                for i in 0..4 {
                    let l = sync_end[r] + (2 + i * 6) * US;
                    let k0 = (l + 8 * US).max(free);
                    free = k0 + 500 * US;
                    ev.push(Ev::launch(
                        10,
                        l,
                        EXTRA_LINE,
                        EXTRA_KERNEL,
                        k0,
                        free,
                        7,
                        [528, 1, 1],
                    ));
                }
                busy_until[r] = free;
            }
        }
        let next = sync_end[0].max(sync_end[1]) + 30 * US;
        if plan.host_samples {
            for r in 0..2 {
                let st = &steps[r];
                while next_sample[r] < next {
                    let at = next_sample[r];
                    let in_straggle = at >= st.base && at < st.base + st.delay;
                    per_rank[r].push(Ev::Sample {
                        at,
                        line: if in_straggle {
                            STRAGGLE_WORK_LINE
                        } else {
                            FORWARD_LINE
                        },
                    });
                    next_sample[r] += 500 * US;
                }
            }
        }
        for r in 0..2 {
            events[r].append(&mut per_rank[r]);
        }
        base = next;
    }
    for (r, evs) in events.iter().enumerate() {
        let skew = if r == 1 { RANK1_CLOCK_SKEW } else { 0 };
        let host = if plan.two_hosts && r == 1 {
            "node02"
        } else {
            "node01"
        };
        let h = header(
            "ddp_train",
            4101 + r as u32,
            Some(r as u32),
            host,
            TRACE0 + skew,
        );
        write_rank(&dir.join(&h.session_id), &h, r as u32, evs, skew);
    }
    dir
}

/// One host event of a rank, in wall-clock ns.
enum Ev {
    Launch {
        tid: u64,
        at: u64,
        line: u32,
        kernel: &'static str,
        k_start: u64,
        k_end: u64,
        stream: u32,
        grid: [i32; 3],
    },
    Sync {
        start: u64,
        end: u64,
    },
    Poll {
        at: u64,
    },
    /// A host sample of the main thread, on the CPU at `line`.
    Sample {
        at: u64,
        line: u32,
    },
}

impl Ev {
    #[allow(clippy::too_many_arguments)]
    fn launch(
        tid: u64,
        at: u64,
        line: u32,
        kernel: &'static str,
        k_start: u64,
        k_end: u64,
        stream: u32,
        grid: [i32; 3],
    ) -> Ev {
        Ev::Launch {
            tid,
            at,
            line,
            kernel,
            k_start,
            k_end,
            stream,
            grid,
        }
    }
}

fn write_rank(sd: &Path, h: &Header, rank: u32, evs: &[Ev], skew: u64) {
    std::fs::create_dir_all(sd).unwrap();
    let f = std::fs::File::create(sd.join(session::FIRST_TRACE_FILE)).unwrap();
    let mut w = TraceWriter::new(f, h).unwrap();
    // Wall-clock ns → this rank's trace clock.
    let tr = |t: u64| t - UNIX0 + TRACE0 + skew;
    let launch = w.intern_str("cudaLaunchKernel").unwrap();
    let query = w.intern_str("cudaEventQuery").unwrap();
    let file = w.intern_str(SCRIPT).unwrap();
    let main = w.intern_str("main").unwrap();
    let mut stacks = std::collections::HashMap::new();
    let mut stack_at = |w: &mut TraceWriter<std::fs::File>, line: u32| -> StackId {
        *stacks.entry(line).or_insert_with(|| {
            let text = match line {
                FORWARD_LINE => "out = model(x)",
                BACKWARD_LINE => "loss.backward()",
                OPT_LINE => "opt.step()",
                ITEM_LINE => "losses.append(loss.item())",
                STRAGGLE_WORK_LINE => "while time.perf_counter() < end:",
                EXTRA_LINE => "a = torch.tanh(a @ a)",
                _ => "",
            };
            let text = w.intern_str(text).unwrap();
            let func = match line {
                STRAGGLE_WORK_LINE => w.intern_str("busy_host_work").unwrap(),
                EXTRA_LINE => w.intern_str("extra_gpu_work").unwrap(),
                _ => main,
            };
            let f = w
                .intern_frame(FrameData {
                    kind: FrameKind::Python,
                    module: None,
                    offset: None,
                    func: Some(func),
                    file: Some(file),
                    line: Some(line),
                    inlined: false,
                    text: Some(text),
                })
                .unwrap();
            w.intern_stack(&[f]).unwrap()
        })
    };
    for (i, e) in evs.iter().enumerate() {
        let corr = i as u32 + 1;
        match *e {
            Ev::Launch {
                tid,
                at,
                line,
                kernel,
                k_start,
                k_end,
                stream,
                grid,
            } => {
                let stack = stack_at(&mut w, line);
                let name = w.intern_str(kernel).unwrap();
                w.write(&Record::Api(Api {
                    domain: ApiDomain::Runtime,
                    name: launch,
                    cbid: 211,
                    start: tr(at),
                    end: tr(at + 5 * US),
                    tid: tid + 100 * rank as u64,
                    corr,
                    ret: 0,
                }))
                .unwrap();
                w.write(&Record::Callsite(Callsite {
                    corr,
                    api: launch,
                    tid: tid + 100 * rank as u64,
                    ts: tr(at),
                    stack,
                    weight: None,
                }))
                .unwrap();
                w.write(&Record::Kernel(Kernel {
                    name,
                    start: tr(k_start),
                    end: tr(k_end),
                    dev: rank,
                    ctx: 1,
                    stream,
                    corr,
                    grid,
                    block: [256, 1, 1],
                    regs: 32,
                    ..Kernel::default()
                }))
                .unwrap();
            }
            Ev::Poll { at } => {
                w.write(&Record::Api(Api {
                    domain: ApiDomain::Runtime,
                    name: query,
                    cbid: 18,
                    start: tr(at),
                    end: tr(at + 2 * US),
                    tid: 99 + 100 * rank as u64,
                    corr,
                    ret: 600,
                }))
                .unwrap();
            }
            Ev::Sample { at, line } => {
                let stack = stack_at(&mut w, line);
                w.write(&Record::Hsample(Hsample {
                    ts: tr(at),
                    tid: 10 + 100 * rank as u64,
                    state: HostState::Cpu,
                    period_ns: 500 * US,
                    stack: Some(stack),
                    call: None,
                }))
                .unwrap();
            }
            Ev::Sync { start, end } => {
                let stack = stack_at(&mut w, ITEM_LINE);
                w.write(&Record::Sync(Sync {
                    kind: SyncKind::StreamSynchronize,
                    start: tr(start),
                    end: tr(end),
                    ctx: 1,
                    stream: Some(7),
                    event: None,
                    corr,
                    tid: Some(10 + 100 * rank as u64),
                    stack: Some(stack),
                }))
                .unwrap();
            }
        }
    }
    w.finish(UNIX0 + 2_000_000_000, "exit").unwrap();
}
