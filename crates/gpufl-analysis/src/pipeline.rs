//! The streams seed's pipeline model: what splitting a sequential copy → compute → copy pipeline
//! into chunks on several streams would take. The `no-copy-compute-overlap` rule predicts with it
//! from a session's measured stage times.
//!
//! Model (seed `streams.md`, "ideal overlapped time"): the work is split into `chunks` equal
//! chunks; host-to-device copies share one copy engine, device-to-host copies another, kernels the
//! compute engine; the first chunk pays all three stages, each further chunk only the longest
//! stage. With `chunks = streams` (one chunk in flight per stream) this gives the seed's figures:
//! 80 ms sequential → 55 ms on 2 streams, 42.5 ms on 4 (1.88x).

use serde::Serialize;

/// Measured time of each stage of the sequential pipeline, ns (all chunks together).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stages {
    pub h2d_ns: u64,
    pub kernel_ns: u64,
    pub d2h_ns: u64,
}

impl Stages {
    /// The sequential time: the stages one after the other.
    pub fn sequential_ns(&self) -> u64 {
        self.h2d_ns
            .saturating_add(self.kernel_ns)
            .saturating_add(self.d2h_ns)
    }

    /// The longest stage: what each chunk after the first costs once the pipeline is full.
    pub fn bottleneck_ns(&self) -> u64 {
        self.h2d_ns.max(self.kernel_ns).max(self.d2h_ns)
    }
}

/// Predicted time of the pipeline split into `chunks` chunks.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    pub chunks: u32,
    pub time_ns: u64,
    /// Sequential time over predicted time (1.0 for one chunk or no work).
    pub speedup: f64,
}

/// Predict the pipeline's time when split into `chunks` equal chunks (0 is taken as 1).
pub fn predict(stages: Stages, chunks: u32) -> Prediction {
    let n = u128::from(chunks.max(1));
    let seq = u128::from(stages.h2d_ns) + u128::from(stages.kernel_ns) + u128::from(stages.d2h_ns);
    // (first chunk: all stages / n) + (n - 1) further chunks × (bottleneck / n), rounded.
    let total = seq + (n - 1) * u128::from(stages.bottleneck_ns());
    let time_ns = u64::try_from((total + n / 2) / n).unwrap_or(u64::MAX);
    let speedup = if time_ns == 0 {
        1.0
    } else {
        seq as f64 / time_ns as f64
    };
    Prediction {
        chunks: chunks.max(1),
        time_ns,
        speedup,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// The seed's worked example: H2D 30 ms, kernel 20 ms, D2H 30 ms.
    fn seed() -> Stages {
        Stages {
            h2d_ns: 30 * MS,
            kernel_ns: 20 * MS,
            d2h_ns: 30 * MS,
        }
    }

    #[test]
    fn seed_worked_example_four_chunks_is_42_5_ms_and_1_88x() {
        let p = predict(seed(), 4);
        assert_eq!(p.time_ns, 42_500_000);
        assert!((p.speedup - 1.882).abs() < 0.001, "{}", p.speedup);
    }

    #[test]
    fn seed_two_streams_is_55_ms_and_one_chunk_is_sequential() {
        assert_eq!(predict(seed(), 2).time_ns, 55 * MS);
        assert_eq!(predict(seed(), 1).time_ns, 80 * MS);
        assert_eq!(predict(seed(), 0).time_ns, 80 * MS, "0 chunks taken as 1");
        assert_eq!(predict(seed(), 1).speedup, 1.0);
    }

    #[test]
    fn more_chunks_approach_the_bottleneck_never_below_it() {
        let s = seed();
        let mut last = u64::MAX;
        for n in 1..=64 {
            let t = predict(s, n).time_ns;
            assert!(t <= last, "more chunks never predict more time");
            assert!(
                t >= s.bottleneck_ns(),
                "never faster than the longest stage"
            );
            last = t;
        }
        // A compute-bound pipeline gains little: the copies are what overlap.
        let compute_bound = Stages {
            h2d_ns: MS,
            kernel_ns: 100 * MS,
            d2h_ns: MS,
        };
        assert!(predict(compute_bound, 4).speedup < 1.02);
    }

    #[test]
    fn empty_and_huge_stages_do_not_overflow() {
        let zero = Stages {
            h2d_ns: 0,
            kernel_ns: 0,
            d2h_ns: 0,
        };
        assert_eq!(predict(zero, 4).time_ns, 0);
        assert_eq!(predict(zero, 4).speedup, 1.0);
        let huge = Stages {
            h2d_ns: u64::MAX / 2,
            kernel_ns: u64::MAX / 2,
            d2h_ns: u64::MAX / 2,
        };
        // (3 + 2) × half / 3 = 5/6 of u64::MAX: computed without overflow.
        let t = predict(huge, 3).time_ns;
        assert!(t.abs_diff(u64::MAX / 6 * 5) < 4, "{t}");
        assert!((predict(huge, 3).speedup - 1.8).abs() < 1e-9);
    }
}
