//! The kernel table: per kernel name and device, its launches, GPU time (total, mean, median, p99),
//! its share of the device's busy time, its launch configuration with registers, shared and local
//! memory, and its theoretical occupancy with the limiting resource ([`crate::occupancy`]). The
//! kernel rules (`low-occupancy`, `register-spill`, `under-filled-grid`) read it.
//!
//! - **Busy share:** the union of the kernel's own intervals (its concurrent launches count once)
//!   over the union of everything the device ran (kernels, copies, memsets), as the totals count
//!   busy time; shares of concurrent kernels can therefore add up to more than 100 %.
//! - **Configurations:** launches of one kernel may differ (grid sizes that follow the input,
//!   dynamic shared memory); the row shows the configuration with the most GPU time and counts the
//!   others (`configs`); the rules weigh each configuration by its own GPU time.
//! - Memory: one index per kernel (4 bytes) to group them by name, and the durations of one
//!   kernel name at a time.

use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::occupancy::{occupancy, waves, BlockUse, Occupancy, SmLimits};
use crate::store::NONE;
use crate::views::LaunchConfig;
use gpufl_trace::StrId;
use serde::Serialize;
use std::collections::HashMap;

/// Substrings of kernel names that mark a vendor library's tuned kernel (cuBLAS / cuBLASLt, CUTLASS,
/// cuDNN, cuFFT, cuSPARSE): their registers and shared memory are chosen on purpose, often at low
/// occupancy, and the user cannot change them.
pub const LIBRARY_PATTERNS: [&str; 7] = [
    "xmma", "cutlass", "cublas", "cudnn", "nvjet", "cufft", "cusparse",
];

/// Whether a kernel name is a vendor library's ([`LIBRARY_PATTERNS`], case-insensitive).
pub fn is_library_kernel(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    LIBRARY_PATTERNS.iter().any(|p| lower.contains(p))
}

/// One launch configuration of a kernel, with its share of the launches.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Variant {
    /// Index of the configuration in the model ([`Model::configs`]).
    #[serde(skip)]
    pub(crate) config_id: u32,
    pub config: LaunchConfig,
    pub launches: u64,
    pub gpu_ns: u64,
    pub occupancy: Option<Occupancy>,
    /// Grid blocks over the blocks one wave holds (`blocks_per_sm × SMs`).
    pub waves: Option<f64>,
}

/// One kernel name on one device.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelRow {
    /// Demangled kernel name.
    pub name: String,
    pub device: u32,
    pub launches: u64,
    /// Summed kernel durations, ns.
    pub total_ns: u64,
    pub mean_ns: u64,
    /// Median and 99th percentile (nearest rank) of the durations, ns.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Union of the kernel's intervals, ns.
    pub busy_ns: u64,
    /// `busy_ns` over the device's busy time, 0..1.
    pub busy_share: f64,
    /// Distinct launch configurations.
    pub configs: u32,
    /// The configuration with the most GPU time (its figures below).
    pub launch: LaunchConfig,
    pub blocks: u64,
    pub threads_per_block: u64,
    /// Theoretical occupancy of that configuration (None without the device's limits).
    pub occupancy: Option<Occupancy>,
    pub waves: Option<f64>,
    /// A vendor library's kernel ([`LIBRARY_PATTERNS`]).
    pub library: bool,
    /// The device's busy time (union of kernels, copies, memsets), ns.
    #[serde(skip)]
    pub(crate) device_busy_ns: u64,
    /// Every configuration, most GPU time first (not serialized: the rules read it).
    #[serde(skip)]
    pub variants: Vec<Variant>,
    /// Model string ids of the name (one per trace file that interned it).
    #[serde(skip)]
    pub(crate) name_ids: Vec<u32>,
}

/// Limits a device's occupancy was computed with.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DeviceLimits {
    pub device: u32,
    pub limits: SmLimits,
}

/// The kernel table of a session.
#[derive(Serialize, Clone, Debug, PartialEq, Default)]
pub struct KernelTable {
    /// Per device with kernels and known limits.
    pub limits: Vec<DeviceLimits>,
    /// Most GPU time first (then name, then device).
    pub rows: Vec<KernelRow>,
}

impl KernelTable {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The limits of a device, if known.
    pub fn limits_of(&self, dev: u32) -> Option<&SmLimits> {
        self.limits
            .iter()
            .find(|d| d.device == dev)
            .map(|d| &d.limits)
    }
}

/// `(median, p99)` of a sorted slice, as the other rules compute them (median of an even count:
/// the lower middle plus half the gap; p99 nearest rank); `(0, 0)` when empty.
fn median_p99_sorted(v: &[u64]) -> (u64, u64) {
    let n = v.len();
    if n == 0 {
        return (0, 0);
    }
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2
    };
    let rank = (n * 99).div_ceil(100).max(1);
    (med, v[rank - 1])
}

fn sat_u32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

/// The occupancy and waves of one configuration on a device.
fn figures(l: Option<&SmLimits>, c: &LaunchConfig) -> (Option<Occupancy>, Option<f64>) {
    let Some(l) = l else { return (None, None) };
    let o = occupancy(
        l,
        BlockUse {
            threads: sat_u32(c.threads_per_block()),
            regs: c.regs as u32,
            smem: sat_u32(c.smem_bytes()),
            carveout: c.smem_executed,
        },
    );
    let w = o.as_ref().and_then(|o| waves(l, o.blocks_per_sm, c.blocks()));
    (o, w)
}

/// Build the kernel table.
pub fn table<'m>(m: &'m Model, busy: &DeviceBusy) -> KernelTable {
    let nk = m.kernel_count();
    if nk == 0 {
        return KernelTable::default();
    }
    let k = &m.kernels;
    // Devices' limits from the header (GPU index = record `dev`).
    let mut limits: Vec<DeviceLimits> = Vec::new();
    if let Some(h) = m.header() {
        for &dev in m.devices() {
            if let Some(l) = h
                .gpus
                .iter()
                .find(|g| g.index == dev)
                .and_then(SmLimits::from_gpu)
            {
                limits.push(DeviceLimits { device: dev, limits: l });
            }
        }
    }

    // One id per distinct name string (trace files of a session intern names again).
    let mut canon: Vec<u32> = vec![NONE; m.strings.len()];
    let mut first: HashMap<&'m str, u32> = HashMap::new();
    let key = |canon: &mut Vec<u32>, first: &mut HashMap<&'m str, u32>, id: u32| -> u32 {
        match canon.get(id as usize) {
            Some(&c) if c != NONE => c,
            Some(_) => {
                let c = *first.entry(m.str(StrId(id))).or_insert(id);
                canon[id as usize] = c;
                c
            }
            None => id, // beyond the table: never written by the model
        }
    };
    // Counting sort of kernel indices by name.
    let slots = canon.len() + 1;
    let mut counts: Vec<u32> = vec![0; slots];
    let slot = |c: u32| (c as usize).min(slots - 1);
    for id in k.name.iter() {
        let c = key(&mut canon, &mut first, id);
        counts[slot(c)] += 1;
    }
    let mut offsets: Vec<u32> = Vec::with_capacity(slots + 1);
    let mut acc = 0u32;
    for &c in &counts {
        offsets.push(acc);
        acc += c;
    }
    offsets.push(acc);
    let mut fill = offsets.clone();
    let mut perm: Vec<u32> = vec![0; nk];
    for (i, id) in k.name.iter().enumerate() {
        let c = key(&mut canon, &mut first, id);
        let s = slot(c);
        perm[fill[s] as usize] = i as u32;
        fill[s] += 1;
    }
    drop(fill);
    drop(counts);
    let mut ids_of: HashMap<u32, Vec<u32>> = HashMap::new();
    for (id, &c) in canon.iter().enumerate() {
        if c != NONE {
            ids_of.entry(c).or_default().push(id as u32);
        }
    }
    drop(first);

    let single = m.devices().len() == 1;
    let device_busy = |dev: u32| -> u64 {
        busy.intervals((!single).then_some(dev))
            .iter()
            .map(|&(s, e)| e - s)
            .sum()
    };
    let mut busy_of: Vec<(u32, u64)> = Vec::new();
    let mut rows: Vec<KernelRow> = Vec::new();
    let mut durations: Vec<u64> = Vec::new();
    let mut per_config: HashMap<u32, (u64, u64)> = HashMap::new();
    for s in 0..slots {
        let (lo, hi) = (offsets[s] as usize, offsets[s + 1] as usize);
        if lo == hi {
            continue;
        }
        let group = &mut perm[lo..hi];
        // Launches are almost in start order already: the adaptive sort is near linear.
        group.sort_by_key(|&i| (k.dev.get(i as usize), k.start.get(i as usize)));
        for run in group.chunk_by(|&a, &b| k.dev.get(a as usize) == k.dev.get(b as usize)) {
            let first_i = run[0] as usize;
            let dev = k.dev.get(first_i);
            let name_id = k.name.get(first_i);
            durations.clear();
            per_config.clear();
            let (mut busy_ns, mut cur_s, mut cur_e) = (0u64, 0u64, 0u64);
            let mut open = false;
            for &i in run {
                let i = i as usize;
                let (st, en) = (k.start.get(i), k.end.get(i));
                let d = en.saturating_sub(st);
                durations.push(d);
                let e = per_config.entry(k.config.get(i)).or_default();
                e.0 += 1;
                e.1 += d;
                if en <= st {
                    continue;
                }
                if open && st <= cur_e {
                    cur_e = cur_e.max(en);
                } else {
                    if open {
                        busy_ns += cur_e - cur_s;
                    }
                    (cur_s, cur_e, open) = (st, en, true);
                }
            }
            if open {
                busy_ns += cur_e - cur_s;
            }
            durations.sort_unstable();
            let (p50_ns, p99_ns) = median_p99_sorted(&durations);
            let total_ns = durations.iter().fold(0u64, |a, &d| a.saturating_add(d));
            let launches = run.len() as u64;
            let dev_limits = limits.iter().find(|d| d.device == dev).map(|d| &d.limits);
            let mut variants: Vec<(u32, Variant)> = per_config
                .iter()
                .map(|(&cfg, &(n, ns))| {
                    let config = m.configs[cfg as usize];
                    let (occupancy, waves) = figures(dev_limits, &config);
                    (
                        cfg,
                        Variant {
                            config_id: cfg,
                            config,
                            launches: n,
                            gpu_ns: ns,
                            occupancy,
                            waves,
                        },
                    )
                })
                .collect();
            variants.sort_by(|a, b| {
                (b.1.gpu_ns, b.1.launches, a.0).cmp(&(a.1.gpu_ns, a.1.launches, b.0))
            });
            let variants: Vec<Variant> = variants.into_iter().map(|v| v.1).collect();
            let top = &variants[0];
            let dev_busy = match busy_of.iter().find(|b| b.0 == dev) {
                Some(b) => b.1,
                None => {
                    let b = device_busy(dev);
                    busy_of.push((dev, b));
                    b
                }
            };
            let name = m.str(StrId(name_id)).to_string();
            rows.push(KernelRow {
                library: is_library_kernel(&name),
                name,
                device: dev,
                launches,
                total_ns,
                mean_ns: total_ns / launches,
                p50_ns,
                p99_ns,
                busy_ns,
                busy_share: crate::insights::share(busy_ns, dev_busy),
                device_busy_ns: dev_busy,
                configs: variants.len() as u32,
                launch: top.config,
                blocks: top.config.blocks(),
                threads_per_block: top.config.threads_per_block(),
                occupancy: top.occupancy.clone(),
                waves: top.waves,
                name_ids: ids_of
                    .get(&canon.get(name_id as usize).copied().unwrap_or(name_id))
                    .cloned()
                    .unwrap_or_else(|| vec![name_id]),
                variants,
            });
        }
    }
    rows.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.device.cmp(&b.device))
    });
    KernelTable { limits, rows }
}

/// The periods when exactly one kernel ran on device `dev` (every device when the session has
/// one), sorted and disjoint: a launch's time inside them is the time it had the GPU's SMs to
/// itself. Transient memory: 16 bytes per kernel.
pub(crate) fn solo_periods(m: &Model, dev: u32) -> Vec<(u64, u64)> {
    let k = &m.kernels;
    let all = m.devices().len() == 1;
    let mut starts: Vec<u64> = Vec::new();
    let mut ends: Vec<u64> = Vec::new();
    for ((s, e), d) in k.start.iter().zip(k.end.iter()).zip(k.dev.iter()) {
        if e > s && (all || d == dev) {
            starts.push(s);
            ends.push(e);
        }
    }
    starts.sort_unstable();
    ends.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    let (mut i, mut j, mut active, mut since) = (0, 0, 0u64, 0u64);
    while j < ends.len() {
        // Ends before starts at the same instant: touching kernels do not overlap.
        let (t, delta) = if i < starts.len() && starts[i] < ends[j] {
            i += 1;
            (starts[i - 1], 1i64)
        } else {
            j += 1;
            (ends[j - 1], -1i64)
        };
        if active == 1 && t > since {
            match out.last_mut() {
                Some(last) if last.1 == since => last.1 = t,
                _ => out.push((since, t)),
            }
        }
        active = (active as i64 + delta) as u64;
        since = t;
    }
    out
}

/// Time of `[s, e)` inside the sorted, disjoint `periods`.
pub(crate) fn overlap(periods: &[(u64, u64)], s: u64, e: u64) -> u64 {
    let mut i = periods.partition_point(|p| p.1 <= s);
    let mut t = 0;
    while let Some(&(ps, pe)) = periods.get(i) {
        if ps >= e {
            break;
        }
        t += pe.min(e) - ps.max(s);
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_kernels_by_name() {
        assert!(is_library_kernel(
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel"
        ));
        assert!(is_library_kernel(
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)"
        ));
        assert!(!is_library_kernel("regs_heavy(float const*, float*, int)"));
        assert!(!is_library_kernel(
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()"
        ));
    }

    #[test]
    fn solo_periods_and_their_overlap_with_a_launch() {
        use gpufl_trace::{Kernel, Record};
        let k = |start, end, stream| {
            Record::Kernel(Kernel {
                start,
                end,
                stream,
                ..Kernel::default()
            })
        };
        // A [0,100) alone until B [40,60) joins; C [100,150) touches A's end; D [200,200) is empty.
        let m = Model::load([k(0, 100, 1), k(40, 60, 2), k(100, 150, 1), k(200, 200, 1)]);
        let solo = solo_periods(&m, 0);
        assert_eq!(solo, vec![(0, 40), (60, 150)]);
        assert_eq!(overlap(&solo, 0, 100), 80);
        assert_eq!(overlap(&solo, 40, 60), 0);
        assert_eq!(overlap(&solo, 100, 150), 50);
        assert_eq!(overlap(&solo, 150, 300), 0);
        assert_eq!(overlap(&[], 0, 10), 0);
    }

    #[test]
    fn percentiles_of_sorted_durations() {
        assert_eq!(median_p99_sorted(&[]), (0, 0));
        assert_eq!(median_p99_sorted(&[5]), (5, 5));
        assert_eq!(median_p99_sorted(&[1, 3]), (2, 3));
        let v: Vec<u64> = (1..=200).collect();
        // Median of 200: (100 + 101) / 2 → 100 (integer); p99: rank 198.
        assert_eq!(median_p99_sorted(&v), (100, 198));
    }
}
