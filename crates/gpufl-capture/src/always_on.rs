//! Always-on mode (`GPUFL_MODE=always-on`, `gpufl record --always-on`): what a recorder left on in
//! production collects, and when.
//!
//! All the time: every synchronization with its stack, scopes, NVML telemetry. GPU activity records
//! (kernels, copies, memsets) and the call-site captures of launches and copies (sampled, each with
//! the number of calls it stands for; their callbacks cost ~4 % of a launch-bound loop while on)
//! only inside **windows**, written as `window` records:
//!
//! - **Sampled windows**, [`WINDOW_MS`] long, every `period`: CUPTI's kernel tracing costs about
//!   [`COST_PER_RECORD_NS`] of the launching thread's time per record while it is on (3 µs a kernel
//!   on the H100's launch-bound loop, docs/benchmarks.md run K), so after each window the record rate
//!   it saw sets the duty cycle that keeps that cost under the budget (`GPUFL_ALWAYS_ON_BUDGET`,
//!   percent of the run, default [`DEFAULT_BUDGET_PCT`]; 0: no sampled windows):
//!   `duty = budget / (rate × cost)`, at most [`MAX_DUTY`], `period = window / duty` within
//!   [`MIN_PERIOD`]..[`MAX_PERIOD`]. That cost does not end with the window: once CUPTI's kernel
//!   tracing has been on, launches stay dearer for the rest of the run (docs/benchmarks.md,
//!   "Always-on after its first window"), unless CUPTI is detached after the window, as it is
//!   (crate::detach; `GPUFL_DETACH=0`: kept attached). The first opens once the run has earned
//!   its cost under the budget ([`first_window_after`]: 4 s in at the default).
//!   `GPUFL_WINDOW_MS` and `GPUFL_WINDOW_PERIOD_MS` (a fixed period) override them.
//! - **Full-detail windows** on demand: `gpufl_capture_window(seconds)` (C, C++, Python), the
//!   trigger signal (SIGUSR2 unless `GPUFL_TRIGGER_SIGNAL` names another, 0 = none; installed only
//!   where the program left that signal's default action; `gpufl trigger PID --seconds N` sends it
//!   with the seconds), everything the default mode collects (API records too) for N seconds.
//!   A window's `start` is taken after collection is on and its `end` before it goes off, so it
//!   holds every kernel that ran inside it.
//!
//! Pause composes: while paused no window opens (a due sampled window waits; a requested one is
//! dropped), and resume restores the mode's collection. The scheduler runs on the writer thread
//! (`tick` every turn of its loop); requests come through atomics (async-signal-safe).

use crate::collection;
use crate::options::{Mode, Options, TriggerSignal};
use crate::sink::Sink;
use gpufl_trace::{Record, TraceError, Window};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Length of a sampled window.
pub const WINDOW_MS: u64 = 200;
/// Default budget for GPU activity collection, percent of the run.
pub const DEFAULT_BUDGET_PCT: f64 = 0.5;
/// CUPTI's cost per GPU activity record while collection is on (H100, run K).
pub const COST_PER_RECORD_NS: f64 = 3000.0;
/// Largest share of the time windows may take.
pub const MAX_DUTY: f64 = 0.25;
/// Shortest and longest period between sampled windows.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);
pub const MAX_PERIOD: Duration = Duration::from_secs(60);
/// First sampled window, after the start (start-up is often unlike the steady state), at the
/// earliest.
pub const FIRST_WINDOW_AFTER: Duration = Duration::from_secs(2);
/// What the first sampled window is taken to cost the program before any rate is known: a
/// launch-bound rate (~25,000 records/s at [`COST_PER_RECORD_NS`]: ~7.5 % of a [`WINDOW_MS`]
/// window, 15 ms) and the detach after it (~5 ms).
pub const FIRST_WINDOW_COST: Duration = Duration::from_millis(20);

/// When the first sampled window opens, after the start: once the run has earned its cost
/// under the budget ([`FIRST_WINDOW_COST`] / budget: 4 s at the default 0.5 %), at the earliest
/// [`FIRST_WINDOW_AFTER`]; with a fixed period (`GPUFL_WINDOW_PERIOD_MS`), at
/// [`FIRST_WINDOW_AFTER`].
pub fn first_window_after(budget_pct: f64, fixed_period: Option<Duration>) -> Duration {
    if fixed_period.is_some() || budget_pct <= 0.0 || !budget_pct.is_finite() {
        return FIRST_WINDOW_AFTER;
    }
    let earned = FIRST_WINDOW_COST.as_secs_f64() / (budget_pct / 100.0);
    Duration::from_secs_f64(earned.min(MAX_PERIOD.as_secs_f64())).max(FIRST_WINDOW_AFTER)
}
/// How long after a sampled window closes its records are counted (CUPTI is asked for its
/// buffers every 250 ms).
const RATE_DELAY: Duration = Duration::from_millis(400);
/// Full-detail window length when none is given, and the longest accepted.
pub const DEFAULT_DETAIL_SECONDS: f64 = 10.0;
pub const MAX_DETAIL_SECONDS: f64 = 3600.0;

/// Why a window opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Sampled = 1,
    Trigger = 2,
    Api = 3,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Sampled => "sampled",
            Reason::Trigger => "trigger",
            Reason::Api => "api",
        }
    }
    fn from_u8(v: u8) -> Reason {
        match v {
            2 => Reason::Trigger,
            3 => Reason::Api,
            _ => Reason::Sampled,
        }
    }
}

/// Whether this process records in always-on mode, and a pending full-detail request (the
/// module's one static; atomics only: a signal handler writes it).
struct Requests {
    /// Always-on mode (set at start).
    active: AtomicBool,
    /// The pending request's length in ms (0: none) and reason.
    ms: AtomicU64,
    reason: AtomicU8,
}

static REQUESTS: Requests = Requests {
    active: AtomicBool::new(false),
    ms: AtomicU64::new(0),
    reason: AtomicU8::new(0),
};

/// Length of a requested window in ms: `seconds`, or the default when not positive and finite.
pub fn window_ms(seconds: f64) -> u64 {
    let s = if seconds.is_finite() && seconds > 0.0 {
        seconds.min(MAX_DETAIL_SECONDS)
    } else {
        DEFAULT_DETAIL_SECONDS
    };
    ((s * 1000.0).round() as u64).max(1)
}

/// Ask for a full-detail window of `seconds`. False when not recording in always-on mode.
/// Async-signal-safe (atomics only).
pub fn request_window(seconds: f64, reason: Reason) -> bool {
    if !REQUESTS.active.load(Ordering::Acquire) {
        return false;
    }
    REQUESTS.reason.store(reason as u8, Ordering::Release);
    REQUESTS.ms.store(window_ms(seconds), Ordering::Release);
    true
}

fn take_request() -> Option<(u64, Reason)> {
    let ms = REQUESTS.ms.swap(0, Ordering::AcqRel);
    (ms > 0).then(|| (ms, Reason::from_u8(REQUESTS.reason.load(Ordering::Acquire))))
}

/// Duty cycle and period after a window that saw `records` GPU records in `window`.
pub fn next_period(records: u64, window: Duration, budget_pct: f64) -> Duration {
    let secs = window.as_secs_f64().max(1e-3);
    let on_cost = records as f64 / secs * COST_PER_RECORD_NS * 1e-9; // share of time while on
    let duty = if on_cost <= 0.0 {
        MAX_DUTY
    } else {
        (budget_pct / 100.0 / on_cost).min(MAX_DUTY)
    };
    let period = Duration::from_secs_f64(secs / duty.max(1e-6));
    period.clamp(MIN_PERIOD, MAX_PERIOD)
}

struct Open {
    reason: Reason,
    start_ts: u64,
    opened: Instant,
    until: Instant,
    /// GPU records written when it opened.
    records_at_open: u64,
}

/// The window scheduler (writer thread).
pub struct Scheduler {
    window: Duration,
    fixed_period: Option<Duration>,
    budget_pct: f64,
    next_open: Instant,
    open: Option<Open>,
    /// The last closed sampled window: (records written when it opened, its length, when it
    /// closed), to count its records once they have arrived.
    pending_rate: Option<(u64, Duration, Instant)>,
    /// Windows written, by reason (for the end notice).
    pub written: [u64; 3],
    /// When the last window closed, until CUPTI has been detached after it (crate::detach).
    pending_detach: Option<Instant>,
    /// The detaches so far.
    pub detaches: crate::detach::Tally,
    /// CUPTI could not be attached again: no more windows.
    lost: bool,
    /// A detach is due now (the writer does it: [`Scheduler::take_detach_due`]).
    detach_due: Option<Instant>,
    /// Detaches tried since the last window closed (a missed one is tried again, up to
    /// [`DETACH_TRIES`]: until one succeeds every runtime callback stays on).
    detach_tries: u32,
}

/// How many times a detach after one window is tried.
const DETACH_TRIES: u32 = 4;

impl Scheduler {
    /// A scheduler for an always-on recording (None in the default mode).
    pub fn new(opts: &Options) -> Option<Scheduler> {
        if opts.mode != Mode::AlwaysOn {
            return None;
        }
        REQUESTS.active.store(true, Ordering::Release);
        // GPUFL_ALWAYS_ON_BUDGET, GPUFL_WINDOW_MS, GPUFL_WINDOW_PERIOD_MS.
        let knobs = crate::options::knobs();
        Some(Scheduler {
            window: knobs.window,
            fixed_period: knobs.window_period,
            budget_pct: knobs.always_on_budget_pct,
            next_open: Instant::now()
                + first_window_after(knobs.always_on_budget_pct, knobs.window_period),
            open: None,
            pending_rate: None,
            written: [0; 3],
            pending_detach: None,
            detaches: crate::detach::Tally::default(),
            lost: false,
            detach_due: None,
            detach_tries: 0,
        })
    }

    fn gpu_records(sink: &mut Sink) -> u64 {
        let c = sink.writer().counts();
        c.kernels + c.memcpys + c.memsets
    }

    /// One turn of the writer loop: open or close windows as due.
    pub fn tick(&mut self, sink: Option<&mut Sink>, now: Instant) -> Result<(), TraceError> {
        let Some(sink) = sink else { return Ok(()) };
        if let Some((at_open, len, closed)) = self.pending_rate {
            // The last sampled window's records arrive within a CUPTI flush period of its close.
            if now.saturating_duration_since(closed) >= RATE_DELAY {
                let n = Self::gpu_records(sink).saturating_sub(at_open);
                let period = self
                    .fixed_period
                    .unwrap_or_else(|| next_period(n, len, self.budget_pct));
                self.next_open = closed + period.saturating_sub(len);
                self.pending_rate = None;
            }
        }
        if let Some(closed) = self.pending_detach {
            // After the window's kernels have run (and been counted): CUPTI detached and attached
            // again, so that kernel tracing costs nothing until the next window. Its cost on the
            // program's thread counts against the budget like the window's own.
            if self.open.is_none()
                && self.pending_rate.is_none()
                && now.saturating_duration_since(closed) >= RATE_DELAY
            {
                self.pending_detach = None;
                self.detach_due = Some(closed);
            }
        }
        let request = take_request().filter(|_| !self.lost);
        if let Some(o) = &self.open {
            let replace = request.is_some() && o.reason == Reason::Sampled;
            if now >= o.until || replace {
                self.close(sink, now)?;
            }
        }
        if self.open.is_none() {
            if let Some((ms, reason)) = request {
                self.try_open(sink, now, reason, Duration::from_millis(ms));
            } else if self.budget_pct > 0.0
                && !self.lost
                && now >= self.next_open
                && self.pending_rate.is_none()
                && self.pending_detach.is_none()
                && self.detach_due.is_none()
            {
                self.try_open(sink, now, Reason::Sampled, self.window);
            }
        }
        Ok(())
    }

    fn try_open(&mut self, sink: &mut Sink, now: Instant, reason: Reason, len: Duration) {
        let detail = reason != Reason::Sampled;
        match collection::set_window(true, detail) {
            Some(start_ts) => {
                self.open = Some(Open {
                    reason,
                    start_ts,
                    opened: now,
                    until: now + len,
                    records_at_open: Self::gpu_records(sink),
                });
            }
            None => {
                // Paused (or stopping): try the next sampled window later.
                self.next_open = now + self.window;
            }
        }
    }

    /// Close the open window (if any) and write its record.
    pub fn close(&mut self, sink: &mut Sink, now: Instant) -> Result<(), TraceError> {
        let Some(o) = self.open.take() else {
            return Ok(());
        };
        let end_ts =
            collection::set_window(false, false).unwrap_or_else(crate::recorder::trace_clock);
        let len = now.saturating_duration_since(o.opened);
        if o.reason == Reason::Sampled {
            self.pending_rate = Some((o.records_at_open, len.max(Duration::from_millis(1)), now));
        }
        // Provisional (a sampled window's rate sets it once its records are in): the shortest.
        self.next_open = now + self.fixed_period.unwrap_or(MIN_PERIOD).saturating_sub(len);
        self.written[o.reason as usize - 1] += 1;
        if collection::detach_applies() {
            self.pending_detach = Some(now);
            self.detach_tries = 0;
        }
        sink.write(&Record::Window(Window {
            start: o.start_ts,
            end: end_ts.max(o.start_ts),
            reason: o.reason.as_str().into(),
        }))
    }

    /// A detach due now, with when its window closed (taken once).
    pub fn take_detach_due(&mut self) -> Option<Instant> {
        self.detach_due.take()
    }

    /// What the detach after the window that closed at `closed` did (crate::detach); the next
    /// sampled window waits long enough for the budget to cover the program's time detaching.
    pub fn detached(
        &mut self,
        sink: Option<&mut Sink>,
        closed: Instant,
        outcome: Option<collection::DetachOutcome>,
    ) -> Result<(), TraceError> {
        match outcome {
            None => {}
            Some(collection::DetachOutcome::Done {
                finalize_ns,
                gap_ns,
            }) => {
                self.detaches.add(finalize_ns, gap_ns);
                if self.fixed_period.is_none() && self.budget_pct > 0.0 {
                    let least = Duration::from_nanos(finalize_ns)
                        .div_f64(self.budget_pct / 100.0)
                        .min(MAX_PERIOD);
                    self.next_open = self.next_open.max(closed + least);
                }
            }
            Some(collection::DetachOutcome::Missed) => {
                self.detaches.missed += 1;
                self.detach_again();
            }
            Some(collection::DetachOutcome::Refused) => {
                self.detaches.refused += 1;
                self.detach_again();
            }
            Some(collection::DetachOutcome::Lost(why)) => {
                self.lost = true;
                if let Some(sink) = sink {
                    sink.write(&Record::Notice(gpufl_trace::Notice {
                        level: "warning".into(),
                        message: why,
                    }))?;
                }
            }
        }
        Ok(())
    }

    /// A detach not taken is tried again a little later, up to [`DETACH_TRIES`] times after a
    /// window (the runtime callbacks stay on meanwhile).
    fn detach_again(&mut self) {
        self.detach_tries += 1;
        if self.detach_tries < DETACH_TRIES && self.open.is_none() {
            self.pending_detach = Some(Instant::now());
        }
    }

    /// At stop: close a window still open, write a summary notice.
    pub fn finish(&mut self, sink: &mut Sink) -> Result<(), TraceError> {
        self.close(sink, Instant::now())?;
        REQUESTS.active.store(false, Ordering::Release);
        sink.write(&Record::Notice(gpufl_trace::Notice {
            level: "info".into(),
            message: format!(
                "always-on: {} sampled, {} triggered and {} API windows (budget {} % of the run for GPU activity, windows of {} ms){}",
                self.written[0],
                self.written[1],
                self.written[2],
                self.budget_pct,
                self.window.as_millis(),
                self.detaches
                    .describe()
                    .map(|d| format!("; {d}"))
                    .unwrap_or_default()
            ),
        }))
    }
}

/// Install the trigger signal handler (always-on only; where the program left the default
/// action). Returns a notice when it was not installed for a reason the user should know.
pub fn install_trigger_signal() -> Option<String> {
    let sig = match &crate::options::knobs().trigger_signal {
        TriggerSignal::Off => return None,
        TriggerSignal::Signal(sig) => *sig,
        TriggerSignal::Invalid(notice) => return Some(notice.clone()),
    };
    // SAFETY: plain sigaction calls.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Some(format!("trigger signal {sig}: sigaction failed"));
        }
        if old.sa_sigaction != libc::SIG_DFL {
            return Some(format!(
                "trigger signal {} not installed: the program handles it (use gpufl_capture_window, or GPUFL_TRIGGER_SIGNAL)",
                gpufl_trace::signals::signal_name(sig)
            ));
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_trigger as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
            return Some(format!("trigger signal {sig}: sigaction failed"));
        }
    }
    None
}

/// The trigger signal: a full-detail window of the seconds `gpufl trigger` queued with it
/// (`sigqueue` value, ms), else the default length.
extern "C" fn on_trigger(_sig: i32, info: *mut libc::siginfo_t, _uctx: *mut libc::c_void) {
    let mut seconds = DEFAULT_DETAIL_SECONDS;
    // SAFETY: the kernel's siginfo; si_value is valid for SI_QUEUE.
    unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_QUEUE {
            let ms = (*info).si_value().sival_ptr as usize as u64;
            if ms > 0 {
                seconds = ms as f64 / 1000.0;
            }
        }
    }
    request_window(seconds, Reason::Trigger);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_window_waits_until_the_run_has_earned_it() {
        // 20 ms at 0.5 % of the run: 4 s in; a larger budget earns it sooner, never before 2 s.
        assert_eq!(first_window_after(0.5, None), Duration::from_secs(4));
        assert_eq!(first_window_after(0.1, None), Duration::from_secs(20));
        assert_eq!(first_window_after(5.0, None), FIRST_WINDOW_AFTER);
        // A tiny budget: no later than the longest period.
        assert_eq!(first_window_after(0.0001, None), MAX_PERIOD);
        // A fixed period (GPUFL_WINDOW_PERIOD_MS) keeps the earliest start.
        assert_eq!(
            first_window_after(0.5, Some(Duration::from_millis(500))),
            FIRST_WINDOW_AFTER
        );
    }

    #[test]
    fn period_follows_the_budget() {
        // 20,000 kernels/s: 6 % while on; 0.5 % budget → duty 1/12 → 200 ms every 2.4 s.
        let p = next_period(4000, Duration::from_millis(200), 0.5);
        assert!((p.as_secs_f64() - 2.4).abs() < 0.01, "{p:?}");
        // Few records: the largest duty, but never under the shortest period.
        assert_eq!(next_period(10, Duration::from_millis(200), 0.5), MIN_PERIOD);
        assert_eq!(next_period(0, Duration::from_millis(200), 0.5), MIN_PERIOD);
        // A flood: the longest period.
        assert_eq!(
            next_period(10_000_000, Duration::from_millis(200), 0.5),
            MAX_PERIOD
        );
        // A larger budget, a shorter period.
        assert!(next_period(4000, Duration::from_millis(200), 1.0) < p);
    }

    #[test]
    fn a_detach_not_taken_is_tried_again_a_few_times() {
        let mut s = Scheduler {
            window: Duration::from_millis(WINDOW_MS),
            fixed_period: None,
            budget_pct: 0.5,
            next_open: Instant::now(),
            open: None,
            pending_rate: None,
            written: [1, 0, 0],
            pending_detach: None,
            detaches: crate::detach::Tally::default(),
            lost: false,
            detach_due: None,
            detach_tries: 0,
        };
        let closed = Instant::now();
        let outcomes = [
            collection::DetachOutcome::Missed,
            collection::DetachOutcome::Refused,
            collection::DetachOutcome::Missed,
            collection::DetachOutcome::Refused,
        ];
        for (i, o) in outcomes.into_iter().enumerate() {
            s.detached(None, closed, Some(o)).unwrap();
            // Until a detach is taken every runtime callback stays on: tried again, a few times.
            let again = s.pending_detach.take().is_some();
            assert_eq!(again, i + 1 < DETACH_TRIES as usize, "try {}", i + 1);
        }
        assert_eq!((s.detaches.missed, s.detaches.refused), (2, 2));
        let d = s.detaches.describe().unwrap();
        assert!(d.contains("2 times no CUDA call came"), "{d}");
        assert!(d.contains("2 times other threads' CUDA callbacks"), "{d}");
        // One that is taken is not tried again, and counts.
        s.detached(
            None,
            closed,
            Some(collection::DetachOutcome::Done {
                finalize_ns: 2_000_000,
                gap_ns: 10_000_000,
            }),
        )
        .unwrap();
        assert!(s.pending_detach.is_none());
        assert_eq!(s.detaches.detached, 1);
    }

    #[test]
    fn window_lengths() {
        assert_eq!(window_ms(2.0), 2000);
        assert_eq!(window_ms(0.0), 10_000);
        assert_eq!(window_ms(f64::NAN), 10_000);
        assert_eq!(window_ms(-3.0), 10_000);
        assert_eq!(window_ms(1e9), 3_600_000);
        assert_eq!(window_ms(0.0001), 1);
    }

    #[test]
    fn requests_need_an_always_on_recorder() {
        REQUESTS.active.store(false, Ordering::SeqCst);
        assert!(!request_window(1.0, Reason::Api));
        assert_eq!(take_request(), None);
        REQUESTS.active.store(true, Ordering::SeqCst);
        assert!(request_window(1.5, Reason::Trigger));
        assert_eq!(take_request(), Some((1500, Reason::Trigger)));
        assert_eq!(take_request(), None, "a request is taken once");
        REQUESTS.active.store(false, Ordering::SeqCst);
    }
}
