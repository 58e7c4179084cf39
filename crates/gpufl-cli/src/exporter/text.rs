//! The Prometheus text exposition format (version 0.0.4): metric families with their HELP and
//! TYPE lines, samples grouped under their family.

use std::fmt::Write;

/// Metric type of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

struct Family {
    name: &'static str,
    help: String,
    kind: Kind,
    samples: String,
}

/// A page of families, written in the order they were first named.
#[derive(Default)]
pub struct Page {
    families: Vec<Family>,
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text: `\` and newlines escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value as Prometheus reads it.
pub fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

impl Page {
    /// Name a family (HELP and TYPE), once; later calls with the same name add nothing.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &str) {
        if self.families.iter().any(|f| f.name == name) {
            return;
        }
        self.families.push(Family {
            name,
            help: help.to_string(),
            kind,
            samples: String::new(),
        });
    }

    /// One sample of a family already named.
    pub fn sample(&mut self, name: &'static str, labels: &[(&str, &str)], v: f64) {
        let Some(f) = self.families.iter_mut().find(|f| f.name == name) else {
            debug_assert!(false, "family {name} not named");
            return;
        };
        f.samples.push_str(name);
        if !labels.is_empty() {
            f.samples.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    f.samples.push(',');
                }
                let _ = write!(f.samples, "{k}=\"{}\"", escape_label(val));
            }
            f.samples.push('}');
        }
        f.samples.push(' ');
        f.samples.push_str(&value(v));
        f.samples.push('\n');
    }

    /// The page's text. Families without samples keep their HELP and TYPE lines (so a reader
    /// sees what is missing and why).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let t = match f.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            let _ = writeln!(out, "# TYPE {} {t}", f.name);
            out.push_str(&f.samples);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_with_escaped_labels() {
        let mut p = Page::default();
        p.family("a_total", Kind::Counter, "A \\ thing\nsecond line");
        p.family("b", Kind::Gauge, "B");
        p.sample("a_total", &[("line", "x\"y\\z\nw")], 1.5);
        p.sample("b", &[], f64::NAN);
        p.sample("a_total", &[("line", "q")], 2.0);
        p.family("a_total", Kind::Counter, "again");
        assert_eq!(
            p.render(),
            "# HELP a_total A \\\\ thing\\nsecond line\n# TYPE a_total counter\n\
             a_total{line=\"x\\\"y\\\\z\\nw\"} 1.5\na_total{line=\"q\"} 2\n\
             # HELP b B\n# TYPE b gauge\nb NaN\n"
        );
        assert_eq!(value(1e-7), "0.0000001");
        assert_eq!(value(f64::INFINITY), "+Inf");
    }
}
