//! Rule `register-spill`: a kernel that matters uses local memory — registers spilled by the
//! compiler, or a per-thread array it could not keep in registers — which lives in device memory
//! behind L1 and L2, far slower than registers.
//!
//! - **Per kernel name and device** (kernel table), vendor library kernels left out, from
//!   [`MIN_BUSY_PCT`](crate::shared::kernel_site::MIN_BUSY_PCT) % of the device's busy time; fires when
//!   a launch configuration has local memory per thread > 0 (CUPTI's `localMemoryPerThread`,
//!   the `bytes stack frame` of `nvcc --resource-usage`, which counts spill slots and local
//!   arrays alike). Without local memory, a **stack frame** > 0 from the module's cubin
//!   (`function` records: current compilers spill to the ABI stack frame, which CUDA's local
//!   memory size leaves out) fires a softer insight: the frame holds spills, local arrays or
//!   registers saved around calls, and only ptxas' "spill stores" tells them apart, so its
//!   wording says "register spills or local arrays".
//! - **Impact** (a rough weight for ranking, not a measurement): Σ over those configurations of
//!   GPU time × local / (local + 4 × registers) — the share of a thread's state (its registers are
//!   4 bytes each) that lives in local memory. 64 bytes of local memory beside 128 registers weigh
//!   11 %; 1 KiB beside 255 registers, 50 %.
//!   A stack frame is weighed the same way, frame in place of local memory, over every
//!   configuration.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - **Evidence of spilling.** Neither CUPTI nor the cubin counts spill stores (only ptxas' report
//!   does), and a frame also holds local arrays and registers saved around calls: `sinf`/`cosf`'s
//!   slow path alone gives a clean kernel a 32-byte frame. The one sign that the bytes are spills
//!   is a kernel at the [`MAX_REGS`] cap (its state cannot fit). Without it: a frame or local
//!   memory of at most [`SMALL_FRAME`] bytes raises nothing (math-library slow paths, calls);
//!   a larger one raises a LOW "possible" insight that claims no weighted time (impact 0: gpufl
//!   cannot say how much a fix would recover) and asks for `nvcc --resource-usage`.
//! - **Fix:** at the 255-register cap, less state per thread; below it, relax whatever capped the
//!   registers (`__launch_bounds__`' min blocks, `-maxrregcount`), and keep per-thread arrays in
//!   registers (constant indices, unrolled loops) or in shared memory.

use crate::insight::{fmt_duration, Insight};
use crate::kernels::{KernelRow, KernelTable, Variant};
use crate::shared::kernel_site::{self, describe, location, matters, part, worth, KernelInsight};
use crate::shared::timeline::{LocationSource, Locator};
use crate::shared::Ctx;
use crate::views::LaunchConfig;
use serde::Serialize;

pub(crate) const RULE: &str = "register-spill";
/// Registers per thread a kernel can have at most (compute capability 5.0 and later).
pub const MAX_REGS: u16 = 255;
/// Local memory or stack frame (bytes per thread) at or below which, without evidence of spilling,
/// nothing is raised: math-library slow paths (`sinf`'s 28-byte reduction array) and registers
/// saved around calls.
pub const SMALL_FRAME: u32 = 64;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub kernel: String,
    pub device: u32,
    pub launches: u64,
    pub gpu_ns: u64,
    pub busy_share: f64,
    /// The configuration with local memory and the most GPU time.
    pub config: LaunchConfig,
    /// Its local memory and registers per thread.
    pub local_bytes: u32,
    pub regs: u16,
    /// `local / (local + 4 × regs)`, the weight of the impact.
    pub local_share: f64,
    /// Configurations with local memory, and their launches.
    pub configs: u32,
    pub flagged_launches: u64,
    pub weighted_ns: u64,
    pub location_source: LocationSource,
    /// The kernel's stack frame per thread from its cubin, when known; when `local_bytes` is 0
    /// the insight rests on it (and `local_share` is the frame's share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_frame: Option<u32>,
    /// Whether the kernel is at the register cap (the evidence that the bytes are spills); when
    /// false the insight is LOW and `weighted_ns` is 0.
    pub spill_evidence: bool,
}

fn share(bytes: u32, regs: u16) -> f64 {
    let b = bytes as f64;
    b / (b + 4.0 * regs as f64)
}

fn local_share(c: &LaunchConfig) -> f64 {
    share(c.local_mem, c.regs)
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for row in table.rows.iter().filter(|r| !r.library && matters(r)) {
        let mut impact = 0u64;
        let mut configs = 0u32;
        let mut launches = 0u64;
        let mut top: Option<&Variant> = None;
        for v in row.variants.iter().filter(|v| v.config.local_mem > 0) {
            impact += part(v.gpu_ns, local_share(&v.config));
            configs += 1;
            launches += v.launches;
            top = top.or(Some(v));
        }
        let Some(v) = top else {
            if let Some(i) = frame_insight(cx, &locator, row) {
                out.push(i);
            }
            continue;
        };
        if !worth(impact, row) {
            continue;
        }
        if !at_cap(row) {
            if let Some(i) = unproven(cx, &locator, row, v.config.local_mem, &v.config) {
                out.push(i);
            }
            continue;
        }
        out.push(insight(cx, &locator, row, v, (impact, configs, launches)));
    }
    out
}

/// Evidence that local memory holds spills: a launch configuration at the register cap.
fn at_cap(row: &KernelRow) -> bool {
    row.variants.iter().any(|v| v.config.regs >= MAX_REGS)
}

/// Local memory or a frame of `bytes` without evidence of spilling: nothing when small, else a
/// LOW insight claiming no weighted time.
fn unproven(
    cx: &Ctx,
    locator: &Locator,
    row: &KernelRow,
    bytes: u32,
    c: &LaunchConfig,
) -> Option<Insight> {
    if bytes <= SMALL_FRAME {
        return None;
    }
    let (loc, src) = location(locator, row);
    let threads = c.threads_per_block();
    let what = if c.local_mem > 0 {
        "of local memory"
    } else {
        "of stack frame"
    };
    let title = format!(
        "Possible register spill × {}{} · {}: {bytes} B {what} per thread beside {} \
         registers (spills, local arrays or calls: check `nvcc --resource-usage`)",
        row.launches,
        kernel_site::at(&loc),
        crate::kernels::short_name(&row.name),
        c.regs,
    );
    let detail = format!(
        "{}: each thread has {bytes} B {what} ({} KiB for a block of {threads} threads) \
         beside {} registers, under the {MAX_REGS} a thread may have. Those bytes live in \
         local memory (device memory behind L1 and L2) and hold registers the compiler \
         spilled, per-thread arrays it could not keep in registers, or registers saved \
         around calls; neither CUPTI nor the cubin says which, so gpufl claims no \
         recoverable time. `nvcc --resource-usage` (or `-Xptxas -v`) does: \"spill stores\" \
         > 0 is spilling.{}",
        describe(row),
        (bytes as u64 * threads).div_ceil(1024),
        c.regs,
        kernel_site::location_note(src)
    );
    let fix = format!(
        "Check `nvcc --resource-usage` for this kernel. With spill stores: {} Without: the \
         bytes are local arrays or calls — make array indices known at compile time so they \
         stay in registers, or move the arrays to shared memory; inline the called \
         functions.",
        cap_fix(c.regs, threads)
    );
    let figures = Figures {
        impact: 0,
        local_share: share(bytes, c.regs),
        configs: row.variants.len() as u32,
        flagged_launches: row.launches,
        stack_frame: row.stack_frame,
        spill_evidence: false,
    };
    Some(build(cx, row, c, (title, detail, fix), (loc, src), figures))
}

/// No local memory, but a stack frame in the cubin: spills or local arrays.
fn frame_insight(cx: &Ctx, locator: &Locator, row: &KernelRow) -> Option<Insight> {
    let frame = row.stack_frame.filter(|&f| f > 0)?;
    let v = row.variants.first()?;
    let impact: u64 = row
        .variants
        .iter()
        .map(|v| part(v.gpu_ns, share(frame, v.config.regs)))
        .sum();
    if !worth(impact, row) {
        return None;
    }
    if !at_cap(row) {
        return unproven(cx, locator, row, frame, &v.config);
    }
    let (loc, src) = location(locator, row);
    let c = &v.config;
    let threads = c.threads_per_block();
    let title = format!(
        "Possible register spill × {}{} · {}: stack frame {frame} bytes: register spills or local \
         arrays, beside {} registers · ~{} weighted",
        row.launches,
        kernel_site::at(&loc),
        crate::kernels::short_name(&row.name),
        c.regs,
        fmt_duration(impact)
    );
    let detail = format!(
        "{}: the compiler gave each thread a {frame}-byte stack frame ({} KiB for a block of \
         {threads} threads) beside {} registers. The frame holds registers the compiler spilled, \
         per-thread arrays it could not keep in registers, or registers saved around calls: the \
         cubin does not say which, `nvcc --resource-usage` does (\"spill stores\" > 0 is \
         spilling). The frame is local memory, device memory behind L1 and L2, but CUDA's local \
         memory size (CUPTI's, 0 for this kernel) leaves it out: gpufl read it from the module's \
         cubin. {:.0}% of a thread's state is in the frame; weighted by it, ~{} of the kernel's \
         {}{}",
        describe(row),
        (frame as u64 * threads).div_ceil(1024),
        c.regs,
        share(frame, c.regs) * 100.0,
        fmt_duration(impact),
        fmt_duration(row.total_ns),
        kernel_site::location_note(src)
    );
    let fix = format!(
        "Check `nvcc --resource-usage` (or `-Xptxas -v`) for this kernel first. With spill \
         stores: {} Without: the frame is local arrays or calls — make array indices known at \
         compile time so they stay in registers, or move the arrays to shared memory; inline \
         the called functions.",
        cap_fix(c.regs, threads)
    );
    let figures = Figures {
        impact,
        local_share: share(frame, c.regs),
        configs: row.variants.len() as u32,
        flagged_launches: row.launches,
        stack_frame: Some(frame),
        spill_evidence: true,
    };
    Some(build(cx, row, c, (title, detail, fix), (loc, src), figures))
}

/// The figures of an insight beside its kernel row and launch configuration.
struct Figures {
    impact: u64,
    local_share: f64,
    configs: u32,
    flagged_launches: u64,
    stack_frame: Option<u32>,
    spill_evidence: bool,
}

/// The insight and its data, from its texts and figures.
fn build(
    cx: &Ctx,
    row: &KernelRow,
    c: &LaunchConfig,
    (title, detail, fix): (String, String, String),
    (loc, src): (crate::userframe::SourceLoc, LocationSource),
    f: Figures,
) -> Insight {
    kernel_site::insight(
        cx,
        KernelInsight {
            rule: RULE,
            title,
            detail,
            fix,
            location: loc,
            launches: row.launches,
            impact_ns: f.impact,
            window_ns: row.device_busy_ns,
        },
    )
    .data(Data {
        kernel: row.name.clone(),
        device: row.device,
        launches: row.launches,
        gpu_ns: row.total_ns,
        busy_share: row.busy_share,
        config: *c,
        local_bytes: c.local_mem,
        regs: c.regs,
        local_share: f.local_share,
        configs: f.configs,
        flagged_launches: f.flagged_launches,
        weighted_ns: f.impact,
        location_source: src,
        stack_frame: f.stack_frame,
        spill_evidence: f.spill_evidence,
    })
}

/// What to do about spills at `regs` registers per thread.
fn cap_fix(regs: u16, threads: u64) -> String {
    if regs >= MAX_REGS {
        format!(
            "the kernel is at the {MAX_REGS}-register cap: hold less per thread (split the \
             kernel, smaller tiles per thread, recompute instead of keeping values)."
        )
    } else {
        format!(
            "at {regs} registers, under the {MAX_REGS} a thread may have, a register cap made the \
             compiler spill (`__launch_bounds__({threads}, …)`'s minimum blocks per SM, \
             `-maxrregcount`): relax it — fewer resident blocks but no spills; measure both."
        )
    }
}

fn insight(
    cx: &Ctx,
    locator: &Locator,
    row: &KernelRow,
    v: &Variant,
    (impact, configs, flagged_launches): (u64, u32, u64),
) -> Insight {
    let (loc, src) = location(locator, row);
    let c = &v.config;
    let threads = c.threads_per_block();
    let title = format!(
        "Register spill × {}{} · {} uses {} B of local memory per thread beside {} registers · ~{} weighted",
        row.launches,
        kernel_site::at(&loc),
        crate::kernels::short_name(&row.name),
        c.local_mem,
        c.regs,
        fmt_duration(impact)
    );
    let others = if configs > 1 {
        format!("; {configs} launch configurations have local memory ({flagged_launches} launches)")
    } else {
        String::new()
    };
    let detail = format!(
        "{}: {} B of local memory per thread ({} KiB for a block of {threads} threads) beside {} \
         registers: spilled registers or a per-thread array the compiler could not keep in \
         registers (`nvcc --resource-usage` tells them apart: spill stores/loads vs. stack frame). \
         Local memory is device memory behind L1 and L2. {:.0}% of a thread's state is local \
         memory; weighted by it, ~{} of the kernel's {}{others}{}",
        describe(row),
        c.local_mem,
        (c.local_mem as u64 * threads).div_ceil(1024),
        c.regs,
        local_share(c) * 100.0,
        fmt_duration(impact),
        fmt_duration(row.total_ns),
        kernel_site::location_note(src)
    );
    let arrays = "a per-thread array indexed at run time lives in local memory: make its indices \
                  known at compile time (unrolled loops with constant bounds) so it stays in \
                  registers, or move it to shared memory";
    let fix = if c.regs >= MAX_REGS {
        format!(
            "The kernel is at the {MAX_REGS}-register cap: its state does not fit. Hold less per \
             thread (split the kernel, smaller tiles per thread, recompute instead of keeping \
             values); {arrays}."
        )
    } else {
        format!(
            "At {} registers, under the {MAX_REGS} a thread may have: if a register cap made the \
             compiler spill (`__launch_bounds__({threads}, …)`'s minimum blocks per SM, \
             `-maxrregcount`), relax it — fewer resident blocks but no spills; measure both. \
             Otherwise {arrays}.",
            c.regs
        )
    };
    let figures = Figures {
        impact,
        local_share: local_share(c),
        configs,
        flagged_launches,
        stack_frame: row.stack_frame,
        spill_evidence: true,
    };
    build(cx, row, c, (title, detail, fix), (loc, src), figures)
}
