//! What the host did at each user source line, from the `hsample` and `hostcall` records: the host
//! samples whose stack names the line (how many, the time they stand for, by thread state, the
//! threads) and the CUDA calls that held their thread there (by call: count, host time, longest).
//! The host part of the dashboard's line page (stored by the server's ingest as the `hostlines`
//! document, beside [`crate::lines`]'s `lines`).
//!
//! Keyed by the user line (`file`, `line`) only: the library frames inside it are not told apart
//! here (the line page sums them anyway). Records without a stack name no line and are left out:
//! samples of threads that run no Python, calls recorded with stacks off.

use crate::ids::StackIx;
use crate::userframe::{user_frame, SourceLoc};
use crate::{Config, Model};
use gpufl_trace::HostState;
use serde::Serialize;
use std::collections::HashMap;

/// Lines kept, at most (the most host time first).
pub const MAX_LINES: usize = 500;
/// Threads listed per line, at most.
pub const MAX_THREADS: usize = 16;
/// Calls listed per line, at most (the most host time first).
pub const MAX_CALLS: usize = 20;

/// Host samples in one thread state at a line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StateTime {
    pub state: HostState,
    pub samples: u64,
    /// The time they stand for (each its period), ns.
    pub ns: u64,
}

/// One CUDA function's `hostcall` records at a line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct CallTime {
    pub call: String,
    pub count: u64,
    /// Host time inside the calls, ns.
    pub host_ns: u64,
    pub max_ns: u64,
}

/// The host at one user line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct HostLineDetail {
    /// The user line (without the library frame inside it).
    pub location: SourceLoc,
    /// Host samples whose stack names the line, and the time they stand for, ns.
    pub samples: u64,
    pub sample_ns: u64,
    /// By thread state, the most samples first.
    pub states: Vec<StateTime>,
    /// The sampled threads (OS thread ids), the most samples first, at most [`MAX_THREADS`].
    pub threads: Vec<u64>,
    /// CUDA calls that held their thread at the line, the most host time first.
    pub calls: Vec<CallTime>,
}

#[derive(Default)]
struct Acc {
    loc: Option<SourceLoc>,
    samples: u64,
    sample_ns: u64,
    states: HashMap<HostState, (u64, u64)>,
    threads: HashMap<u64, u64>,
    calls: HashMap<u32, (u64, u64, u64)>,
}

type Locs = HashMap<StackIx, Option<(String, u32)>>;
type Accs = HashMap<(String, u32), Acc>;

/// The accumulator of the user line a stack names (computed once per stack); None when the stack
/// names no user line.
fn at<'a>(
    m: &Model,
    cfg: &Config,
    locs: &mut Locs,
    accs: &'a mut Accs,
    st: StackIx,
) -> Option<&'a mut Acc> {
    let key = locs
        .entry(st)
        .or_insert_with(|| {
            let l = user_frame(m, st, &cfg.filter);
            let line = l.line?;
            if l.file.starts_with('<') {
                return None;
            }
            let key = (l.file.clone(), line);
            accs.entry(key.clone())
                .or_default()
                .loc
                .get_or_insert(SourceLoc { library: None, ..l });
            Some(key)
        })
        .clone()?;
    accs.get_mut(&key)
}

/// Every user line with host samples or host calls, the most host time (sampled plus inside
/// calls) first, at most [`MAX_LINES`].
pub fn host_line_details(m: &Model, cfg: &Config) -> Vec<HostLineDetail> {
    let mut locs: Locs = HashMap::new();
    let mut accs: Accs = HashMap::new();
    for s in m.hsamples() {
        let Some(a) = s.stack.and_then(|st| at(m, cfg, &mut locs, &mut accs, st)) else {
            continue;
        };
        a.samples += 1;
        a.sample_ns = a.sample_ns.saturating_add(s.period_ns);
        let e = a.states.entry(s.state).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(s.period_ns);
        *a.threads.entry(s.tid).or_default() += 1;
    }
    for c in m.hostcalls() {
        let Some(a) = c.stack.and_then(|st| at(m, cfg, &mut locs, &mut accs, st)) else {
            continue;
        };
        let d = c.duration_ns();
        let e = a.calls.entry(c.name.0).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(d);
        e.2 = e.2.max(d);
    }
    let mut out: Vec<(u64, HostLineDetail)> = accs
        .into_values()
        .filter_map(|a| {
            let mut states: Vec<StateTime> = a
                .states
                .iter()
                .map(|(&state, &(samples, ns))| StateTime { state, samples, ns })
                .collect();
            states.sort_by(|x, y| {
                (y.samples, y.ns)
                    .cmp(&(x.samples, x.ns))
                    .then((x.state as u8).cmp(&(y.state as u8)))
            });
            let mut threads: Vec<(u64, u64)> = a.threads.into_iter().collect();
            threads.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
            let mut calls: Vec<CallTime> = a
                .calls
                .iter()
                .map(|(&name, &(count, host_ns, max_ns))| CallTime {
                    call: m.str(gpufl_trace::StrId(name)).to_string(),
                    count,
                    host_ns,
                    max_ns,
                })
                .collect();
            calls.sort_by(|x, y| y.host_ns.cmp(&x.host_ns).then(x.call.cmp(&y.call)));
            calls.truncate(MAX_CALLS);
            let weight = a
                .sample_ns
                .saturating_add(calls.iter().map(|c| c.host_ns).sum::<u64>());
            let d = HostLineDetail {
                location: a.loc?,
                samples: a.samples,
                sample_ns: a.sample_ns,
                states,
                threads: threads.into_iter().take(MAX_THREADS).map(|t| t.0).collect(),
                calls,
            };
            Some((weight, d))
        })
        .collect();
    out.sort_by(|x, y| {
        y.0.cmp(&x.0)
            .then_with(|| x.1.location.file.cmp(&y.1.location.file))
            .then_with(|| x.1.location.line.cmp(&y.1.location.line))
    });
    out.truncate(MAX_LINES);
    out.into_iter().map(|(_, d)| d).collect()
}
