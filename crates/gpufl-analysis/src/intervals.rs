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

/// Time of `[a, b)` inside sorted, disjoint intervals.
pub(crate) fn overlap_ns(iv: &[(u64, u64)], a: u64, b: u64) -> u64 {
    let i = iv.partition_point(|p| p.1 <= a);
    iv[i..]
        .iter()
        .take_while(|p| p.0 < b)
        .map(|p| b.min(p.1).saturating_sub(a.max(p.0)))
        .sum()
}

/// Sort and merge in place; returns the merged prefix (disjoint, ascending, non-empty intervals).
/// Touching intervals (`a.end == b.start`) are merged.
pub(crate) fn merge<T: Ord + Copy>(iv: &mut [(T, T)]) -> &[(T, T)] {
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

/// What [`merge`] makes of rows `a..b` of a table's (start, end) columns (those of device `dev`
/// only, unless `all`), swept as they come: None as soon as a non-empty interval starts before
/// the one before it (then they need sorting).
fn merged_in_start_order(
    start: &Col<u64>,
    end: &Col<u64>,
    (devs, dev, all): (&Col<u32>, u32, bool),
    (a, b): (usize, usize),
) -> Option<Vec<(u64, u64)>> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    let cols = start.slices(a, b).zip(end.slices(a, b));
    for ((ss, es), ds) in cols.zip(devs.slices(a, b)) {
        for ((&s, &e), &d) in ss.iter().zip(es).zip(ds) {
            if e <= s || !(all || d == dev) {
                continue;
            }
            match &mut cur {
                Some(c) if s < c.0 => return None,
                Some(c) if s <= c.1 => c.1 = c.1.max(e),
                _ => {
                    out.extend(cur);
                    cur = Some((s, e));
                }
            }
        }
    }
    out.extend(cur);
    Some(out)
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
    /// copies is merged alone (swept as it comes while in start order, else sorted), then the
    /// pieces' unions are merged (a union of unions: the same intervals).
    pub fn new_on(m: &Model, threads: usize) -> DeviceBusy {
        let mut devs = Vec::new();
        let k = &m.kernels;
        let c = &m.copies;
        let (kp, cp) = (row_pieces(k.start.len()), row_pieces(c.start.len()));
        let all = m.devices().len() == 1;
        for &dev in m.devices() {
            let piece = |i: usize| {
                let (start, end, d, r) = match kp.get(i) {
                    Some(&r) => (&k.start, &k.end, &k.dev, r),
                    None => (&c.start, &c.end, &c.dev, cp[i - kp.len()]),
                };
                if let Some(iv) = merged_in_start_order(start, end, (d, dev, all), r) {
                    return iv;
                }
                let (a, b) = r;
                let mut iv: Vec<(u64, u64)> = Vec::with_capacity(b - a);
                iv.extend(
                    start
                        .iter_range(a, b)
                        .zip(end.iter_range(a, b))
                        .zip(d.iter_range(a, b))
                        .filter(|&(_, d)| all || d == dev)
                        .map(|(se, _)| se),
                );
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
    fn merged_as_they_come_or_sorted_is_merge() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for round in 0..50 {
            let n = 1 + rnd(3000) as usize;
            let mut t = 0;
            let mut rows: Vec<(u64, u64, u32)> = (0..n)
                .map(|_| {
                    t += rnd(if round % 2 == 0 { 3 } else { 60 });
                    let len = rnd(80);
                    let e = if rnd(15) == 0 {
                        t.saturating_sub(len)
                    } else {
                        t + len
                    };
                    (t, e, rnd(2) as u32)
                })
                .collect();
            if round % 5 == 4 {
                let (a, b) = (rnd(n as u64) as usize, rnd(n as u64) as usize);
                rows.swap(a, b);
            }
            let (mut s, mut e, mut d) = (Col::default(), Col::default(), Col::default());
            for &(x, y, z) in &rows {
                s.push(x);
                e.push(y);
                d.push(z);
            }
            for (dev, all) in [(0, true), (0, false), (1, false)] {
                let (a, b) = (
                    rnd(n as u64) as usize / 2,
                    n - rnd(n as u64 / 2 + 1) as usize,
                );
                let mut want: Vec<(u64, u64)> = rows[a..b]
                    .iter()
                    .filter(|r| all || r.2 == dev)
                    .map(|r| (r.0, r.1))
                    .collect();
                let k = merge(&mut want).len();
                want.truncate(k);
                match merged_in_start_order(&s, &e, (&d, dev, all), (a, b)) {
                    Some(got) => assert_eq!(got, want, "round {round}"),
                    // Only a start that goes back falls back to sorting.
                    None => assert!(rows[a..b]
                        .iter()
                        .filter(|r| r.1 > r.0 && (all || r.2 == dev))
                        .collect::<Vec<_>>()
                        .windows(2)
                        .any(|w| w[1].0 < w[0].0)),
                }
            }
        }
    }

    #[test]
    fn merge_keeps_disjoint_sorted_prefix() {
        let mut iv = [(50, 60), (0, 10), (5, 20), (20, 25), (70, 70)];
        assert_eq!(merge(&mut iv), &[(0, 25), (50, 60)]);
    }
}
