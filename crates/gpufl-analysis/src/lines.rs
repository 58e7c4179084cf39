//! What happened at each user source line: its synchronizations (count, time blocked, the
//! distribution of their durations), its copies, the kernels launched from it (from the launches
//! whose call site was recorded) and one whole stack — the longest synchronization's, else a
//! copy's or a launch's. The line detail of the server's API and the dashboard.

use crate::userframe::{user_frame, SourceLoc};
use crate::{Config, Model};
use gpufl_trace::{FrameKind, StackId};
use serde::Serialize;
use std::collections::HashMap;

/// Lines kept, at most (the most time blocked or on the GPU first).
pub const MAX_LINES: usize = 500;
/// Kernels listed per line, at most (the most GPU time first).
pub const MAX_KERNELS: usize = 20;
/// Frames of a line's stack, at most (innermost first).
pub const MAX_FRAMES: usize = 128;

/// One frame of a stack, its strings resolved.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StackFrame {
    /// `native` or `python`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A kernel launched from the line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineKernel {
    pub name: String,
    /// Launches whose call site is this line (in default mode a sample of the launches).
    pub launches: u64,
    /// Their summed GPU time, ns.
    pub total_ns: u64,
}

/// One user line.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineDetail {
    pub location: SourceLoc,
    pub syncs: u64,
    /// Host time blocked in them, ns (StreamWaitEvent excluded, as in the totals).
    pub sync_blocked_ns: u64,
    /// Median, 99th percentile (nearest rank) and longest synchronization, ns.
    pub sync_p50_ns: u64,
    pub sync_p99_ns: u64,
    pub sync_max_ns: u64,
    /// Memcpys and memsets issued there (with a recorded call site), their GPU time and bytes.
    pub copies: u64,
    pub copy_ns: u64,
    pub copy_bytes: u64,
    /// Launches with a recorded call site at this line, and their kernels.
    pub launches: u64,
    pub kernels: Vec<LineKernel>,
    /// The stack of the longest synchronization there, else of a copy, else of a launch.
    pub stack: Vec<StackFrame>,
}

#[derive(Default)]
struct Acc {
    loc: Option<SourceLoc>,
    sync_ns: Vec<u64>,
    blocked: u64,
    copies: u64,
    copy_ns: u64,
    copy_bytes: u64,
    launches: u64,
    kernels: HashMap<u32, (u64, u64)>,
    /// (rank: 3 sync, 2 copy, 1 launch; its duration), the stack.
    best: Option<((u8, u64), StackId)>,
}

impl Acc {
    fn offer(&mut self, rank: (u8, u64), s: StackId) {
        if self.best.is_none_or(|(r, _)| rank > r) {
            self.best = Some((rank, s));
        }
    }
}

fn key(l: &SourceLoc) -> (String, u32, String, String) {
    (
        l.file.clone(),
        l.line.unwrap_or(0),
        l.function.clone().unwrap_or_default(),
        l.library
            .as_ref()
            .map(|b| format!("{}:{}", b.file, b.line.unwrap_or(0)))
            .unwrap_or_default(),
    )
}

/// The frames of a stack, innermost first, at most [`MAX_FRAMES`].
pub fn stack_frames(m: &Model, s: StackId) -> Vec<StackFrame> {
    let Some(ids) = m.stack(s) else {
        return Vec::new();
    };
    ids.iter()
        .take(MAX_FRAMES)
        .filter_map(|&f| m.frame(f))
        .map(|f| StackFrame {
            kind: match f.kind {
                FrameKind::Python => "python",
                _ => "native",
            },
            module: f.module.map(str::to_string),
            function: f.func.map(str::to_string),
            file: f.file.map(str::to_string),
            line: f.line,
            text: f.text.map(str::to_string),
        })
        .collect()
}

type Accs = HashMap<(String, u32, String, String), Acc>;

/// The accumulator of the line a stack names (its user frame computed once per stack).
fn acc<'a>(
    m: &Model,
    cfg: &Config,
    locs: &mut HashMap<u32, SourceLoc>,
    accs: &'a mut Accs,
    s: StackId,
) -> &'a mut Acc {
    let loc = locs
        .entry(s.0)
        .or_insert_with(|| user_frame(m, s, &cfg.filter));
    let a = accs.entry(key(loc)).or_default();
    if a.loc.is_none() {
        a.loc = Some(loc.clone());
    }
    a
}

/// Every user line with synchronizations, copies or sampled launches, most time first, at most
/// [`MAX_LINES`]. Records without a stack are left out (they name no line).
pub fn line_details(m: &Model, cfg: &Config) -> Vec<LineDetail> {
    let mut locs: HashMap<u32, SourceLoc> = HashMap::new();
    let mut accs: Accs = HashMap::new();
    for s in m.syncs() {
        let Some(st) = s.stack else { continue };
        let d = s.duration_ns();
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.sync_ns.push(d);
        if s.kind.blocks_host() {
            a.blocked = a.blocked.saturating_add(d);
        }
        a.offer((3, d), st);
    }
    for c in m.copies() {
        let Some((st, _)) = (c.corr != 0).then(|| m.callsite(c.corr)).flatten() else {
            continue;
        };
        let d = c.end.saturating_sub(c.start);
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.copies += 1;
        a.copy_ns = a.copy_ns.saturating_add(d);
        a.copy_bytes = a.copy_bytes.saturating_add(c.bytes);
        a.offer((2, d), st);
    }
    for k in m.kernels() {
        let Some((st, _)) = (k.corr != 0).then(|| m.callsite(k.corr)).flatten() else {
            continue;
        };
        let d = k.end.saturating_sub(k.start);
        let a = acc(m, cfg, &mut locs, &mut accs, st);
        a.launches += 1;
        let e = a.kernels.entry(k.name.0).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(d);
        a.offer((1, d), st);
    }
    let mut out: Vec<(u64, LineDetail)> = accs
        .into_values()
        .filter_map(|mut a| {
            a.sync_ns.sort_unstable();
            let n = a.sync_ns.len();
            let rank = |p: usize| -> u64 {
                if n == 0 {
                    0
                } else {
                    a.sync_ns[((p * n).div_ceil(100)).clamp(1, n) - 1]
                }
            };
            let mut kernels: Vec<LineKernel> = a
                .kernels
                .iter()
                .map(|(&name, &(launches, total_ns))| LineKernel {
                    name: m.str(gpufl_trace::StrId(name)).to_string(),
                    launches,
                    total_ns,
                })
                .collect();
            kernels.sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(x.name.cmp(&y.name)));
            kernels.truncate(MAX_KERNELS);
            let gpu: u64 = a.kernels.values().map(|v| v.1).sum::<u64>();
            let weight = a.blocked.saturating_add(a.copy_ns).saturating_add(gpu);
            let d = LineDetail {
                location: a.loc?,
                syncs: n as u64,
                sync_blocked_ns: a.blocked,
                sync_p50_ns: rank(50),
                sync_p99_ns: rank(99),
                sync_max_ns: a.sync_ns.last().copied().unwrap_or(0),
                copies: a.copies,
                copy_ns: a.copy_ns,
                copy_bytes: a.copy_bytes,
                launches: a.launches,
                kernels,
                stack: a.best.map(|(_, s)| stack_frames(m, s)).unwrap_or_default(),
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
