//! docs/architecture.md names every source file of the workspace in its crate's section, so that
//! the map stays true as modules are added, moved or removed.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text of the `### ` section whose heading names `` `crate` ``.
fn section<'a>(doc: &'a str, krate: &str) -> Option<&'a str> {
    let tag = format!("`{krate}`");
    let mut parts = doc.split("\n### ");
    parts.next();
    parts.find(|p| p.lines().next().is_some_and(|h| h.contains(&tag)))
}

/// What the doc must name for a file `rel` (relative to `src/`): a folder's `mod.rs` by its folder
/// (`report/`), the crate roots not at all, any other file by its stem, with or without `.rs`.
fn names_it(sec: &str, rel: &Path) -> bool {
    let file = rel.file_name().unwrap().to_str().unwrap();
    let stem = file.trim_end_matches(".rs");
    match file {
        "lib.rs" | "main.rs" if rel.parent() == Some(Path::new("")) => true,
        "mod.rs" => {
            let dir = rel.parent().unwrap().file_name().unwrap().to_str().unwrap();
            sec.contains(&format!("`{dir}/`")) || sec.contains(&format!("{dir}/`"))
        }
        _ => sec.contains(&format!("{file}`")) || sec.contains(&format!("`{stem}`")),
    }
}

#[test]
fn architecture_names_every_source_file_in_its_crate_section() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    assert!(crates.len() >= 8, "crates found: {crates:?}");
    for c in crates {
        let name = c.file_name().unwrap().to_str().unwrap().to_string();
        let Some(sec) = section(&doc, &name) else {
            missing.push(format!("{name}: no `### ` section naming it"));
            continue;
        };
        let src = c.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        for f in files {
            let rel = f.strip_prefix(&src).unwrap();
            if !names_it(sec, rel) {
                missing.push(format!("{name}: src/{}", rel.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these (add them to their crate's section):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_check_sees_a_missing_file() {
    let sec = "| `records.rs` | … |\n| `report/` | `session.rs` |";
    assert!(names_it(sec, Path::new("records.rs")));
    assert!(names_it(sec, Path::new("report/mod.rs")));
    assert!(names_it(sec, Path::new("report/session.rs")));
    assert!(!names_it(sec, Path::new("writer.rs")));
    assert!(!names_it(sec, Path::new("store/mod.rs")));
}
