//! Locations: the user frame with the library frame beside it, stacks whose Python frames were read
//! from another thread (cross-thread attribution), user paths, and where time is attributed.

use super::*;

const SP: &str = "/venv/lib/python3.12/site-packages";

impl B {
    /// A stack as a CUDA callback records it: libcuda, then the given Python frames (innermost
    /// first), with `via` the thread its Python frames were read from.
    fn py_stack(&mut self, py: &[(&str, &str, u32)], via: Option<u64>) -> StackId {
        let mut frames =
            vec![self.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None)];
        for &(func, file, line) in py {
            frames.push(self.python(func, file, line));
        }
        let id = StackId(self.stacks);
        self.stacks += 1;
        self.recs.push(Record::Stack(Stack {
            id,
            frames,
            via_tid: via,
        }));
        id
    }

    fn text_frame(&mut self, func: &str, file: &str, line: u32, text: &str) -> FrameId {
        let t = self.s(text);
        let id = self.python(func, file, line);
        if let Some(Record::Frame(f)) = self.recs.last_mut() {
            f.text = Some(t);
        }
        id
    }
}

fn trainer_line(line: u32) -> (&'static str, String, u32) {
    (
        "Trainer._inner_training_loop",
        format!("{SP}/transformers/trainer.py"),
        line,
    )
}

/// Syncs at one user line (`train.py:16`, `trainer.train()`), issued inside transformers at
/// `lines` (one sync each, 1 ms), below torch's own frames.
fn trainer_session(lines: &[u32]) -> Analysis {
    let mut b = B::new();
    b.kernel(0, 1_000_000_000);
    let mut t = 1_000;
    for &l in lines {
        let (f, file, line) = trainer_line(l);
        let st = b.py_stack(
            &[
                ("Tensor.item", &format!("{SP}/torch/_tensor.py"), 40),
                (f, &file, line),
                (
                    "Trainer.train",
                    &format!("{SP}/transformers/trainer.py"),
                    2000,
                ),
                ("main", "/home/u/train.py", 16),
            ],
            None,
        );
        for _ in 0..3 {
            b.sync(SyncKind::StreamSynchronize, t, t + 1_000_000, Some(st));
            t += 10_000_000;
        }
    }
    b.analyze()
}

#[test]
fn a_library_frame_stands_beside_the_user_frame() {
    let a = trainer_session(&[2612]);
    let ins = rule(&a, "sync-attribution");
    assert_eq!(ins.len(), 1);
    let loc = &ins[0].location;
    assert_eq!(
        (loc.file.as_str(), loc.line),
        ("/home/u/train.py", Some(16))
    );
    let lib = loc.library.as_deref().expect("a library frame");
    // The innermost library frame that is not a framework core (torch's _tensor.py is skipped).
    assert_eq!(lib.package_path(), "transformers/trainer.py");
    assert_eq!(lib.line, Some(2612));
    assert_eq!(loc.short(), "trainer.py:2612 ← train.py:16");
    assert!(
        ins[0].title.contains("trainer.py:2612 ← train.py:16"),
        "{}",
        ins[0].title
    );
}

#[test]
fn one_user_line_splits_by_library_line() {
    let a = trainer_session(&[2612, 3100]);
    let ins = rule(&a, "sync-attribution");
    let mut libs: Vec<u32> = ins
        .iter()
        .map(|i| i.location.library.as_ref().unwrap().line.unwrap())
        .collect();
    libs.sort();
    assert_eq!(libs, [2612, 3100], "two insights, one per library line");
    assert!(ins
        .iter()
        .all(|i| i.location.line == Some(16) && i.count == 3));
}

#[test]
fn plain_framework_code_has_no_library_frame() {
    let mut b = B::new();
    b.kernel(0, 1_000_000);
    let st = b.py_stack(
        &[
            ("Tensor.item", &format!("{SP}/torch/_tensor.py"), 40),
            ("main", "/home/u/train.py", 30),
        ],
        None,
    );
    b.sync(SyncKind::StreamSynchronize, 10, 20, Some(st));
    let a = b.analyze();
    let loc = &rule(&a, "sync-attribution")[0].location;
    assert_eq!(loc.library, None);
    assert_eq!(loc.short(), "train.py:30");
}

#[test]
fn a_user_package_in_site_packages_is_user_code_by_option() {
    let mut b = B::new();
    b.kernel(0, 1_000_000);
    let st = b.py_stack(
        &[
            ("step", &format!("{SP}/mylab/train_loop.py"), 77),
            ("main", "/home/u/run.py", 5),
        ],
        None,
    );
    b.sync(SyncKind::StreamSynchronize, 10, 20, Some(st));
    let m = b.model();
    let a = analyze(&m, &Config::default());
    let loc = &rule(&a, "sync-attribution")[0].location;
    assert_eq!(
        (loc.line, loc.library.as_ref().and_then(|l| l.line)),
        (Some(5), Some(77))
    );
    let mut cfg = Config::default();
    cfg.filter.include.push("site-packages/mylab/".into());
    let a = analyze(&m, &cfg);
    let loc = &rule(&a, "sync-attribution")[0].location;
    assert_eq!(
        (loc.line, &loc.library),
        (Some(77), &None),
        "now the user's own line"
    );
}

#[test]
fn stacks_read_from_another_thread_are_marked_inferred() {
    let mut b = B::new();
    b.kernel(0, 1_000_000_000);
    // Syncs of an XLA worker whose Python frames come from thread 4242 (blocked in float()).
    let st = b.py_stack(&[("main", "/home/u/jax_train.py", 61)], Some(4242));
    for i in 0..5 {
        b.sync(
            SyncKind::StreamSynchronize,
            i * 1000,
            i * 1000 + 500,
            Some(st),
        );
    }
    // A direct sync elsewhere.
    let direct = b.py_stack(&[("main", "/home/u/jax_train.py", 70)], None);
    b.sync(SyncKind::StreamSynchronize, 9000, 9100, Some(direct));
    let a = b.analyze();
    let ins = rule(&a, "sync-attribution");
    let via = ins.iter().find(|i| i.location.line == Some(61)).unwrap();
    let inf = via.inferred.as_ref().expect("inferred");
    assert_eq!(
        (inf.via_tids.as_slice(), inf.via_stacks, inf.stacks),
        (&[4242u64][..], 1, 1)
    );
    let own = ins.iter().find(|i| i.location.line == Some(70)).unwrap();
    assert!(own.inferred.is_none());
    // Attribution: 2500 ns inferred, 100 ns the user's own line, nothing lost.
    assert_eq!(a.attribution.sync.inferred_ns, 2500);
    assert_eq!(a.attribution.sync.user_ns, 100);
    assert_eq!(a.attribution.sync.lost_share(), 0.0);
}

#[test]
fn attribution_counts_driver_internal_and_unlocated_time() {
    let mut b = B::new();
    let lost = b.py_stack(&[], None);
    let own = b.py_stack(&[("main", "/home/u/train.py", 9)], None);
    b.sync(SyncKind::StreamSynchronize, 0, 300, Some(lost));
    b.sync(SyncKind::StreamSynchronize, 1000, 1100, Some(own));
    b.sync(SyncKind::StreamSynchronize, 2000, 2600, None);
    // Two kernels: one launched at the user's line (call site), one never located.
    let corr = b.next_corr();
    let name = b.s("k");
    b.recs.push(Record::Kernel(Kernel {
        name,
        start: 0,
        end: 400,
        dev: 0,
        ctx: 1,
        stream: 7,
        corr,
        ..Kernel::default()
    }));
    let api = b.s("cudaLaunchKernel");
    b.recs.push(Record::Callsite(Callsite {
        corr,
        api,
        tid: 1,
        ts: 0,
        stack: own,
        weight: None,
    }));
    let other = b.s("other_kernel");
    b.recs.push(Record::Kernel(Kernel {
        name: other,
        start: 500,
        end: 600,
        dev: 0,
        ctx: 1,
        stream: 7,
        corr: 0,
        ..Kernel::default()
    }));
    let a = b.analyze();
    let s = &a.attribution.sync;
    assert_eq!(
        (s.user_ns, s.driver_internal_ns, s.unlocated_ns),
        (100, 300, 600)
    );
    assert!((s.lost_share() - 0.9).abs() < 1e-9);
    let g = &a.attribution.gpu;
    assert_eq!((g.user_ns, g.unlocated_ns), (400, 100));
}

#[test]
fn the_source_text_of_a_frame_reaches_the_location() {
    let mut b = B::new();
    b.kernel(0, 1_000_000);
    let cuda = b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None);
    let f = b.text_frame("main", "/home/u/train.py", 12, "loss_value = loss.item()");
    let st = b.stack(&[cuda, f]);
    b.sync(SyncKind::StreamSynchronize, 10, 20, Some(st));
    let a = b.analyze();
    let loc = &rule(&a, "sync-attribution")[0].location;
    assert_eq!(loc.text.as_deref(), Some("loss_value = loss.item()"));
}
