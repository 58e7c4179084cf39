//! Interval arithmetic over GPU activity: union length (busy time) and the idle gap after an instant.

use crate::model::Model;
use crate::store::Col;
use crate::work::{pieces, row_pieces};

/// Length of the union of half-open intervals `[start, end)`, which may overlap (kernels on
/// concurrent streams, copies under kernels). Sorts `intervals` in place; empty or inverted intervals
/// (`end <= start`) count for nothing.
pub fn union_ns(intervals: &mut [(u64, u64)]) -> u64 {
    merge(intervals).iter().map(|&(s, e)| e - s).sum()
}

/// Sort and merge in place; returns the merged prefix (disjoint, ascending, non-empty intervals).
/// Touching intervals (`a.end == b.start`) are merged.
pub(crate) fn merge(iv: &mut [(u64, u64)]) -> &[(u64, u64)] {
    // Stable sort: adaptive, near-linear on the almost sorted input records usually are.
    iv.sort();
    let mut n = 0;
    for i in 0..iv.len() {
        let (s, e) = iv[i];
        if e <= s {
            continue;
        }
        if n > 0 && s <= iv[n - 1].1 {
            iv[n - 1].1 = iv[n - 1].1.max(e);
        } else {
            iv[n] = (s, e);
            n += 1;
        }
    }
    &iv[..n]
}

/// When each device was busy: the merged kernel, copy and memset intervals of every device.
#[derive(Debug, Default)]
pub struct DeviceBusy {
    devs: Vec<(u32, Vec<(u64, u64)>)>,
    /// Union over all devices, for instants whose device is unknown (built on first need).
    all: std::sync::OnceLock<Vec<(u64, u64)>>,
}

impl DeviceBusy {
    /// Build from a model's kernels, copies and memsets.
    pub fn new(m: &Model) -> DeviceBusy {
        Self::new_on(m, 1)
    }

    /// [`DeviceBusy::new`] on up to `threads` threads: each piece of the kernels and of the
    /// copies is merged alone, then the pieces' unions are merged (a union of unions: the same
    /// intervals).
    pub fn new_on(m: &Model, threads: usize) -> DeviceBusy {
        let mut devs = Vec::new();
        let k = &m.kernels;
        let c = &m.copies;
        let (kp, cp) = (row_pieces(k.start.len()), row_pieces(c.start.len()));
        let all = m.devices().len() == 1;
        for &dev in m.devices() {
            let piece = |i: usize| {
                let mut iv: Vec<(u64, u64)> = Vec::new();
                let mut add = |start: &Col<u64>, end: &Col<u64>, d: &Col<u32>, (a, b)| {
                    iv.reserve(b - a);
                    iv.extend(
                        start
                            .iter_range(a, b)
                            .zip(end.iter_range(a, b))
                            .zip(d.iter_range(a, b))
                            .filter(|&(_, d)| all || d == dev)
                            .map(|(se, _)| se),
                    );
                };
                match kp.get(i) {
                    Some(&r) => add(&k.start, &k.end, &k.dev, r),
                    None => add(&c.start, &c.end, &c.dev, cp[i - kp.len()]),
                }
                let n = merge(&mut iv).len();
                iv.truncate(n);
                iv.shrink_to_fit();
                iv
            };
            let parts = pieces(kp.len() + cp.len(), threads, piece);
            let mut iv: Vec<(u64, u64)> = if parts.len() == 1 {
                parts.into_iter().flatten().collect()
            } else {
                let mut iv: Vec<(u64, u64)> = parts.into_iter().flatten().collect();
                let n = merge(&mut iv).len();
                iv.truncate(n);
                iv
            };
            iv.shrink_to_fit();
            devs.push((dev, iv));
        }
        DeviceBusy {
            devs,
            all: Default::default(),
        }
    }

    /// Busy time of each device, summed over devices.
    pub fn busy_ns(&self) -> u64 {
        self.devs
            .iter()
            .map(|(_, iv)| iv.iter().map(|&(s, e)| e - s).sum::<u64>())
            .sum()
    }

    /// Devices with activity.
    pub fn device_count(&self) -> usize {
        self.devs.len()
    }

    /// Merged busy intervals of `dev` (all devices together when None), sorted.
    pub(crate) fn intervals(&self, dev: Option<u32>) -> &[(u64, u64)] {
        match dev {
            Some(d) => self
                .devs
                .iter()
                .find(|(x, _)| *x == d)
                .map_or(&[][..], |(_, iv)| iv),
            None if self.devs.len() == 1 => &self.devs[0].1,
            None => self.all.get_or_init(|| {
                let mut v: Vec<(u64, u64)> = self
                    .devs
                    .iter()
                    .flat_map(|(_, iv)| iv.iter().copied())
                    .collect();
                let n = merge(&mut v).len();
                v.truncate(n);
                v
            }),
        }
    }

    /// Length of the idle gap of `dev` (all devices together when None) that begins at `t`: 0 if
    /// the device is busy at `t` or never busy again after it, else the time until its next work
    /// starts.
    pub fn idle_after(&self, dev: Option<u32>, t: u64) -> u64 {
        let iv = self.intervals(dev);
        // First interval that ends after t.
        let i = iv.partition_point(|&(_, e)| e <= t);
        match iv.get(i) {
            Some(&(s, _)) if s > t => s - t,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_of_disjoint_nested_touching_and_empty() {
        assert_eq!(union_ns(&mut []), 0);
        assert_eq!(union_ns(&mut [(0, 10), (20, 30)]), 20);
        assert_eq!(union_ns(&mut [(0, 100), (10, 20), (30, 40)]), 100);
        assert_eq!(union_ns(&mut [(10, 20), (0, 10)]), 20);
        assert_eq!(union_ns(&mut [(5, 5), (9, 3), (0, 1)]), 1);
    }

    #[test]
    fn union_of_two_overlapping_streams_never_exceeds_the_span() {
        // Stream A: [0,60) [100,160); stream B: [30,90) [150,200).
        let mut iv = [(0, 60), (100, 160), (30, 90), (150, 200)];
        assert_eq!(union_ns(&mut iv), 90 + 100);
    }

    #[test]
    fn merge_keeps_disjoint_sorted_prefix() {
        let mut iv = [(50, 60), (0, 10), (5, 20), (20, 25), (70, 70)];
        assert_eq!(merge(&mut iv), &[(0, 25), (50, 60)]);
    }
}
