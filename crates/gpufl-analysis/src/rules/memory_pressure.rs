//! Rule `memory-pressure`: a GPU whose memory was more than [`MIN_USED_PCT`] % used (NVML's
//! `mem_used` of `mem_total` in `telemetry` records).
//!
//! - **Fires** per device when, in some sample, `mem_used` is more than 90 % of `mem_total`
//!   (exactly 90 % does not fire).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - **Impact:** 0: a risk (out-of-memory, fragmentation, cache flushes), not time the trace shows
//!   lost; insights with time impact rank first.
//! - NVML counts the memory of **every process** on the GPU, and a framework's cached blocks
//!   (PyTorch's `memory_reserved`, not only `memory_allocated`).
//! - **Location:** the device (no source line).

use crate::insight::{fmt_duration, share, Insight};
use crate::shared::advice::Fix;
use crate::shared::Ctx;
use crate::telemetry::Series;
use crate::userframe::SourceLoc;
use serde::Serialize;

pub(crate) const RULE: &str = "memory-pressure";
/// Used share (percent, exclusive) above which the rule fires.
pub const MIN_USED_PCT: u64 = 90;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    pub peak_used_bytes: u64,
    /// `mem_total` of the peak sample.
    pub total_bytes: u64,
    /// `peak_used_bytes / total_bytes`, 0..1.
    pub peak_share: f64,
    /// Time of the samples above [`MIN_USED_PCT`] %, ns, and its share of the sampled time.
    pub above_ns: u64,
    pub above_share: f64,
    /// When it first went above, ns after the session's first record (negative: before it).
    pub first_above_offset_ns: i64,
    /// Samples with both figures.
    pub samples: u64,
}

const FIX: Fix = Fix {
    native:
        "Leave headroom: smaller batches or working sets, lower precision, or freeing buffers you \
keep alive; with stream-ordered allocation (cudaMallocAsync), cap what the pool keeps cached \
(cudaMemPoolAttrReleaseThreshold, cudaMemPoolTrimTo); check `nvidia-smi` for other processes \
on this GPU.",
    python: None,
    torch: Some(
        "Leave headroom: a smaller batch, activation checkpointing, lower precision, or freeing \
tensors you keep alive; compare torch.cuda.memory_allocated() with memory_reserved() (the \
cache), set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, and \
avoid torch.cuda.empty_cache() inside the loop; check `nvidia-smi` for other processes on \
this GPU.",
    ),
    jax: Some(
        "Leave headroom: a smaller batch, rematerialization (jax.checkpoint), lower precision, or \
dropping arrays you keep alive. JAX preallocates 75% of the GPU's memory when it starts, so \
the memory used includes its pool: XLA_PYTHON_CLIENT_MEM_FRACTION sets that share and \
XLA_PYTHON_CLIENT_PREALLOCATE=false turns it off; check `nvidia-smi` for other processes on \
this GPU.",
    ),
    cupy: Some(
        "Leave headroom: smaller arrays or batches, lower precision, or dropping arrays you keep \
alive; CuPy's memory pool keeps freed blocks cached (compare \
cupy.get_default_memory_pool().used_bytes() with total_bytes()): bound it with set_limit(); \
check `nvidia-smi` for other processes on this GPU.",
    ),
};

fn above(used: u64, total: u64, pct: u64) -> bool {
    total > 0 && used as u128 * 100 > total as u128 * pct as u128
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    cx.m.telemetry()
        .iter()
        .filter_map(|s| device(cx, s))
        .collect()
}

fn device(cx: &Ctx, s: &Series) -> Option<Insight> {
    let d = s.durations();
    let (mut sampled, mut above_ns, mut n) = (0u64, 0u64, 0u64);
    let mut peak: Option<(u64, u64)> = None;
    let mut first_above: Option<u64> = None;
    for (i, smp) in s.samples().enumerate() {
        let (Some(used), Some(total)) = (smp.mem_used, smp.mem_total) else {
            continue;
        };
        if total == 0 {
            continue;
        }
        n += 1;
        sampled += d[i];
        if above(used, total, MIN_USED_PCT) {
            above_ns += d[i];
            first_above.get_or_insert(smp.ts);
        }
        // Compare shares exactly: used/total > pu/pt  ⇔  used·pt > pu·total.
        if peak.is_none_or(|(pu, pt)| used as u128 * pt as u128 > pu as u128 * total as u128) {
            peak = Some((used, total));
        }
    }
    let (used, total) = peak?;
    if !above(used, total, MIN_USED_PCT) {
        return None;
    }
    let peak_share = used as f64 / total as f64;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let origin = cx.m.time_range().0;
    let first = first_above.unwrap_or(origin);
    let title = format!(
        "Memory pressure on GPU {} · {:.1}% of {:.1} GiB used at peak",
        s.device,
        peak_share * 100.0,
        gib(total)
    );
    let detail = format!(
        "{:.2} GiB of {:.2} GiB in use at the peak; above {MIN_USED_PCT}% for {} of {} sampled ({:.0}%); \
         NVML counts every process on this GPU and the framework's cached blocks",
        gib(used),
        gib(total),
        fmt_duration(above_ns),
        fmt_duration(sampled),
        share(above_ns, sampled) * 100.0
    );
    Some(
        Insight::new(
            RULE,
            SourceLoc::device(s.device),
            title,
            detail,
            cx.fix(&FIX),
        )
        .count(n)
        .window(sampled)
        .data(Data {
            device: s.device,
            peak_used_bytes: used,
            total_bytes: total,
            peak_share,
            above_ns,
            above_share: share(above_ns, sampled),
            first_above_offset_ns: (first as i128 - origin as i128)
                .clamp(i64::MIN as i128, i64::MAX as i128)
                as i64,
            samples: n,
        }),
    )
}
