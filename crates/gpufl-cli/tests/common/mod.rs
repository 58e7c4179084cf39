//! What the tests of the `gpufl` binary share (`mod common;` in server.rs, serve_local.rs,
//! upload_api.rs, one_answer.rs, advice.rs, clean_stacks.rs): starting `gpufl serve`, creating a
//! project, finding a bundled session, every bundled session and run, running `gpufl` on one. The server's own tests, in-process, are in crates/gpufl-server/tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const GPUFL: &str = env!("CARGO_BIN_EXE_gpufl");

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Start `cmd` (a `gpufl serve …` with its arguments) and wait for the address it prints; its
/// stderr keeps being drained (echoed with `GPUFL_TEST_VERBOSE`) so it never blocks on a full pipe.
pub fn spawn_serve_child(mut cmd: Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("gpufl serve ended before listening");
        }
        if let Some(i) = line.find("listening on http://") {
            let rest = &line[i + "listening on ".len()..];
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        while err.read_line(&mut sink).unwrap_or(0) > 0 {
            if std::env::var("GPUFL_TEST_VERBOSE").is_ok() {
                eprint!("server: {sink}");
            }
            sink.clear();
        }
    });
    (child, url)
}

/// A running `gpufl serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`spawn_serve_child`] as a [`Server`].
pub fn spawn_serve(cmd: Command) -> Server {
    let (child, url) = spawn_serve_child(cmd);
    Server { child, url }
}

/// Run `admin` (a `gpufl admin` with its database arguments) `create-project NAME`: the new
/// project's (upload key, read key).
pub fn create_project(mut admin: Command, name: &str) -> (String, String) {
    let out = admin.args(["create-project", name]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let key = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{kind} key ")))
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap()
            .to_string()
    };
    (key("upload"), key("read"))
}

/// The bundled session (testdata/sessions) whose directory name starts with `prefix` (the first
/// in name order).
pub fn bundled(prefix: &str) -> PathBuf {
    let dir = root().join("testdata/sessions");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v.into_iter()
        .next()
        .unwrap_or_else(|| panic!("no bundled session {prefix}*"))
}

/// Every bundled session and run directory (testdata/sessions, testdata/runs), sorted.
pub fn bundled_all() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for sub in ["testdata/sessions", "testdata/runs"] {
        for e in std::fs::read_dir(root().join(sub)).expect(sub) {
            let p = e.expect("entry").path();
            if p.is_dir() {
                v.push(p);
            }
        }
    }
    v.sort();
    assert!(v.len() > 30, "bundled sessions and runs: {}", v.len());
    v
}

/// `gpufl ARGS DIR`'s stdout; the command must succeed.
pub fn gpufl_on(args: &[&str], dir: &Path) -> Vec<u8> {
    let out = Command::new(GPUFL)
        .args(args)
        .arg(dir)
        .output()
        .expect("run gpufl");
    assert!(
        out.status.success(),
        "gpufl {args:?} {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
