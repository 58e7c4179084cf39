//! Rule `low-occupancy`: a kernel that matters whose theoretical occupancy is under 50 %, with the
//! resource that limits it and the change that would lift it to 50 %.
//!
//! - **Per kernel name and device** (kernel table, `crate::kernels`), vendor library kernels left
//!   out (their registers and shared memory are tuned on purpose, often at low occupancy). A
//!   kernel matters from [`MIN_BUSY_PCT`](crate::shared::kernel_site::MIN_BUSY_PCT) % of its device's
//!   busy time.
//! - **Fires** for each launch configuration with a theoretical occupancy under
//!   [`THRESHOLD_PCT`] % whose grid is larger than one wave at that occupancy (more blocks than
//!   the SMs hold at once: otherwise every block is resident anyway and more room per SM adds no
//!   warps).
//! - **Impact:** Σ over those configurations of GPU time × (1 − occupancy / 50 %). A kernel that
//!   waits on memory hides latency with its resident warps and runs up to that much faster when
//!   twice as many are resident; beyond about 50 % more warps rarely help, which is why the target
//!   is 50 % (the impact is 0 at the threshold: no cliff). An upper bound: a kernel bound by
//!   arithmetic throughput or memory bandwidth gains less.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - **Fix,** by limiter: registers → the register count that reaches 50 % with
//!   `__launch_bounds__(threads, blocks)`; shared memory → the bytes per block that do (or the
//!   carveout preference, when the driver chose a small carveout); blocks → larger blocks; warps →
//!   a block size whose warps divide the SM's.

use crate::insight::{fmt_duration, Insight};
use crate::kernels::{KernelRow, KernelTable, Variant};
use crate::occupancy::{
    blocks_for, occupancy, regs_for, smem_for, BlockUse, Limiter, Occupancy, SmLimits,
};
use crate::shared::kernel_site::{self, describe, location, matters, part, worth, KernelInsight};
use crate::shared::timeline::{LocationSource, Locator};
use crate::shared::Ctx;
use crate::views::LaunchConfig;
use serde::Serialize;

pub(crate) const RULE: &str = "low-occupancy";
/// Theoretical occupancy under this, percent, fires.
pub const THRESHOLD_PCT: u64 = 50;
const TARGET: f64 = THRESHOLD_PCT as f64 / 100.0;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub kernel: String,
    pub device: u32,
    pub launches: u64,
    pub gpu_ns: u64,
    pub busy_share: f64,
    /// The flagged configuration with the most GPU time, and its occupancy.
    pub config: LaunchConfig,
    pub occupancy: Occupancy,
    pub limiter: Limiter,
    /// Flagged configurations and their launches.
    pub configs: u32,
    pub flagged_launches: u64,
    /// The change that reaches 50 %, when one resource's change does: registers per thread (with
    /// `min_blocks` blocks per SM for `__launch_bounds__`), or static + dynamic shared memory per
    /// block in bytes.
    pub target_regs: Option<u32>,
    pub target_smem: Option<u32>,
    pub min_blocks: u32,
    pub recoverable_ns: u64,
    pub location_source: LocationSource,
}

/// Whether a configuration is flagged: under 50 %, at least one block fits, and the grid is
/// larger than what the SMs hold at once.
fn flagged<'a>(v: &'a Variant, l: &SmLimits) -> Option<&'a Occupancy> {
    let o = v.occupancy.as_ref()?;
    let fits = o.blocks_per_sm as u64 * l.sm_count as u64;
    (o.occupancy < TARGET && o.blocks_per_sm > 0 && v.config.blocks() > fits).then_some(o)
}

fn block_use(c: &LaunchConfig) -> BlockUse {
    BlockUse {
        threads: c.threads_per_block().min(u32::MAX as u64) as u32,
        regs: c.regs as u32,
        smem: c.smem_bytes().min(u32::MAX as u64) as u32,
        carveout: c.smem_executed,
    }
}

fn kib(b: u32) -> String {
    if b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for row in table.rows.iter().filter(|r| !r.library && matters(r)) {
        let Some(l) = table.limits_of(row.device) else {
            continue;
        };
        let mut impact = 0u64;
        let mut configs = 0u32;
        let mut flagged_launches = 0u64;
        let mut top: Option<(&Variant, &Occupancy)> = None;
        for v in &row.variants {
            if let Some(o) = flagged(v, l) {
                impact += part(v.gpu_ns, 1.0 - o.occupancy / TARGET);
                configs += 1;
                flagged_launches += v.launches;
                top = top.or(Some((v, o)));
            }
        }
        let Some((v, o)) = top else { continue };
        if !worth(impact, row) {
            continue;
        }
        out.push(insight(
            cx,
            &locator,
            row,
            l,
            v,
            o,
            (impact, configs, flagged_launches),
        ));
    }
    out
}

fn insight(
    cx: &Ctx,
    locator: &Locator,
    row: &KernelRow,
    l: &SmLimits,
    v: &Variant,
    o: &Occupancy,
    (impact, configs, flagged_launches): (u64, u32, u64),
) -> Insight {
    let (loc, src) = location(locator, row);
    let b = block_use(&v.config);
    let limiter = o.limiter().unwrap_or(Limiter::Registers);
    let min_blocks = blocks_for(l, o.warps_per_block, TARGET);
    let target_regs = (limiter == Limiter::Registers)
        .then(|| regs_for(l, b, TARGET))
        .flatten();
    let target_smem = (limiter == Limiter::SharedMemory)
        .then(|| smem_for(l, b, TARGET))
        .flatten();
    let pct = o.occupancy * 100.0;
    let change = match (limiter, target_regs, target_smem) {
        (Limiter::Registers, Some(r), _) => format!(" · registers {} → ≤ {r}", b.regs),
        (Limiter::SharedMemory, _, Some(s)) => {
            format!(" · shared memory {} → ≤ {}", kib(b.smem), kib(s))
        }
        _ => String::new(),
    };
    let title = format!(
        "Low occupancy × {}{} · {} at {pct:.1}%, limited by {}{change} · ~{} recoverable",
        row.launches,
        kernel_site::at(&loc),
        crate::kernels::short_name(&row.name),
        limiter.name(),
        fmt_duration(impact)
    );
    let limits: Vec<String> = [
        (Limiter::Registers, o.limit_registers),
        (Limiter::SharedMemory, o.limit_shared_memory),
        (Limiter::Warps, Some(o.limit_warps)),
        (Limiter::Blocks, Some(o.limit_blocks)),
    ]
    .iter()
    .map(|(r, n)| match n {
        Some(n) => format!("{} {n}", r.name()),
        None => format!("{} ∞", r.name()),
    })
    .collect();
    let carveout = if o.carveout_executed {
        format!(
            " in the {} carveout the driver configured",
            kib(o.smem_per_sm)
        )
    } else {
        String::new()
    };
    let others = if configs > 1 {
        format!(
            "; {configs} launch configurations are under {THRESHOLD_PCT}% ({flagged_launches} launches)"
        )
    } else {
        String::new()
    };
    let detail = format!(
        "{}: {} blocks of {} threads ({} warps) per SM = {}/{} warps, {pct:.1}% theoretical occupancy. \
         {} registers per thread ({} a block), {} B shared memory a block ({} with the driver's \
         reserved part){carveout}; blocks per SM by resource: {}. The grid's {} blocks make {:.1} \
         waves{others}. Kernels that wait on memory hide its latency with resident warps; ~{} of \
         its {} could be recovered at {THRESHOLD_PCT}% (an upper bound for a latency-bound \
         kernel){}",
        describe(row),
        o.blocks_per_sm,
        b.threads,
        o.warps_per_block,
        o.warps_per_sm,
        l.max_warps_per_sm,
        b.regs,
        o.regs_per_block,
        b.smem,
        o.smem_per_block,
        limits.join(", "),
        v.config.blocks(),
        v.waves.unwrap_or(0.0),
        fmt_duration(impact),
        fmt_duration(row.total_ns),
        kernel_site::location_note(src)
    );
    let fix = fix_text(l, b, o, limiter, target_regs, target_smem, min_blocks);
    kernel_site::insight(
        cx,
        KernelInsight {
            rule: RULE,
            title,
            detail,
            fix,
            location: loc,
            launches: row.launches,
            impact_ns: impact,
            window_ns: row.device_busy_ns,
        },
    )
    .data(Data {
        kernel: row.name.clone(),
        device: row.device,
        launches: row.launches,
        gpu_ns: row.total_ns,
        busy_share: row.busy_share,
        config: v.config,
        occupancy: o.clone(),
        limiter,
        configs,
        flagged_launches,
        target_regs,
        target_smem,
        min_blocks,
        recoverable_ns: impact,
        location_source: src,
    })
}

fn fix_text(
    l: &SmLimits,
    b: BlockUse,
    o: &Occupancy,
    limiter: Limiter,
    target_regs: Option<u32>,
    target_smem: Option<u32>,
    min_blocks: u32,
) -> String {
    let check =
        " Check `nvcc --resource-usage` (spill stores) and keep the change only if the kernel \
                 gets faster: fewer registers can mean more instructions or spills.";
    match limiter {
        Limiter::Registers => match target_regs {
            Some(r) => format!(
                "Registers {} → ≤ {r} per thread for {THRESHOLD_PCT}% occupancy: \
                 `__launch_bounds__({}, {min_blocks})` on the kernel makes the compiler fit \
                 {min_blocks} blocks of {} threads per SM (or `-maxrregcount={r}` for the whole \
                 file); or hold less per thread (fewer live values, smaller unrolled loops).{check}",
                b.regs, b.threads, b.threads
            ),
            None => format!(
                "Registers ({} per thread) limit the SM to {} blocks, and fewer registers alone \
                 cannot reach {THRESHOLD_PCT}%: another resource caps it too (see the blocks per \
                 SM by resource); reduce both, or use smaller blocks.",
                b.regs, o.blocks_per_sm
            ),
        },
        Limiter::SharedMemory => {
            let max_carveout = occupancy(
                l,
                BlockUse {
                    carveout: None,
                    ..b
                },
            );
            match max_carveout {
                Some(m) if o.carveout_executed && m.occupancy >= TARGET => format!(
                    "The driver configured a {} shared-memory carveout, room for {} blocks; the SM \
                     has {}: `cudaFuncSetAttribute(kernel, \
                     cudaFuncAttributePreferredSharedMemoryCarveout, \
                     cudaSharedmemCarveoutMaxShared)` before the launch gives {} blocks \
                     ({:.1}%).",
                    kib(o.smem_per_sm),
                    o.blocks_per_sm,
                    kib(l.smem_per_sm),
                    m.blocks_per_sm,
                    m.occupancy * 100.0
                ),
                _ => match target_smem {
                    Some(s) => format!(
                        "Shared memory {} → ≤ {} per block for {min_blocks} blocks of {} threads \
                         per SM ({THRESHOLD_PCT}%): smaller tiles, fewer pipeline stages or \
                         buffers, or data kept in registers.",
                        kib(b.smem),
                        kib(s),
                        b.threads
                    ),
                    None => format!(
                        "Shared memory ({} per block) limits the SM to {} blocks and another \
                         resource caps it too: reduce both, or use smaller blocks.",
                        kib(b.smem),
                        o.blocks_per_sm
                    ),
                },
            }
        }
        Limiter::Blocks => {
            let warps = (l.max_warps_per_sm as f64 * TARGET / l.max_blocks_per_sm.max(1) as f64)
                .ceil() as u32;
            format!(
                "Blocks of {} threads: an SM holds at most {} blocks, so it runs {} warps of {}. \
                 Use blocks of at least {} threads ({} warps) with the same work per thread.",
                b.threads,
                l.max_blocks_per_sm,
                o.warps_per_sm,
                l.max_warps_per_sm,
                warps * l.warp_size,
                warps
            )
        }
        Limiter::Warps => format!(
            "Blocks of {} threads ({} warps) leave {} of the SM's {} warp slots unused: choose a \
             block size whose warps divide {} (e.g. 256 or 512 threads).",
            b.threads,
            o.warps_per_block,
            l.max_warps_per_sm - o.warps_per_sm.min(l.max_warps_per_sm),
            l.max_warps_per_sm,
            l.max_warps_per_sm
        ),
    }
}
