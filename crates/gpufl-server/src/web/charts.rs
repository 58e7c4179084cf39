//! Charts as inline SVG, made on the server: lines over time (with shaded bands, e.g. throttling),
//! stacked columns (busy and idle time by cause per slice of a run) and bars (a distribution).
//! Every text that goes into the SVG — labels, series names, tooltips (`<title>`) — is escaped
//! here, because templates insert the finished SVG unescaped (`|safe`).
//!
//! Sizes are in SVG user units; the SVG scales to its container's width (`viewBox`, CSS
//! `width: 100%`). Colours come from CSS classes (`s0`…`s7`, `band`, `axis`), so the stylesheet
//! owns the palette.

use std::fmt::Write;

/// Escape text for HTML and SVG (element content and quoted attributes).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

const W: f64 = 960.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 12.0;
const PAD_T: f64 = 10.0;
const PAD_B: f64 = 22.0;

/// One line of a [`LineChart`].
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub name: String,
    /// (x, y) in chart units, x increasing.
    pub points: Vec<(f64, f64)>,
}

/// A shaded x range (e.g. a throttled interval), with its tooltip.
#[derive(Debug, Clone)]
pub struct Band {
    pub x0: f64,
    pub x1: f64,
    pub label: String,
}

/// A marked point of a [`LineChart`] (e.g. a peak): a dot with a label and a tooltip.
#[derive(Debug, Clone)]
pub struct Mark {
    pub x: f64,
    pub y: f64,
    pub label: String,
}

/// Lines over a shared x axis.
#[derive(Debug, Clone, Default)]
pub struct LineChart {
    /// Accessible name (`aria-label`) and tooltip of the whole chart.
    pub title: String,
    pub height: f64,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
    pub marks: Vec<Mark>,
    /// y range; `None`: 0 to the largest y.
    pub y_max: Option<f64>,
    /// Text of the y axis' top and the x axis' ends: `fmt_y(y_max)`, `fmt_x(x)`.
    pub y_unit: String,
    pub x_unit: String,
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl LineChart {
    pub fn render(&self) -> String {
        let h = if self.height > 0.0 {
            self.height
        } else {
            140.0
        };
        let (mut x0, mut x1, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for s in &self.series {
            for &(x, y) in &s.points {
                if x.is_finite() && y.is_finite() {
                    x0 = x0.min(x);
                    x1 = x1.max(x);
                    ymax = ymax.max(y);
                }
            }
        }
        if let Some(m) = self.y_max {
            ymax = m;
        }
        if !x0.is_finite() || !x1.is_finite() {
            x0 = 0.0;
            x1 = 1.0;
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if ymax <= 0.0 {
            ymax = 1.0;
        }
        let pw = W - PAD_L - PAD_R;
        let ph = h - PAD_T - PAD_B;
        let sx = |x: f64| PAD_L + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| PAD_T + ph - (y.clamp(0.0, ymax) / ymax) * ph;
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="{t}"><title>{t}</title>"#,
            t = esc(&self.title)
        );
        for b in &self.bands {
            let (a, z) = (sx(b.x0.max(x0)), sx(b.x1.min(x1)));
            if z > a {
                let _ = write!(
                    o,
                    r#"<rect class="band" x="{a:.1}" y="{PAD_T}" width="{:.1}" height="{ph:.1}"><title>{}</title></rect>"#,
                    (z - a).max(0.5),
                    esc(&b.label)
                );
            }
        }
        let _ = write!(
            o,
            r#"<g class="axis"><line x1="{PAD_L}" y1="{y:.1}" x2="{xe:.1}" y2="{y:.1}"/><line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{y:.1}"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end">{top}</text><text x="{tx:.1}" y="{y:.1}" text-anchor="end">0</text><text x="{PAD_L}" y="{bx:.1}">{x0s}</text><text x="{xe:.1}" y="{bx:.1}" text-anchor="end">{x1s}</text></g>"#,
            y = PAD_T + ph,
            xe = PAD_L + pw,
            tx = PAD_L - 4.0,
            ty = PAD_T + 8.0,
            top = esc(&format!("{}{}", num(ymax), self.y_unit)),
            bx = h - 6.0,
            x0s = esc(&format!("{}{}", num(x0), self.x_unit)),
            x1s = esc(&format!("{}{}", num(x1), self.x_unit)),
        );
        for (i, s) in self.series.iter().enumerate() {
            if s.points.is_empty() {
                continue;
            }
            let _ = write!(o, r#"<polyline class="line s{}" points=""#, i % 8);
            for &(x, y) in &s.points {
                if x.is_finite() && y.is_finite() {
                    let _ = write!(o, "{:.1},{:.1} ", sx(x), sy(y));
                }
            }
            let _ = write!(o, r#""><title>{}</title></polyline>"#, esc(&s.name));
        }
        for m in &self.marks {
            if !(m.x.is_finite() && m.y.is_finite()) {
                continue;
            }
            let (cx, cy) = (sx(m.x.clamp(x0, x1)), sy(m.y));
            let anchor = if cx > PAD_L + pw * 0.7 {
                "end"
            } else {
                "start"
            };
            let dx = if anchor == "end" { -6.0 } else { 6.0 };
            let _ = write!(
                o,
                r#"<g class="mark"><title>{l}</title><circle cx="{cx:.1}" cy="{cy:.1}" r="4"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="{anchor}">{l}</text></g>"#,
                l = esc(&m.label),
                tx = cx + dx,
                ty = (cy + 4.0).max(PAD_T + 10.0),
            );
        }
        o.push_str("</svg>");
        o
    }
}

/// One column of a [`StackedColumns`] chart: its segments' values (in the order of the chart's
/// `names`) and its tooltip.
#[derive(Debug, Clone, Default)]
pub struct Column {
    pub values: Vec<f64>,
    pub label: String,
}

/// Columns of stacked segments (bottom first), e.g. per slice of a run: busy, then idle by cause.
#[derive(Debug, Clone, Default)]
pub struct StackedColumns {
    pub title: String,
    pub height: f64,
    /// Segment names (legend), bottom first; segment `i` gets class `s{i}`.
    pub names: Vec<String>,
    pub columns: Vec<Column>,
    /// Top of the y axis; `None`: the tallest column.
    pub y_max: Option<f64>,
    pub y_unit: String,
}

impl StackedColumns {
    pub fn render(&self) -> String {
        let h = if self.height > 0.0 {
            self.height
        } else {
            140.0
        };
        let tallest = self
            .columns
            .iter()
            .map(|c| c.values.iter().filter(|v| v.is_finite()).sum::<f64>())
            .fold(0.0f64, f64::max);
        let ymax = self.y_max.unwrap_or(tallest).max(f64::MIN_POSITIVE);
        let pw = W - PAD_L - PAD_R;
        let ph = h - PAD_T - PAD_B;
        let n = self.columns.len().max(1) as f64;
        let cw = pw / n;
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="{t}"><title>{t}</title>"#,
            t = esc(&self.title)
        );
        let _ = write!(
            o,
            r#"<g class="axis"><line x1="{PAD_L}" y1="{y:.1}" x2="{xe:.1}" y2="{y:.1}"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end">{top}</text><text x="{tx:.1}" y="{y:.1}" text-anchor="end">0</text></g>"#,
            y = PAD_T + ph,
            xe = PAD_L + pw,
            tx = PAD_L - 4.0,
            ty = PAD_T + 8.0,
            top = esc(&format!("{}{}", num(ymax), self.y_unit)),
        );
        for (ci, c) in self.columns.iter().enumerate() {
            let x = PAD_L + ci as f64 * cw;
            let mut base = PAD_T + ph;
            let _ = write!(o, "<g><title>{}</title>", esc(&c.label));
            for (si, v) in c.values.iter().enumerate() {
                if !v.is_finite() || *v <= 0.0 {
                    continue;
                }
                let hh = (v / ymax * ph).min(base - PAD_T);
                base -= hh;
                let _ = write!(
                    o,
                    r#"<rect class="s{}" x="{x:.2}" y="{base:.2}" width="{:.2}" height="{hh:.2}"/>"#,
                    si % 8,
                    (cw - if cw > 3.0 { 1.0 } else { 0.0 }).max(0.3)
                );
            }
            o.push_str("</g>");
        }
        o.push_str("</svg>");
        o
    }

    /// The legend as HTML: a swatch and the name of each segment.
    pub fn legend(&self) -> String {
        legend(&self.names)
    }
}

/// A legend as HTML: swatch class `s{i}` and the escaped name.
pub fn legend(names: &[String]) -> String {
    let mut o = String::from(r#"<ul class="legend">"#);
    for (i, n) in names.iter().enumerate() {
        let _ = write!(
            o,
            r#"<li><span class="swatch s{}"></span>{}</li>"#,
            i % 8,
            esc(n)
        );
    }
    o.push_str("</ul>");
    o
}

/// Bars with a label under each (a histogram: counts per duration bucket).
#[derive(Debug, Clone, Default)]
pub struct Bars {
    pub title: String,
    pub height: f64,
    /// (label under the bar, value, tooltip).
    pub bars: Vec<(String, f64, String)>,
}

impl Bars {
    pub fn render(&self) -> String {
        let h = if self.height > 0.0 {
            self.height
        } else {
            140.0
        };
        let ymax = self
            .bars
            .iter()
            .map(|b| b.1)
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        let pw = W - PAD_L - PAD_R;
        let ph = h - PAD_T - PAD_B;
        let n = self.bars.len().max(1) as f64;
        let bw = pw / n;
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg class="chart" viewBox="0 0 {W} {h}" role="img" aria-label="{t}"><title>{t}</title>"#,
            t = esc(&self.title)
        );
        let _ = write!(
            o,
            r#"<g class="axis"><line x1="{PAD_L}" y1="{y:.1}" x2="{xe:.1}" y2="{y:.1}"/><text x="{tx:.1}" y="{ty:.1}" text-anchor="end">{top}</text></g>"#,
            y = PAD_T + ph,
            xe = PAD_L + pw,
            tx = PAD_L - 4.0,
            ty = PAD_T + 8.0,
            top = esc(&num(ymax)),
        );
        for (i, (label, v, tip)) in self.bars.iter().enumerate() {
            let x = PAD_L + i as f64 * bw;
            let hh = if v.is_finite() && *v > 0.0 {
                (v / ymax * ph).max(1.0)
            } else {
                0.0
            };
            let _ = write!(
                o,
                r#"<g><title>{}</title><rect class="s0" x="{:.2}" y="{:.2}" width="{:.2}" height="{hh:.2}"/><text class="axis" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text></g>"#,
                esc(tip),
                x + 1.0,
                PAD_T + ph - hh,
                (bw - 2.0).max(0.5),
                x + bw / 2.0,
                h - 6.0,
                esc(label)
            );
        }
        o.push_str("</svg>");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_is_escaped() {
        let hostile = r#"<script>alert(1)</script>"><img src=x onerror=alert(2)>"#;
        let c = LineChart {
            title: hostile.into(),
            series: vec![Series {
                name: hostile.into(),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
            bands: vec![Band {
                x0: 0.2,
                x1: 0.4,
                label: hostile.into(),
            }],
            marks: vec![Mark {
                x: 0.5,
                y: 1.5,
                label: hostile.into(),
            }],
            ..LineChart::default()
        }
        .render();
        let s = StackedColumns {
            title: hostile.into(),
            names: vec![hostile.into()],
            columns: vec![Column {
                values: vec![1.0],
                label: hostile.into(),
            }],
            ..StackedColumns::default()
        };
        let b = Bars {
            title: hostile.into(),
            bars: vec![(hostile.into(), 3.0, hostile.into())],
            ..Bars::default()
        }
        .render();
        for out in [c, s.render(), s.legend(), b] {
            assert!(!out.contains("<script"), "{out}");
            assert!(!out.contains("<img"), "{out}");
            assert!(out.contains("&lt;script&gt;"), "{out}");
        }
    }

    #[test]
    fn empty_and_degenerate_inputs_still_draw() {
        let c = LineChart::default().render();
        assert!(c.starts_with("<svg") && c.ends_with("</svg>"));
        let s = StackedColumns {
            columns: vec![Column {
                values: vec![f64::NAN, -1.0, 0.0],
                label: "x".into(),
            }],
            ..StackedColumns::default()
        }
        .render();
        assert!(!s.contains("NaN"), "{s}");
        let one = LineChart {
            series: vec![Series {
                name: "a".into(),
                points: vec![(5.0, 0.0)],
            }],
            ..LineChart::default()
        }
        .render();
        assert!(!one.contains("NaN") && !one.contains("inf"), "{one}");
    }
}
