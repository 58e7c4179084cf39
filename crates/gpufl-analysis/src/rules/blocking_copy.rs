//! Rule `blocking-copy`: copies and memsets that block the calling thread until the GPU is done,
//! by user source line, ranked by the host time blocked (nsys's `cuda_memcpy_sync` and
//! `cuda_memset_sync`, plus the PyTorch `.item()` / `.cpu()` pattern).
//!
//! - **Synchronous calls:** a copy or memset whose API name has no `Async` (`cudaMemcpy`,
//!   `cudaMemcpy2D`, `cudaMemcpyToSymbol`, `cudaMemset`, `cuMemcpyHtoD_v2`, `cuMemsetD32_v2`, …)
//!   and that blocks the host per CUDA's "API synchronization behavior":
//!   - copies touching host memory (HtoD, DtoH, HtoA, AtoH, HtoH, and unknown kinds), except
//!     host-to-device copies of `SMALL_H2D_BYTES` (64 KiB, `shared::copies::blocks_host`) or less, which return once the data
//!     is staged (as nsys ignores them); device-to-device and peer copies do not synchronize the host;
//!   - memsets of pinned, pageable or managed memory (a memset of device memory is asynchronous
//!     with respect to the host, as nsys's rule assumes too).
//! - **Copy then wait:** an async copy touching host memory (`cudaMemcpyAsync`, D2H or H2D)
//!   followed on the same thread by a host-blocking synchronization (any kind but
//!   StreamWaitEvent) whose stack has the same user line as the copy's callsite, with no other
//!   blocking sync of that thread in between: what `.item()`, `.cpu()`, `.tolist()` or a
//!   `non_blocking=False` `.to()` does. The pair is one blocking operation whose blocked time is the
//!   copy call's plus the sync's; the 64 KiB exemption does not apply (the explicit wait blocks
//!   whatever the size). Such copies are not reported again by pageable-async-copy.
//! - **Impact:** host time blocked: the calls' API durations (the copy's GPU time for a call
//!   without an API record), plus the paired syncs' durations. The syncs also appear in
//!   sync-attribution: the rules are different views of one timeline.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - One insight per user line (the `callsite` of the copy; calls without one are left out, so
//!   older sessions raise nothing here). Pairing needs the copy's `api` record (its thread).

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, Insight};
use crate::shared::advice::Fix;
use crate::shared::copies::{
    api_name, bandwidth_gbps, blocks_host, call_ns, copy_calls, copy_then_wait, op_span, plural,
    where_, window, CopyCall, Names, Window,
};
use crate::shared::Ctx;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub(crate) const RULE: &str = "blocking-copy";

const FIX: Fix = Fix {
    native: "Use cudaMemcpyAsync / cudaMemsetAsync on a stream you created, from pinned host memory \
(cudaMallocHost / cudaHostAlloc), and synchronize once, as late as possible, on an event \
recorded after the work you need.",
    python: None,
    torch: Some("Keep values on the GPU instead of reading them every step with .item() / .cpu() / .tolist() \
(accumulate on the device, read once per epoch or every N steps), copy with .to('cpu', \
non_blocking=True) into pinned memory when you do need them, and move inputs with \
.to(device, non_blocking=True) from pinned tensors (DataLoader(pin_memory=True))."),
    jax: Some("Keep values on the device instead of reading them every step: float(x), x.item(), \
np.asarray(x) and print(x) each wait for the device and copy. Accumulate on the device and \
read every N steps or once at the end, or start the copy early with x.copy_to_host_async() \
and read it a step later; feed inputs with jax.device_put ahead of the step that needs them."),
    cupy: Some("Keep values on the GPU instead of reading them every step with .get() / cupy.asnumpy() / \
float(x) (accumulate on the device, read every N steps), and when you need them, copy on a \
stream you created (cupy.cuda.Stream(non_blocking=True)) into pinned memory \
(cupyx.empty_pinned) and synchronize once, on an event recorded after the copy."),
};

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// The API called (the most frequent one when the line mixes several); `cudaMemcpyAsync +
    /// sync`-style when the line's copies are waited on right away.
    pub api: String,
    /// Synchronous copy calls.
    pub sync_copies: u64,
    /// Synchronous memset calls.
    pub memsets: u64,
    /// Async copies waited on at once by a synchronization at the same line.
    pub copy_then_wait: u64,
    /// The synchronizations of those pairs.
    pub waits: u64,
    /// Host time in the copy and memset calls, ns.
    pub call_ns: u64,
    /// Host time in the paired synchronizations, ns.
    pub wait_ns: u64,
    /// Bytes copied or set.
    pub bytes: u64,
    /// Summed GPU time of the operations, ns.
    pub copy_ns: u64,
    /// `bytes / copy_ns`, GB/s (0 when no measurable GPU time).
    pub bandwidth_gbps: f64,
    /// Operations touching pageable host memory.
    pub pageable: u64,
}

#[derive(Default)]
struct Acc {
    sync_copies: u64,
    memsets: u64,
    copy_then_wait: u64,
    waits: HashSet<usize>,
    call_ns: u64,
    wait_ns: u64,
    bytes: u64,
    copy_ns: u64,
    pageable: u64,
    names: Names,
    ops: Vec<(CorrId, u64, u64)>,
}

impl Acc {
    fn add_call(&mut self, cx: &Ctx, c: &CopyCall) {
        self.call_ns += call_ns(cx, c.corr, c.gpu_ns);
        self.bytes = self.bytes.saturating_add(c.bytes);
        self.copy_ns += c.gpu_ns;
        self.pageable += c.pageable as u64;
    }

    fn count(&self) -> u64 {
        self.sync_copies + self.memsets + self.copy_then_wait
    }
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let calls = copy_calls(cx);
    let mut groups: HashMap<LocIx, Acc> = HashMap::new();
    for c in &calls {
        let Some(name) = api_name(cx, c.corr) else {
            continue;
        };
        if !blocks_host(name, c) {
            continue;
        }
        let Some(loc) = cx.callsite_loc(c.corr) else {
            continue;
        };
        let g = groups.entry(loc).or_default();
        if c.is_memset() {
            g.memsets += 1;
        } else {
            g.sync_copies += 1;
        }
        g.add_call(cx, c);
        g.names.add(name);
        g.ops.push(op_span(cx, c.corr, c.start, c.end));
    }
    for p in copy_then_wait(cx, &calls) {
        let c = &calls[p.call];
        let g = groups.entry(p.loc).or_default();
        g.copy_then_wait += 1;
        g.add_call(cx, c);
        let s = cx.m.sync(p.sync);
        if g.waits.insert(p.sync) {
            g.wait_ns += s.duration_ns();
        }
        g.ops.push(op_span(cx, c.corr, c.start, c.end.max(s.end)));
        let name = api_name(cx, c.corr).unwrap_or("cudaMemcpyAsync");
        g.names.add(&format!("{name} + sync"));
    }
    groups
        .into_iter()
        .map(|(loc, mut g)| {
            let w = window(cx, &mut g.ops);
            insight(cx, loc, g, w)
        })
        .collect()
}

fn insight(cx: &Ctx, loc: LocIx, g: Acc, w: Window) -> Insight {
    let location = cx.loc(loc).clone();
    let api = g.names.top();
    let n = g.count();
    let blocked = g.call_ns + g.wait_ns;
    let bw = bandwidth_gbps(g.bytes, g.copy_ns);
    let title = format!(
        "Blocking {api} × {n} @ {} · {} host blocked",
        location.short(),
        fmt_duration(blocked)
    );
    let mut parts = Vec::new();
    if g.sync_copies > 0 {
        parts.push(plural(
            g.sync_copies,
            "synchronous copy",
            "synchronous copies",
        ));
    }
    if g.memsets > 0 {
        parts.push(plural(
            g.memsets,
            "synchronous memset",
            "synchronous memsets",
        ));
    }
    if g.copy_then_wait > 0 {
        parts.push(format!(
            "{} waited on at once by a synchronization at the same line \
             (copy then wait: .item()/.cpu()-style; {} in {})",
            plural(g.copy_then_wait, "async copy", "async copies"),
            fmt_duration(g.wait_ns),
            plural(g.waits.len() as u64, "wait", "waits"),
        ));
    }
    let pageable = if g.pageable > 0 {
        format!("; {} of them to or from pageable host memory", g.pageable)
    } else {
        String::new()
    };
    let detail = format!(
        "{} {}: the host was blocked {} ({}; {} bytes, {} of GPU time, {bw:.2} GB/s){pageable}",
        parts.join(" and "),
        where_(cx, loc),
        fmt_duration(blocked),
        w.describe(blocked),
        g.bytes,
        fmt_duration(g.copy_ns),
    );
    Insight::new(RULE, location, title, detail, cx.fix(&FIX))
        .count(n)
        .impact(blocked, w.ns, cx.wall_ns)
        .blocked(blocked)
        .data(Data {
            api,
            sync_copies: g.sync_copies,
            memsets: g.memsets,
            copy_then_wait: g.copy_then_wait,
            waits: g.waits.len() as u64,
            call_ns: g.call_ns,
            wait_ns: g.wait_ns,
            bytes: g.bytes,
            copy_ns: g.copy_ns,
            bandwidth_gbps: bw,
            pageable: g.pageable,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::CopyOp;
    use gpufl_trace::{CopyKind, MemoryKind};

    fn call(op: CopyOp, bytes: u64) -> CopyCall {
        CopyCall {
            corr: CorrId(1),
            op,
            pageable: false,
            bytes,
            gpu_ns: 0,
            start: 0,
            end: 0,
        }
    }

    fn copy(kind: CopyKind) -> CopyOp {
        CopyOp::Memcpy {
            kind,
            src_kind: MemoryKind::Pageable,
            dst_kind: MemoryKind::Device,
        }
    }

    fn sync_call_blocks(c: &CopyCall) -> bool {
        blocks_host("cudaMemcpy", c)
    }

    #[test]
    fn which_synchronous_calls_block_the_host() {
        assert!(!blocks_host(
            "cudaMemcpyAsync",
            &call(copy(CopyKind::DtoH), 4)
        ));
        assert!(!sync_call_blocks(&call(copy(CopyKind::HtoD), 65_536)));
        assert!(sync_call_blocks(&call(copy(CopyKind::HtoD), 65_537)));
        assert!(!sync_call_blocks(&call(copy(CopyKind::HtoA), 100)));
        assert!(sync_call_blocks(&call(copy(CopyKind::DtoH), 4)));
        assert!(sync_call_blocks(&call(copy(CopyKind::HtoH), 4)));
        assert!(!sync_call_blocks(&call(copy(CopyKind::DtoD), 1 << 30)));
        assert!(!sync_call_blocks(&call(copy(CopyKind::PtoP), 1 << 30)));
        let memset = |mem_kind| call(CopyOp::Memset { mem_kind }, 1 << 20);
        assert!(!sync_call_blocks(&memset(MemoryKind::Device)));
        assert!(sync_call_blocks(&memset(MemoryKind::Pinned)));
        assert!(sync_call_blocks(&memset(MemoryKind::Managed)));
    }
}
