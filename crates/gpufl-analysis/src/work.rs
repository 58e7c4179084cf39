//! Splitting the analysis's passes over the columns across threads: [`pieces`] runs a function on
//! each of `n` pieces on up to `threads` scoped threads (the caller's among them) and returns the
//! results in piece order, so that a caller that combines them in that order computes what one
//! pass in order computes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Rows per piece of a pass over the columns (a piece's transient memory is bounded by it).
pub(crate) const PIECE_ROWS: usize = 1 << 18;

/// The pieces of `n` rows: `(start, end)` ranges of at most [`PIECE_ROWS`] rows, in order.
pub(crate) fn row_pieces(n: usize) -> Vec<(usize, usize)> {
    (0..n.div_ceil(PIECE_ROWS))
        .map(|i| (i * PIECE_ROWS, ((i + 1) * PIECE_ROWS).min(n)))
        .collect()
}

/// `f(0)`, …, `f(n - 1)` on up to `threads` threads; the results in order.
pub(crate) fn pieces<R: Send>(n: usize, threads: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let run = || {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return out;
            }
            out.push((i, f(i)));
        }
    };
    let mut all: Vec<(usize, R)> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(run)).collect();
        let mut all = run();
        for h in helpers {
            all.extend(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        all
    });
    all.sort_unstable_by_key(|p| p.0);
    all.into_iter().map(|p| p.1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_come_back_in_order_on_any_thread_count() {
        for t in [0, 1, 2, 5, 64] {
            assert_eq!(
                pieces(10, t, |i| i * i),
                (0..10).map(|i| i * i).collect::<Vec<_>>()
            );
            assert!(pieces(0, t, |i| i).is_empty());
        }
        assert_eq!(row_pieces(0), vec![]);
        assert_eq!(
            row_pieces(PIECE_ROWS + 3),
            vec![(0, PIECE_ROWS), (PIECE_ROWS, PIECE_ROWS + 3)]
        );
    }
}
