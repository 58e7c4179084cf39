//! Rule `out-of-memory`: an allocation failed for want of memory (a `mem` record `alloc_failed`:
//! `cudaErrorMemoryAllocation` / `CUDA_ERROR_OUT_OF_MEMORY`), the post-mortem of the crash.
//!
//! - **Fires** once per device with a failed allocation; the finding describes the device's last
//!   failure (the one a framework's retry did not survive) and counts them all.
//! - **Impact:** the session's whole wall time (window: the same): the run's work is what the
//!   failure cost, so the finding ranks first and is HIGH.
//! - **Figures:** the failing line and function, the size asked for, the device's free memory at
//!   the last telemetry sample, the process's live bytes at the failure by allocating line, and
//!   what was freed in the second before it by line (a framework's cache released before its
//!   retry).
//! - **Location:** the failing allocation's line (the device when it has no stack).

use crate::insight::Insight;
use crate::shared::memory::{self, fmt_bytes, holders_data, holders_text, HolderData};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;

pub(crate) const RULE: &str = "out-of-memory";
/// Holders named in the finding, at most.
pub const TOP_HOLDERS: usize = 5;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    /// Failed allocations on the device.
    pub failures: u64,
    /// The last failure: the bytes asked for, the function, when (ns after the first record).
    pub requested_bytes: u64,
    pub api: Option<String>,
    pub offset_ns: i64,
    /// The device's free bytes at the last telemetry sample before it (NVML), when known.
    pub free_bytes: Option<u64>,
    /// The process's live bytes on the device at the failure, and the largest holders by line.
    pub live_bytes: u64,
    pub holders: Vec<HolderData>,
    /// Freed in the second before the failure, by allocating line.
    pub freed_before: Vec<HolderData>,
}

const FIX: &str = "Free or shrink what the top holders keep alive: drop references to tensors you no \
longer need (lists, histories, losses kept with their graph: use loss.item()), a smaller batch or \
sequence, activation checkpointing, lower precision; when little was live but the request failed, \
fragmentation or another process holds the memory (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, \
`nvidia-smi`).";

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let scan = memory::scan(cx);
    let mut devs: Vec<u32> = scan.failures.iter().map(|f| f.dev).collect();
    devs.sort_unstable();
    devs.dedup();
    devs.into_iter()
        .filter_map(|dev| {
            let all: Vec<_> = scan.failures.iter().filter(|f| f.dev == dev).collect();
            let f = *all.last()?;
            let holders = holders_data(cx, &f.holders, TOP_HOLDERS);
            let freed = holders_data(cx, &f.freed_before, TOP_HOLDERS);
            let api = f.api.map(|s| cx.m.str(gpufl_trace::StrId(s)).to_string());
            let loc = f
                .loc
                .map_or_else(|| SourceLoc::device(dev), |l| cx.loc(l).clone());
            let title = format!(
                "Out of memory on GPU {dev} · {} of {} failed at {}",
                api.as_deref().unwrap_or("an allocation"),
                fmt_bytes(f.bytes),
                loc.short()
            );
            let mut detail = format!(
                "The allocation asked for {}{}; the process held {} live on the device then",
                fmt_bytes(f.bytes),
                f.free
                    .map(|b| format!(
                        " with {} free on the device (last telemetry sample)",
                        fmt_bytes(b)
                    ))
                    .unwrap_or_default(),
                fmt_bytes(f.live_bytes)
            );
            if !holders.is_empty() {
                detail += &format!(", held at: {}", holders_text(&holders));
            }
            if !freed.is_empty() {
                detail += &format!("; freed in the second before: {}", holders_text(&freed));
            }
            if all.len() > 1 {
                detail += &format!("; {} failed allocations on this device", all.len());
            }
            let wall = cx.wall_ns.max(1);
            Some(
                Insight::new(RULE, loc, title, detail, FIX)
                    .count(all.len() as u64)
                    .impact(wall, wall, wall)
                    .data(Data {
                        device: dev,
                        failures: all.len() as u64,
                        requested_bytes: f.bytes,
                        api,
                        offset_ns: memory::offset_ns(cx, f.ts),
                        free_bytes: f.free,
                        live_bytes: f.live_bytes,
                        holders,
                        freed_before: freed,
                    }),
            )
        })
        .collect()
}
