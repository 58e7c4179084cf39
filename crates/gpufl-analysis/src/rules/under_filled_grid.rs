//! Rule `under-filled-grid`: a kernel that matters leaves SMs idle because its grid is too small —
//! fewer blocks than SMs — or ends with a last wave less than half full.
//!
//! - **Per kernel name and device** (kernel table), library kernels included (a small grid is
//!   then the size of the problem handed to the library: a larger batch fills it), from
//!   [`MIN_BUSY_PCT`](crate::shared::kernel_site::MIN_BUSY_PCT) % of the device's busy time and a mean
//!   duration of at least [`MIN_MEAN_NS`] (a shorter kernel is dominated by its fixed launch and
//!   ramp-up costs, which more blocks do not shorten; `launch-bound` covers many tiny launches).
//! - **Fires** for each launch configuration with
//!   - *fewer blocks than SMs* (`blocks < SMs`): `1 − blocks / SMs` of the GPU idles throughout;
//!   - or a *last wave less than half full*: with `per_wave = blocks per SM × SMs` (theoretical
//!     occupancy, so it needs the device's limits), at least two waves (`blocks > per_wave`) and a
//!     last one holding `tail = blocks mod per_wave` with `0 < tail < per_wave / 2`. If every wave
//!     takes as long, the idle share of the kernel's SM time is `(1 − tail / per_wave) / waves`
//!     (waves rounded up);
//!   - either way an idle share of at least [`MIN_IDLE_PCT`] % (so at most 90 % of the SMs have
//!     a block, or a partial wave after at most a few full ones), at least [`MIN_MEAN_NS`] a
//!     launch, and flagged configurations adding up to [`MIN_BUSY_PCT`] % of the device's busy
//!     time.
//! - **Impact:** Σ over those configurations of their launches' time *alone* on the device (no
//!   other kernel running: a concurrent kernel on another stream uses the idle SMs) × that idle
//!   share: what spreading the same work evenly over every SM would recover, an upper bound (a
//!   block's work may not split).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::{fmt_duration, Insight};
use crate::kernels::{alone_times as kernel_alone_times, KernelRow, KernelTable, Variant};
use crate::occupancy::SmLimits;
use crate::shared::kernel_site::MIN_BUSY_PCT;
use crate::shared::kernel_site::{self, describe, location, matters, part, worth, KernelInsight};
use crate::shared::timeline::{LocationSource, Locator};
use crate::shared::Ctx;
use crate::store::NONE;
use crate::views::LaunchConfig;
use serde::Serialize;
use std::collections::HashMap;

pub(crate) const RULE: &str = "under-filled-grid";
/// Kernels shorter than this on average (ns) are left out.
pub const MIN_MEAN_NS: u64 = 10_000;
/// A configuration must leave at least this share of the kernel's SM time idle, percent (a
/// partial last wave after many full ones idles little).
pub const MIN_IDLE_PCT: u64 = 10;

/// How a grid under-fills the GPU.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// Fewer blocks than SMs.
    FewerBlocksThanSms,
    /// Several waves, the last less than half full.
    PartialLastWave,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub kernel: String,
    pub device: u32,
    pub launches: u64,
    pub gpu_ns: u64,
    pub busy_share: f64,
    pub shape: Shape,
    /// The flagged configuration with the most GPU time.
    pub config: LaunchConfig,
    pub blocks: u64,
    pub sm_count: u32,
    /// Blocks one wave holds (`blocks per SM × SMs`), when the occupancy is known.
    pub blocks_per_wave: Option<u64>,
    pub waves: Option<f64>,
    /// Blocks of the last wave over `blocks_per_wave` (the fill of the only wave when fewer
    /// blocks than SMs, over the SM count), 0..1.
    pub last_wave_fill: f64,
    /// The share of the kernel's SM time left idle, 0..1.
    pub idle_share: f64,
    /// Time the flagged launches ran with no other kernel on the device, ns.
    pub alone_ns: u64,
    pub configs: u32,
    pub flagged_launches: u64,
    pub recoverable_ns: u64,
    pub location_source: LocationSource,
}

/// How a configuration under-fills the GPU: its shape, blocks per wave, fill of the last wave and
/// idle share; None when it does not.
fn under_fill(v: &Variant, sms: u32) -> Option<(Shape, Option<u64>, f64, f64)> {
    let blocks = v.config.blocks();
    if blocks == 0 || sms == 0 {
        return None;
    }
    let per_wave = v
        .occupancy
        .as_ref()
        .map(|o| o.blocks_per_sm as u64 * sms as u64)
        .filter(|&w| w > 0);
    if blocks < sms as u64 {
        let fill = blocks as f64 / sms as f64;
        return Some((Shape::FewerBlocksThanSms, per_wave, fill, 1.0 - fill));
    }
    let w = per_wave?;
    let tail = blocks % w;
    if blocks <= w || tail == 0 || tail * 2 >= w {
        return None;
    }
    let fill = tail as f64 / w as f64;
    let waves = blocks.div_ceil(w) as f64;
    Some((Shape::PartialLastWave, Some(w), fill, (1.0 - fill) / waves))
}

fn sm_count(cx: &Ctx, table: &KernelTable, dev: u32) -> Option<u32> {
    if let Some(l) = table.limits_of(dev) {
        return Some(l.sm_count);
    }
    let g = cx.m.header()?.gpus.iter().find(|g| g.index == dev)?;
    (g.sm_count > 0).then_some(g.sm_count)
}

/// A flagged configuration: its row, variant, SM count and under-fill.
struct Flag<'t> {
    row: usize,
    v: &'t Variant,
    sms: u32,
    fill: Fill,
    /// Its launches' time alone on the device (no other kernel running), ns.
    alone_ns: u64,
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let mut flags: Vec<Flag> = Vec::new();
    for (r, row) in table.rows.iter().enumerate().filter(|(_, r)| matters(r)) {
        let Some(sms) = sm_count(cx, table, row.device) else {
            continue;
        };
        let before = flags.len();
        for v in &row.variants {
            if v.gpu_ns < MIN_MEAN_NS.saturating_mul(v.launches) {
                continue;
            }
            if let Some(fill) = under_fill(v, sms).filter(|f| f.3 * 100.0 >= MIN_IDLE_PCT as f64) {
                flags.push(Flag {
                    row: r,
                    v,
                    sms,
                    fill,
                    alone_ns: 0,
                });
            }
        }
        // The flagged launches themselves must matter, and could recover enough even if they
        // ran alone (the time alone, costlier to find, is only looked for then).
        let flagged_ns: u64 = flags[before..].iter().map(|f| f.v.gpu_ns).sum();
        let bound: u64 = flags[before..]
            .iter()
            .map(|f| part(f.v.gpu_ns, f.fill.3))
            .sum();
        if (flagged_ns as u128) * 100 < row.device_busy_ns as u128 * MIN_BUSY_PCT as u128
            || !worth(bound, row)
        {
            flags.truncate(before);
        }
    }
    if flags.is_empty() {
        return Vec::new();
    }
    alone_times(cx, table, &mut flags);

    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for group in flags.chunk_by(|a, b| a.row == b.row) {
        let row = &table.rows[group[0].row];
        let impact: u64 = group.iter().map(|f| part(f.alone_ns, f.fill.3)).sum();
        if !worth(impact, row) {
            continue;
        }
        let launches = group.iter().map(|f| f.v.launches).sum();
        let alone: u64 = group.iter().map(|f| f.alone_ns).sum();
        let f = &group[0];
        let l = table.limits_of(row.device);
        out.push(insight(
            cx,
            &locator,
            row,
            (f.v, f.fill, f.sms, l),
            (impact, alone, group.len() as u32, launches),
        ));
    }
    out
}

/// Fill in each flag's time alone on its device ([`alone_times`]: one pass over the kernels).
fn alone_times(cx: &Ctx, table: &KernelTable, flags: &mut [Flag]) {
    let m = cx.m;
    // Flags of each (name, configuration) pair of the model, with their device.
    let mut by_launch: Vec<Vec<(u32, u32)>> = vec![Vec::new(); m.launches.len()];
    let mut want: HashMap<(u32, u32), Vec<(u32, u32)>> = HashMap::new();
    let mut devs: Vec<u32> = Vec::new();
    for (i, f) in flags.iter().enumerate() {
        let row = &table.rows[f.row];
        for &id in &row.name_ids {
            want.entry((id, f.v.config_id))
                .or_default()
                .push((row.device, i as u32));
        }
        if !devs.contains(&row.device) {
            devs.push(row.device);
        }
    }
    devs.sort_unstable();
    for (l, key) in m.launches.iter().enumerate() {
        if let Some(v) = want.get(key) {
            by_launch[l] = v.clone();
        }
    }
    drop(want);
    let flag_of = |l: u32, dev: u32| -> u32 {
        by_launch
            .get(l as usize)
            .and_then(|v| v.iter().find(|x| x.0 == dev))
            .map_or(NONE, |x| x.1)
    };
    let alone = kernel_alone_times(m, &devs, flags.len(), flag_of);
    for (f, t) in flags.iter_mut().zip(alone) {
        f.alone_ns = t;
    }
}

type Fill = (Shape, Option<u64>, f64, f64);

fn insight(
    cx: &Ctx,
    locator: &Locator,
    row: &KernelRow,
    (v, (shape, per_wave, fill, idle), sms, l): (&Variant, Fill, u32, Option<&SmLimits>),
    (impact, alone, configs, flagged_launches): (u64, u64, u32, u64),
) -> Insight {
    let (loc, src) = location(locator, row);
    let c = &v.config;
    let blocks = c.blocks();
    let threads = c.threads_per_block();
    let name = crate::kernels::short_name(&row.name);
    let what = match shape {
        Shape::FewerBlocksThanSms => format!(
            "{name} runs {blocks} block{} on {sms} SMs",
            if blocks == 1 { "" } else { "s" }
        ),
        Shape::PartialLastWave => format!(
            "{name}'s last wave is {:.0}% full ({blocks} blocks, {} a wave)",
            fill * 100.0,
            per_wave.unwrap_or(0)
        ),
    };
    let title = format!(
        "Under-filled grid × {}{} · {what} · ~{} recoverable",
        row.launches,
        kernel_site::at(&loc),
        fmt_duration(impact)
    );
    let occ = v
        .occupancy
        .as_ref()
        .map(|o| {
            format!(
                " (theoretical occupancy {:.1}%: {} blocks per SM)",
                o.occupancy * 100.0,
                o.blocks_per_sm
            )
        })
        .unwrap_or_default();
    let shape_text = match shape {
        Shape::FewerBlocksThanSms => format!(
            "a grid of {blocks} blocks of {threads} threads on {sms} SMs: {} SMs have no block \
             for the whole kernel{occ}",
            sms as u64 - blocks
        ),
        Shape::PartialLastWave => format!(
            "a grid of {blocks} blocks of {threads} threads, {} a wave{occ}: {:.2} waves, the \
             last {:.0}% full, so most SMs idle while it runs",
            per_wave.unwrap_or(0),
            v.waves.unwrap_or(0.0),
            fill * 100.0
        ),
    };
    let others = if configs > 1 {
        format!("; {configs} launch configurations under-fill ({flagged_launches} launches)")
    } else {
        String::new()
    };
    let detail = format!(
        "{}: {shape_text}. {:.0}% of its SM time is idle; {} of its {} ran with no other kernel \
         on the GPU to use the idle SMs, so ~{} would be recovered if the work were spread over \
         every SM{others}{}",
        describe(row),
        idle * 100.0,
        fmt_duration(alone),
        fmt_duration(row.total_ns),
        fmt_duration(impact),
        kernel_site::location_note(src)
    );
    let library = if row.library {
        " A library kernel: hand it more work per call (a larger batch, fused or batched \
         operations)."
    } else {
        ""
    };
    let fix = match shape {
        Shape::FewerBlocksThanSms => format!(
            "Give every SM work: at least {sms} blocks, better several per SM — split each \
             block's work over more, smaller blocks (a grid-stride loop over {} blocks or more), \
             parallelize the loop a block runs, or run independent work concurrently on other \
             streams.{library}",
            per_wave.unwrap_or(sms as u64)
        ),
        Shape::PartialLastWave => format!(
            "Make the grid a whole number of waves ({} blocks = {} per SM × {sms} SMs): change \
             the work per block so the grid is a multiple of it, or launch {} blocks with a \
             grid-stride loop.{library}",
            per_wave.unwrap_or(0),
            l.zip(v.occupancy.as_ref())
                .map_or(0, |(_, o)| o.blocks_per_sm),
            per_wave.unwrap_or(0)
        ),
    };
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
        shape,
        config: *c,
        blocks,
        sm_count: sms,
        blocks_per_wave: per_wave,
        waves: v.waves,
        last_wave_fill: fill,
        idle_share: idle,
        alone_ns: alone,
        configs,
        flagged_launches,
        recoverable_ns: impact,
        location_source: src,
    })
}
