//! The kernels' correlation ids as a sorted set, to count the launches issued between two API
//! calls (CUDA numbers API calls in issue order within a process): what `in-loop-sync` and the
//! severity windows of the copy and stream rules count. Built on first need, once per analysis.
//!
//! The recorder writes kernels in the order their activity buffers come back, which is nearly
//! always the order of their correlation ids: when the column is strictly increasing (and so
//! holds no zero), it is the set itself and nothing is copied; otherwise its distinct non-zero
//! ids are sorted into a vector (4 bytes per kernel). The ids are kept as the column's raw `u32`s;
//! lookups take [`CorrId`]s.

use crate::ids::CorrId;
use crate::store::Col;

/// The distinct non-zero kernel correlation ids, ascending.
#[derive(Clone, Copy)]
pub(crate) enum KernelCorrs<'m> {
    /// The model's column: strictly increasing, no zero.
    Column(&'m Col<u32>),
    /// Sorted copy of the column's distinct non-zero ids ([`sorted_copy`]).
    Sorted(&'m [u32]),
}

/// What [`KernelCorrs`] needs to hold beside the column: None when the column is the set itself,
/// else its distinct non-zero ids, sorted.
pub(crate) fn sorted_copy(col: &Col<u32>) -> Option<Vec<u32>> {
    if strictly_increasing_nonzero(col) {
        return None;
    }
    let mut v: Vec<u32> = col.iter().filter(|&c| c != 0).collect();
    v.sort_unstable();
    v.dedup();
    Some(v)
}

impl<'m> KernelCorrs<'m> {
    /// The set of `col`'s ids, given what [`sorted_copy`] returned for it.
    pub(crate) fn of(col: &'m Col<u32>, copy: &'m Option<Vec<u32>>) -> KernelCorrs<'m> {
        match copy {
            None => KernelCorrs::Column(col),
            Some(v) => KernelCorrs::Sorted(v),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            KernelCorrs::Column(c) => c.len(),
            KernelCorrs::Sorted(v) => v.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, i: usize) -> u32 {
        match self {
            KernelCorrs::Column(c) => c.get(i),
            KernelCorrs::Sorted(v) => v[i],
        }
    }

    /// A cursor for lookups whose ids mostly increase (a line's calls in issue order).
    pub(crate) fn cursor(self) -> CorrCursor<'m> {
        CorrCursor { set: self, at: 0 }
    }
}

/// Whether `col` is strictly increasing from a non-zero first id (so holds no zero).
fn strictly_increasing_nonzero(col: &Col<u32>) -> bool {
    let mut prev: Option<u32> = None;
    for c in col.chunks() {
        let Some(&first) = c.first() else { continue };
        let ok = match prev {
            None => first != 0,
            Some(p) => p < first,
        };
        if !ok || !c.windows(2).all(|w| w[0] < w[1]) {
            return false;
        }
        prev = c.last().copied();
    }
    true
}

/// Galloping lookups into a [`KernelCorrs`] from where the previous one ended: O(log distance)
/// each, so a line's consecutive calls cost little however many kernels the session has.
pub(crate) struct CorrCursor<'m> {
    set: KernelCorrs<'m>,
    at: usize,
}

impl CorrCursor<'_> {
    /// The number of ids `< x` (`<= x` when `inclusive`).
    fn rank(&mut self, x: u32, inclusive: bool) -> usize {
        let s = &self.set;
        let n = s.len();
        let below = |i: usize| {
            let v = s.get(i);
            v < x || (inclusive && v == x)
        };
        // The answer r: below(i) for every i < r, not for i >= r. Bracket it from `at`.
        let (mut lo, mut hi);
        if self.at < n && below(self.at) {
            lo = self.at + 1;
            let mut step = 1;
            hi = lo;
            while hi < n && below(hi) {
                lo = hi + 1;
                hi = hi.saturating_add(step).min(n);
                step *= 2;
            }
        } else {
            hi = self.at.min(n);
            let mut step = 1;
            lo = hi;
            while lo > 0 && !below(lo - 1) {
                hi = lo - 1;
                lo = lo.saturating_sub(step);
                step *= 2;
            }
        }
        // below(lo - 1) (or lo == 0) and !below(hi) (or hi == n): binary search in [lo, hi).
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.at = lo;
        lo
    }

    /// Ids in `(a, b)` (0 when `b <= a`).
    pub(crate) fn between(&mut self, a: CorrId, b: CorrId) -> usize {
        let lo = self.rank(a.0, true);
        let hi = self.rank(b.0, false);
        hi.saturating_sub(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(v: &[u32]) -> Col<u32> {
        let mut c = Col::default();
        c.extend_from_slice(v);
        c
    }

    /// What the rules computed before: the distinct non-zero ids sorted, two binary searches.
    fn sorted_distinct(ids: &[u32]) -> Vec<u32> {
        let mut v: Vec<u32> = ids.iter().copied().filter(|&c| c != 0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn naive(v: &[u32], a: u32, b: u32) -> usize {
        v.partition_point(|&x| x < b)
            .saturating_sub(v.partition_point(|&x| x <= a))
    }

    #[test]
    fn column_or_sorted_copy() {
        assert!(sorted_copy(&col(&[1, 2, 5])).is_none());
        assert!(sorted_copy(&col(&[])).is_none());
        for v in [&[0u32, 1, 2][..], &[1, 1, 2], &[3, 2], &[0]] {
            assert!(sorted_copy(&col(v)).is_some());
        }
        let c = col(&[0, 0]);
        let copy = sorted_copy(&c);
        assert!(KernelCorrs::of(&c, &copy).is_empty());
    }

    #[test]
    fn cursor_counts_as_binary_searches_in_any_order() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        // Increasing ids across chunk boundaries (the column path), and shuffled ones with
        // repeats and zeros (the sorted path).
        let n = (1 << 16) * 2 + 100;
        let mut inc: Vec<u32> = Vec::with_capacity(n);
        let mut c = 0u32;
        for _ in 0..n {
            c += 1 + rnd(3) as u32;
            inc.push(c);
        }
        let mut shuffled = inc.clone();
        for i in 0..shuffled.len() {
            let j = rnd(shuffled.len() as u64) as usize;
            shuffled.swap(i, j);
        }
        shuffled.extend([0, 0, 5, 5, c + 7]);
        for ids in [&inc, &shuffled] {
            let column = col(ids);
            let copy = sorted_copy(&column);
            assert_eq!(copy.is_none(), ids == &inc);
            let set = KernelCorrs::of(&column, &copy);
            let want = sorted_distinct(ids);
            let mut cur = set.cursor();
            let top = c + 10;
            // Increasing pairs (a line's calls), then random ones, backwards, equal and empty.
            let mut a = 0;
            while a < top {
                let b = a + rnd(if a < 2000 { 5 } else { 4000 }) as u32;
                assert_eq!(
                    cur.between(CorrId(a), CorrId(b)),
                    naive(&want, a, b),
                    "{a}..{b}"
                );
                a = b;
            }
            for _ in 0..500 {
                let (a, b) = (rnd(top as u64) as u32, rnd(top as u64) as u32);
                assert_eq!(
                    cur.between(CorrId(a), CorrId(b)),
                    naive(&want, a, b),
                    "{a}..{b}"
                );
                assert_eq!(
                    set.cursor().between(CorrId(a), CorrId(b)),
                    naive(&want, a, b),
                    "{a}..{b}"
                );
            }
            for (a, b) in [
                (0, 0),
                (0, u32::MAX),
                (u32::MAX, 0),
                (5, 5),
                (4, 6),
                (c, c + 8),
            ] {
                assert_eq!(
                    cur.between(CorrId(a), CorrId(b)),
                    naive(&want, a, b),
                    "{a}..{b}"
                );
            }
        }
    }
}
