//! GPU telemetry (`telemetry` records, NVML samples): one series per device in the model, and the
//! per-device summary of the analysis (min / mean / max of each metric, throttling, ECC, PCIe).
//!
//! **Time of a sample.** Sample `i` stands for `[ts_i, ts_{i+1})`, at most twice the series'
//! median period (a stalled sampler does not stretch one sample over the gap); the last sample
//! stands for one median period. Shares ("throttled 12 % of the time") are of the summed durations,
//! the *sampled time*. Means are plain means over the samples that have the metric.

use crate::store::Col;
use gpufl_trace::{throttle, Telemetry};
use serde::Serialize;

/// Presence bits of a sample's optional metrics.
const P_GPU_UTIL: u16 = 1;
const P_MEM_UTIL: u16 = 1 << 1;
const P_MEM_USED: u16 = 1 << 2;
const P_MEM_TOTAL: u16 = 1 << 3;
const P_TEMP: u16 = 1 << 4;
const P_POWER: u16 = 1 << 5;
const P_SM: u16 = 1 << 6;
const P_MEM_MHZ: u16 = 1 << 7;
const P_SM_MAX: u16 = 1 << 8;
const P_THROTTLE: u16 = 1 << 9;
const P_ECC_CORR: u16 = 1 << 10;
const P_ECC_UNCORR: u16 = 1 << 11;
const P_PCIE_TX: u16 = 1 << 12;
const P_PCIE_RX: u16 = 1 << 13;

/// The telemetry samples of one device, column by column (94 bytes per sample): a presence mask
/// and one column per metric (0 where absent).
#[derive(Debug, Default)]
pub struct Series {
    pub device: u32,
    ts: Col<u64>,
    present: Col<u16>,
    u32s: [Col<u32>; 7],
    u64s: [Col<u64>; 7],
}

impl Series {
    fn new(device: u32) -> Series {
        Series {
            device,
            ..Series::default()
        }
    }

    pub(crate) fn push(&mut self, t: &Telemetry) {
        let mut p = 0u16;
        let mut bit = |o: Option<u64>, b: u16| -> u64 {
            if o.is_some() {
                p |= b;
            }
            o.unwrap_or(0)
        };
        let u32v = [
            bit(t.gpu_util.map(u64::from), P_GPU_UTIL),
            bit(t.mem_util.map(u64::from), P_MEM_UTIL),
            bit(t.temp_c.map(u64::from), P_TEMP),
            bit(t.power_mw.map(u64::from), P_POWER),
            bit(t.sm_mhz.map(u64::from), P_SM),
            bit(t.mem_mhz.map(u64::from), P_MEM_MHZ),
            bit(t.sm_max_mhz.map(u64::from), P_SM_MAX),
        ];
        let u64v = [
            bit(t.mem_used, P_MEM_USED),
            bit(t.mem_total, P_MEM_TOTAL),
            bit(t.throttle, P_THROTTLE),
            bit(t.ecc_corr, P_ECC_CORR),
            bit(t.ecc_uncorr, P_ECC_UNCORR),
            bit(t.pcie_tx_kbs, P_PCIE_TX),
            bit(t.pcie_rx_kbs, P_PCIE_RX),
        ];
        self.ts.push(t.ts);
        self.present.push(p);
        for (c, v) in self.u32s.iter_mut().zip(u32v) {
            c.push(v as u32);
        }
        for (c, v) in self.u64s.iter_mut().zip(u64v) {
            c.push(v);
        }
    }

    pub fn len(&self) -> usize {
        self.ts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ts.len() == 0
    }

    /// Sample `i` as the record it came from.
    pub fn get(&self, i: usize) -> Telemetry {
        let p = self.present.get(i);
        let a = |k: usize, b: u16| (p & b != 0).then(|| self.u32s[k].get(i));
        let b = |k: usize, b: u16| (p & b != 0).then(|| self.u64s[k].get(i));
        Telemetry {
            ts: self.ts.get(i),
            dev: self.device,
            gpu_util: a(0, P_GPU_UTIL),
            mem_util: a(1, P_MEM_UTIL),
            temp_c: a(2, P_TEMP),
            power_mw: a(3, P_POWER),
            sm_mhz: a(4, P_SM),
            mem_mhz: a(5, P_MEM_MHZ),
            sm_max_mhz: a(6, P_SM_MAX),
            mem_used: b(0, P_MEM_USED),
            mem_total: b(1, P_MEM_TOTAL),
            throttle: b(2, P_THROTTLE),
            ecc_corr: b(3, P_ECC_CORR),
            ecc_uncorr: b(4, P_ECC_UNCORR),
            pcie_tx_kbs: b(5, P_PCIE_TX),
            pcie_rx_kbs: b(6, P_PCIE_RX),
        }
    }

    /// Every sample, in time order.
    pub fn samples(&self) -> impl Iterator<Item = Telemetry> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    pub fn ts(&self, i: usize) -> u64 {
        self.ts.get(i)
    }

    /// Median interval between consecutive samples, ns (0 with fewer than two).
    pub fn median_period_ns(&self) -> u64 {
        let mut d: Vec<u64> = self
            .ts
            .iter()
            .zip(self.ts.iter().skip(1))
            .map(|(a, b)| b.saturating_sub(a))
            .collect();
        if d.is_empty() {
            return 0;
        }
        d.sort_unstable();
        d[d.len() / 2]
    }

    /// How long each sample stands for (see the module's doc), ns.
    pub fn durations(&self) -> Vec<u64> {
        let p = self.median_period_ns();
        let n = self.len();
        (0..n)
            .map(|i| {
                if i + 1 < n {
                    self.ts(i + 1).saturating_sub(self.ts(i)).min(2 * p)
                } else {
                    p
                }
            })
            .collect()
    }

    /// Put the samples in time order (stable), if they are not.
    fn sort(&mut self) {
        let sorted = self
            .ts
            .iter()
            .zip(self.ts.iter().skip(1))
            .all(|(a, b)| a <= b);
        if sorted {
            return;
        }
        let mut all: Vec<Telemetry> = self.samples().collect();
        all.sort_by_key(|t| t.ts);
        let mut s = Series::new(self.device);
        for t in &all {
            s.push(t);
        }
        *self = s;
    }
}

/// Per-device series, as the model loads them.
#[derive(Debug, Default)]
pub(crate) struct SeriesSet {
    /// Sorted by device.
    pub(crate) series: Vec<Series>,
}

impl SeriesSet {
    /// Add a sample to its device's series; false (left out) for a device beyond the first
    /// `max_devices`.
    pub(crate) fn push(&mut self, t: &Telemetry, max_devices: usize) -> bool {
        let i = match self.series.binary_search_by_key(&t.dev, |s| s.device) {
            Ok(i) => i,
            Err(_) if self.series.len() >= max_devices => return false,
            Err(i) => {
                self.series.insert(i, Series::new(t.dev));
                i
            }
        };
        if let Some(s) = self.series.get_mut(i) {
            s.push(t);
        }
        true
    }

    pub(crate) fn finish(&mut self) {
        for s in &mut self.series {
            s.sort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Summary
// ---------------------------------------------------------------------------------------------

/// Min, mean and max of one metric over the samples that have it.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Stat {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
    /// Samples with the metric.
    pub samples: u64,
}

fn stat(v: impl Iterator<Item = f64>) -> Option<Stat> {
    let (mut n, mut sum, mut lo, mut hi) = (0u64, 0.0, f64::INFINITY, f64::NEG_INFINITY);
    for x in v {
        n += 1;
        sum += x;
        lo = lo.min(x);
        hi = hi.max(x);
    }
    (n > 0).then(|| Stat {
        min: lo,
        mean: sum / n as f64,
        max: hi,
        samples: n,
    })
}

/// Time under each kind of clock throttling.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct ThrottleTime {
    /// Samples with the throttle bitmask.
    pub samples: u64,
    /// Time of those samples, ns: the denominator of the shares.
    pub sampled_ns: u64,
    /// Under any of power, thermal or hardware slowdown ([`throttle::THROTTLING`]).
    pub throttled_ns: u64,
    /// Under the software power cap or the power brake ([`throttle::POWER`]).
    pub power_ns: u64,
    /// Under thermal slowdown, software or hardware ([`throttle::THERMAL`]).
    pub thermal_ns: u64,
    /// Under hardware slowdown ([`throttle::HW_SLOWDOWN`]).
    pub hw_slowdown_ns: u64,
    /// `throttled_ns / sampled_ns`, 0..1.
    pub throttled_share: f64,
}

/// ECC volatile counters over the session (present when the GPU reported them).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct EccCounts {
    /// At the first and the last sample (counted since the driver loaded).
    pub corrected_first: u64,
    pub corrected_last: u64,
    pub uncorrected_first: u64,
    pub uncorrected_last: u64,
}

/// One device's telemetry (the `telemetry` field of the analysis).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DeviceTelemetry {
    pub device: u32,
    pub samples: u64,
    /// Median interval between samples, ns.
    pub period_ns: u64,
    /// First sample to last, ns.
    pub span_ns: u64,
    /// Offset of the first sample from the session's first record, ns (negative: before it).
    pub start_offset_ns: i64,
    pub gpu_util_pct: Option<Stat>,
    pub mem_util_pct: Option<Stat>,
    pub mem_used_bytes: Option<Stat>,
    /// Largest `mem_total` seen, bytes.
    pub mem_total_bytes: Option<u64>,
    pub temp_c: Option<Stat>,
    pub power_w: Option<Stat>,
    pub sm_mhz: Option<Stat>,
    pub mem_mhz: Option<Stat>,
    pub sm_max_mhz: Option<u32>,
    pub throttle: Option<ThrottleTime>,
    pub ecc: Option<EccCounts>,
    pub pcie_tx_kbs: Option<Stat>,
    pub pcie_rx_kbs: Option<Stat>,
}

/// Throttling time of a series (None when no sample has the bitmask).
pub(crate) fn throttle_time(s: &Series) -> Option<ThrottleTime> {
    let d = s.durations();
    let mut t = ThrottleTime::default();
    for (i, smp) in s.samples().enumerate() {
        let Some(bits) = smp.throttle else { continue };
        let dt = d[i];
        t.samples += 1;
        t.sampled_ns += dt;
        if bits & throttle::THROTTLING != 0 {
            t.throttled_ns += dt;
        }
        if bits & throttle::POWER != 0 {
            t.power_ns += dt;
        }
        if bits & throttle::THERMAL != 0 {
            t.thermal_ns += dt;
        }
        if bits & throttle::HW_SLOWDOWN != 0 {
            t.hw_slowdown_ns += dt;
        }
    }
    t.throttled_share = crate::text::share(t.throttled_ns, t.sampled_ns);
    (t.samples > 0).then_some(t)
}

/// Summarize one series; `origin` is the session's first record (trace clock).
pub fn summarize(s: &Series, origin: u64) -> DeviceTelemetry {
    let all: Vec<Telemetry> = s.samples().collect();
    let f = |g: &dyn Fn(&Telemetry) -> Option<f64>| stat(all.iter().filter_map(g));
    let first = all.first().map_or(0, |t| t.ts);
    let last = all.last().map_or(0, |t| t.ts);
    let ecc = {
        let c: Vec<(u64, u64)> = all
            .iter()
            .filter_map(|t| Some((t.ecc_corr?, t.ecc_uncorr?)))
            .collect();
        match (c.first(), c.last()) {
            (Some(a), Some(b)) => Some(EccCounts {
                corrected_first: a.0,
                corrected_last: b.0,
                uncorrected_first: a.1,
                uncorrected_last: b.1,
            }),
            _ => None,
        }
    };
    DeviceTelemetry {
        device: s.device,
        samples: all.len() as u64,
        period_ns: s.median_period_ns(),
        span_ns: last - first,
        start_offset_ns: (first as i128 - origin as i128).clamp(i64::MIN as i128, i64::MAX as i128)
            as i64,
        gpu_util_pct: f(&|t| t.gpu_util.map(f64::from)),
        mem_util_pct: f(&|t| t.mem_util.map(f64::from)),
        mem_used_bytes: f(&|t| t.mem_used.map(|v| v as f64)),
        mem_total_bytes: all.iter().filter_map(|t| t.mem_total).max(),
        temp_c: f(&|t| t.temp_c.map(f64::from)),
        power_w: f(&|t| t.power_mw.map(|v| v as f64 / 1000.0)),
        sm_mhz: f(&|t| t.sm_mhz.map(f64::from)),
        mem_mhz: f(&|t| t.mem_mhz.map(f64::from)),
        sm_max_mhz: all.iter().filter_map(|t| t.sm_max_mhz).max(),
        throttle: throttle_time(s),
        ecc,
        pcie_tx_kbs: f(&|t| t.pcie_tx_kbs.map(|v| v as f64)),
        pcie_rx_kbs: f(&|t| t.pcie_rx_kbs.map(|v| v as f64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ts: u64) -> Telemetry {
        Telemetry {
            ts,
            dev: 2,
            ..Telemetry::default()
        }
    }

    #[test]
    fn series_keeps_absent_apart_from_zero_and_sorts() {
        let mut set = SeriesSet::default();
        let full = Telemetry {
            gpu_util: Some(0),
            mem_util: Some(3),
            mem_used: Some(u64::MAX),
            mem_total: Some(7),
            temp_c: Some(u32::MAX),
            power_mw: Some(1),
            sm_mhz: Some(2),
            mem_mhz: Some(3),
            sm_max_mhz: Some(4),
            throttle: Some(0),
            ecc_corr: Some(5),
            ecc_uncorr: Some(6),
            pcie_tx_kbs: Some(8),
            pcie_rx_kbs: Some(9),
            ..t(300)
        };
        set.push(&full, 64);
        set.push(&t(100), 64);
        set.push(&Telemetry { dev: 0, ..t(5) }, 64);
        set.finish();
        assert_eq!(
            set.series.iter().map(|s| s.device).collect::<Vec<_>>(),
            vec![0, 2]
        );
        let s = &set.series[1];
        assert_eq!(s.get(0), t(100), "sorted, and absent stays absent");
        assert_eq!(s.get(1), full, "zero stays zero");
    }

    #[test]
    fn durations_cap_gaps_and_give_the_last_sample_one_period() {
        let mut set = SeriesSet::default();
        for ts in [0, 100, 200, 300, 1300, 1400] {
            set.push(&t(ts), 64);
        }
        let s = &set.series[0];
        assert_eq!(s.median_period_ns(), 100);
        assert_eq!(s.durations(), vec![100, 100, 100, 200, 100, 100]);
    }

    #[test]
    fn summary_min_mean_max_and_throttle_time() {
        let mut set = SeriesSet::default();
        let mk = |ts, util, bits| Telemetry {
            gpu_util: util,
            throttle: Some(bits),
            power_mw: Some(300_000 + ts as u32),
            ..t(ts)
        };
        set.push(&mk(1000, Some(10), throttle::GPU_IDLE), 64);
        set.push(&mk(1100, Some(90), throttle::SW_POWER_CAP), 64);
        set.push(
            &mk(
                1200,
                None,
                throttle::SW_THERMAL_SLOWDOWN | throttle::HW_SLOWDOWN,
            ),
            64,
        );
        set.push(&mk(1300, Some(50), 0), 64);
        let d = summarize(&set.series[0], 900);
        assert_eq!(
            (d.samples, d.period_ns, d.span_ns, d.start_offset_ns),
            (4, 100, 300, 100)
        );
        let u = d.gpu_util_pct.unwrap();
        assert_eq!((u.min, u.mean, u.max, u.samples), (10.0, 50.0, 90.0, 3));
        assert_eq!(d.power_w.unwrap().max, 301.3);
        assert!(d.temp_c.is_none() && d.ecc.is_none() && d.pcie_tx_kbs.is_none());
        let th = d.throttle.unwrap();
        assert_eq!(
            (
                th.sampled_ns,
                th.throttled_ns,
                th.power_ns,
                th.thermal_ns,
                th.hw_slowdown_ns
            ),
            (400, 200, 100, 100, 100)
        );
        assert_eq!(th.throttled_share, 0.5);
    }
}
