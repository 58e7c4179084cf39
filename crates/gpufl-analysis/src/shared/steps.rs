//! The steps of a loop that a library runs under one user call: the decode steps of
//! `model.generate(...)`, the iterations of `trainer.train()`. What a step is comes from the
//! synchronizations under the call, which such loops make once per step (transformers reads back
//! whether every sequence has finished; a training loop reads back the loss):
//!
//! - **Sites:** the synchronizations located at the call (the user's line, with a library line
//!   inside it), grouped by their library line; each site's *depth* is the number of Python
//!   frames from its innermost library frame out to the user's frame (fewest over its syncs).
//! - **Candidates:** sites with at least [`MIN_STEPS`] syncs. When the sites' counts differ, a
//!   candidate needs at least twice the smallest count: a site passed once per call (the call's
//!   setup, its final read-back) is not a step.
//! - **The step site:** the candidate closest to the user's call (least depth), then the one
//!   seen most often: a loop's own check sits above the model's forward, whose synchronizations
//!   (once per layer, say) are deeper.

use crate::ids::LocIx;
use crate::shared::Ctx;
use gpufl_trace::FrameKind;
use std::collections::HashMap;

/// Fewest syncs at one site for it to mark a loop's steps.
pub const MIN_STEPS: u64 = 8;

/// A loop's steps under a user call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepSite {
    /// The synchronization each step makes (the user's call, its library line inside).
    pub loc: LocIx,
    pub count: u64,
}

/// The steps of the loop under the user's call at `file`:`line` (see the module's rules); None
/// when no site qualifies.
pub(crate) fn under_call(cx: &Ctx, file: &str, line: Option<u32>) -> Option<StepSite> {
    // site → (depth, syncs)
    let mut sites: HashMap<LocIx, (usize, u64)> = HashMap::new();
    for i in 0..cx.m.sync_count() {
        let Some(l) = cx.sync_loc(i) else { continue };
        let loc = cx.loc(l);
        if loc.library.is_none() || loc.file != file || loc.line != line {
            continue;
        }
        let depth =
            cx.m.sync_stack(i)
                .map_or(usize::MAX, |s| depth(cx, s, file, line));
        let e = sites.entry(l).or_insert((usize::MAX, 0));
        e.0 = e.0.min(depth);
        e.1 += 1;
    }
    let counts = || sites.values().map(|s| s.1);
    let (min, max) = (counts().min()?, counts().max()?);
    let (l, (_, n)) = sites
        .iter()
        .filter(|(_, (_, n))| *n >= MIN_STEPS && (min == max || *n >= min.saturating_mul(2)))
        .min_by(|a, b| {
            (a.1 .0)
                .cmp(&b.1 .0)
                .then(b.1 .1.cmp(&a.1 .1))
                .then(a.0.cmp(b.0))
        })?;
    Some(StepSite { loc: *l, count: *n })
}

/// Python frames from the stack's innermost library frame out to the user's frame at
/// `file`:`line` (`usize::MAX` when the stack has no such frame).
fn depth(cx: &Ctx, stack: crate::ids::StackIx, file: &str, line: Option<u32>) -> usize {
    let Some(frames) = cx.m.stack(stack) else {
        return usize::MAX;
    };
    let mut n: Option<usize> = None;
    for &id in frames {
        let Some(fr) = cx.m.frame(id) else { continue };
        if fr.kind != FrameKind::Python {
            continue;
        }
        if fr.file == Some(file) && fr.line == line {
            return n.unwrap_or(usize::MAX);
        }
        let library = fr.file.is_some_and(crate::userframe::is_library_file)
            && !cx.filter.is_user(fr.file, fr.module);
        match n.as_mut() {
            Some(k) => *k += 1,
            None if library => n = Some(0),
            None => {}
        }
    }
    usize::MAX
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intervals::DeviceBusy;
    use crate::model::Model;
    use crate::shared::host::tests::S;
    use crate::Config;

    const LIB: &str = "/venv/lib/python3.12/site-packages/transformers/generation/utils.py";
    const MODEL: &str =
        "/venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py";
    const USER: &str = "/app/gen.py";

    /// The steps under `gen.py:40` of a session of `calls` calls of `tokens` steps each, with a
    /// per-call sync (setup, shallow), a per-step check (depth 2) and `layers` syncs per step in
    /// the model's forward (depth 3).
    fn steps(calls: u64, tokens: u64, layers: u64, per_call: bool) -> Option<(String, u64)> {
        let mut s = S::new();
        let setup = s.py(&[("generate", LIB, 2673), ("main", USER, 40)], None);
        let check = s.py(
            &[
                ("StopCheck.__call__", LIB, 383),
                ("_sample", LIB, 3083),
                ("generate", LIB, 2802),
                ("main", USER, 40),
            ],
            None,
        );
        let layer = s.py(
            &[
                ("GPT2Attention.forward", MODEL, 300),
                ("GPT2Model.forward", MODEL, 580),
                ("_sample", LIB, 3050),
                ("generate", LIB, 2802),
                ("main", USER, 40),
            ],
            None,
        );
        let elsewhere = s.py(&[("main", USER, 42)], None);
        let mut t = 0u64;
        for _ in 0..calls {
            if per_call {
                s.sync(t, t + 10, setup);
                t += 100;
            }
            for _ in 0..tokens {
                for _ in 0..layers {
                    s.kernel(t, t + 5);
                    s.sync(t, t + 10, layer);
                    t += 100;
                }
                s.sync(t, t + 10, check);
                t += 100;
            }
            s.sync(t, t + 10, elsewhere);
            t += 100;
        }
        let m = Model::load(s.recs.clone());
        let busy = DeviceBusy::new(&m);
        let cx = Ctx::new(&m, &Config::default(), &busy, t);
        let st = under_call(&cx, USER, Some(40))?;
        let lib = cx.loc(st.loc).library.as_ref().unwrap().short();
        Some((lib, st.count))
    }

    #[test]
    fn the_loops_check_marks_the_steps_not_the_layers_nor_the_setup() {
        // 10 calls of 64 steps, 6 syncs per step in the forward: the check, 640.
        assert_eq!(steps(10, 64, 6, true), Some(("utils.py:383".into(), 640)));
        // One call: the setup's single sync is below MIN_STEPS.
        assert_eq!(steps(1, 64, 0, true), Some(("utils.py:383".into(), 64)));
        // No per-call sync and no layer syncs: the check alone.
        assert_eq!(steps(3, 16, 0, false), Some(("utils.py:383".into(), 48)));
    }

    #[test]
    fn too_few_steps_or_no_sync_under_the_call_is_none() {
        assert_eq!(steps(1, 5, 0, true), None, "5 steps < MIN_STEPS");
        assert_eq!(steps(0, 0, 0, true), None);
    }
}
