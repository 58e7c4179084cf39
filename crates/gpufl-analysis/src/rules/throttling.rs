//! Rule `throttling`: a GPU whose clocks were held down by power or temperature during more than
//! [`MIN_SHARE_PCT`] % of the sampled time (NVML's clocks-event reasons in `telemetry` records).
//!
//! - **Throttled sample:** its `throttle` bitmask has a power reason (software power cap, hardware
//!   power brake), a thermal reason (software or hardware thermal slowdown) or hardware slowdown
//!   ([`throttle::THROTTLING`]). Idle clocks, application clocks, sync boost and display clocks are
//!   settings, not throttling. Each sample stands for the time to the next one (see
//!   [`crate::telemetry`]).
//! - **Fires** per device when throttled time is more than 5 % of the sampled time (exactly 5 % does
//!   not fire).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - **Impact** (an estimate of the time lost): over throttled samples, duration × the GPU's
//!   utilization (NVML, 100 % when unknown) × the SM clock's shortfall from the device's maximum
//!   (`1 − sm_mhz / sm_max_mhz`; 0 when either is unknown): busy time that ran slower.
//! - **Location:** the device (no source line).

use crate::insight::{fmt_duration, share, Insight};
use crate::shared::Ctx;
use crate::telemetry::{throttle_time, Series};
use crate::userframe::SourceLoc;
use gpufl_trace::throttle;
use serde::Serialize;

pub(crate) const RULE: &str = "throttling";
/// Least share of the sampled time (percent, exclusive) under throttling for an insight.
pub const MIN_SHARE_PCT: u64 = 5;
/// Reasons counted in `hardware_ns` (thermal, hardware slowdown, the power brake).
const HARDWARE: u64 = throttle::THERMAL | throttle::HW_SLOWDOWN | throttle::HW_POWER_BRAKE_SLOWDOWN;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    /// Time of the samples with a throttle bitmask, ns.
    pub sampled_ns: u64,
    pub throttled_ns: u64,
    pub throttled_share: f64,
    /// Under power reasons (software power cap, power brake).
    pub power_ns: u64,
    /// Under thermal slowdown (software or hardware).
    pub thermal_ns: u64,
    /// Under hardware slowdown.
    pub hw_slowdown_ns: u64,
    /// Under thermal, hardware slowdown or the power brake.
    pub hardware_ns: u64,
    /// Mean SM clock while throttled, and the device's maximum, MHz.
    pub throttled_sm_mhz: Option<f64>,
    pub sm_max_mhz: Option<u32>,
    /// Highest temperature and power while throttled.
    pub max_temp_c: Option<u32>,
    pub max_power_w: Option<f64>,
    /// The estimated time lost (the impact), ns.
    pub lost_ns: u64,
}

const FIX_POWER: &str = "The GPU ran at its power limit, so the driver lowered its clocks: expected under \
sustained heavy load (large matmuls), but check the limit (`nvidia-smi -q -d POWER,PERFORMANCE`: the enforced \
limit may have been lowered with `nvidia-smi -pl`, or by the system), and note that lower-precision math \
(bf16/fp8 tensor cores) does more work per watt.";
const FIX_THERMAL: &str = "The GPU got too hot (or hardware slowdown engaged) and cut its clocks: check \
cooling (fans, airflow, inlet temperature, dust, a neighbouring hot GPU) with `nvidia-smi -q -d \
TEMPERATURE,PERFORMANCE`; a power brake or hardware slowdown without heat points at the power supply: \
report it to the machine's administrators.";

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    cx.m.telemetry()
        .iter()
        .filter_map(|s| device(cx, s))
        .collect()
}

fn device(cx: &Ctx, s: &Series) -> Option<Insight> {
    let t = throttle_time(s)?;
    if t.throttled_ns as u128 * 100 <= t.sampled_ns as u128 * MIN_SHARE_PCT as u128 {
        return None;
    }
    let d = s.durations();
    let (mut hardware_ns, mut lost, mut throttled) = (0u64, 0f64, 0u64);
    let (mut clk_sum, mut clk_n) = (0f64, 0u64);
    let (mut max_temp, mut max_power) = (None::<u32>, None::<u32>);
    for (i, smp) in s.samples().enumerate() {
        let Some(bits) = smp.throttle else { continue };
        if bits & throttle::THROTTLING == 0 {
            continue;
        }
        throttled += 1;
        if bits & HARDWARE != 0 {
            hardware_ns += d[i];
        }
        if let Some(c) = smp.sm_mhz {
            clk_sum += c as f64;
            clk_n += 1;
        }
        if let Some(x) = smp.temp_c {
            max_temp = Some(max_temp.map_or(x, |m| m.max(x)));
        }
        if let Some(x) = smp.power_mw {
            max_power = Some(max_power.map_or(x, |m| m.max(x)));
        }
        let util = smp.gpu_util.map_or(1.0, |u| (u.min(100) as f64) / 100.0);
        let shortfall = match (smp.sm_mhz, smp.sm_max_mhz) {
            (Some(c), Some(m)) if m > 0 => (1.0 - c as f64 / m as f64).max(0.0),
            _ => 0.0,
        };
        lost += d[i] as f64 * util * shortfall;
    }
    let lost_ns = lost.round() as u64;
    let sm_max = s.samples().filter_map(|x| x.sm_max_mhz).max();
    let clk = (clk_n > 0).then(|| clk_sum / clk_n as f64);
    let pct = |ns: u64| share(ns, t.sampled_ns) * 100.0;
    let mut causes = Vec::new();
    for (ns, what) in [
        (t.power_ns, "power"),
        (t.thermal_ns, "thermal"),
        (t.hw_slowdown_ns, "hardware slowdown"),
    ] {
        if ns > 0 {
            causes.push(format!("{what} {:.0}%", pct(ns)));
        }
    }
    let clock = match (clk, sm_max) {
        (Some(c), Some(m)) => format!(" · SM clock {c:.0} of {m} MHz"),
        (Some(c), None) => format!(" · SM clock {c:.0} MHz"),
        _ => String::new(),
    };
    let title = format!(
        "Throttling on GPU {} · {:.1}% of the time ({}){clock}",
        s.device,
        pct(t.throttled_ns),
        causes.join(", ")
    );
    let mut detail = format!(
        "clocks were held down during {} of {} sampled ({throttled} of {} samples)",
        fmt_duration(t.throttled_ns),
        fmt_duration(t.sampled_ns),
        t.samples
    );
    if let Some(x) = max_temp {
        detail += &format!(", up to {x} °C");
    }
    if let Some(x) = max_power {
        detail += &format!(", up to {:.0} W", x as f64 / 1000.0);
    }
    detail += &format!(
        "; ~{} of GPU work ran slower than at full clock (utilization × clock shortfall)",
        fmt_duration(lost_ns)
    );
    let fix = if t.thermal_ns + t.hw_slowdown_ns > 0 {
        FIX_THERMAL
    } else {
        FIX_POWER
    };
    Some(
        Insight::new(RULE, SourceLoc::device(s.device), title, detail, fix)
            .count(throttled)
            .impact(lost_ns, t.sampled_ns, cx.wall_ns)
            .data(Data {
                device: s.device,
                sampled_ns: t.sampled_ns,
                throttled_ns: t.throttled_ns,
                throttled_share: t.throttled_share,
                power_ns: t.power_ns,
                thermal_ns: t.thermal_ns,
                hw_slowdown_ns: t.hw_slowdown_ns,
                hardware_ns,
                throttled_sm_mhz: clk,
                sm_max_mhz: sm_max,
                max_temp_c: max_temp,
                max_power_w: max_power.map(|p| p as f64 / 1000.0),
                lost_ns,
            }),
    )
}
