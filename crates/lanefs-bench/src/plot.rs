//! PNG plot: ops/s against threads, one panel per workload, one line per target.
//!
//! plotters draws text through ab_glyph from a TrueType file read at run time (a system font),
//! which keeps fontconfig and freetype out of the build.

use crate::workload::Workload;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    pub target: String,
    pub workload: Workload,
    pub threads: usize,
    pub ops_per_sec: f64,
}

const FONT: &str = "sans-serif";

/// Registers a system TrueType font with plotters, once.
fn ensure_font() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT
        .get_or_init(|| {
            let path = find_font()
                .ok_or("no TrueType font found for plot labels (install fonts-dejavu-core)".to_string())?;
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            // plotters keeps registered fonts for the life of the process: leak the bytes once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
        })
        .clone()
}

fn find_font() -> Option<PathBuf> {
    const KNOWN: [&str; 5] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    ];
    if let Some(p) = KNOWN.iter().map(Path::new).find(|p| p.is_file()) {
        return Some(p.to_path_buf());
    }
    // Any .ttf under the usual roots, a few levels deep.
    fn walk(dir: &Path, depth: u32) -> Option<PathBuf> {
        let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in &entries {
            if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
                return Some(p.clone());
            }
        }
        if depth == 0 {
            return None;
        }
        entries.iter().filter(|p| p.is_dir()).find_map(|p| walk(p, depth - 1))
    }
    ["/usr/share/fonts", "/usr/local/share/fonts"].iter().find_map(|d| walk(Path::new(d), 3))
}

fn si(v: f64) -> String {
    match v.abs() {
        x if x >= 1e6 => format!("{:.1}M", v / 1e6),
        x if x >= 1e4 => format!("{:.0}k", v / 1e3),
        x if x >= 1e3 => format!("{:.1}k", v / 1e3),
        _ => format!("{v:.0}"),
    }
}

/// Draws `points` into a PNG at `path`.
pub fn plot(path: &Path, points: &[Point]) -> Result<(), String> {
    if points.is_empty() {
        return Err("nothing to plot".into());
    }
    ensure_font()?;
    let mut workloads: Vec<Workload> = points.iter().map(|p| p.workload).collect();
    workloads.sort();
    workloads.dedup();
    let mut targets: Vec<&str> = Vec::new();
    for p in points {
        if !targets.contains(&p.target.as_str()) {
            targets.push(&p.target);
        }
    }
    let lo = points.iter().map(|p| p.threads).min().unwrap_or(1) as f64;
    let hi = points.iter().map(|p| p.threads).max().unwrap_or(1) as f64;
    let (x0, x1) = if hi > lo { (lo - 0.2, hi + 0.2) } else { (lo - 1.0, hi + 1.0) };

    let cols = workloads.len().min(4);
    let rows = workloads.len().div_ceil(cols);
    let size = (cols as u32 * 380, rows as u32 * 280);
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    for (i, (panel, w)) in root.split_evenly((rows, cols)).iter().zip(&workloads).enumerate() {
        let mine: Vec<&Point> = points.iter().filter(|p| p.workload == *w).collect();
        let ymax = mine.iter().map(|p| p.ops_per_sec).fold(0.0, f64::max).max(1.0) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(w.name(), (FONT, 18))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(52)
            .build_cartesian_2d(x0..x1, 0.0..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("threads")
            .y_desc("ops/s")
            .label_style((FONT, 12))
            // Major grid lines only: the minor ones add noise and triple the PNG's size.
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 && *x >= 1.0 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| si(*y))
            .draw()
            .map_err(|e| err(&e))?;
        for (k, target) in targets.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = mine
                .iter()
                .filter(|p| p.target == *target)
                .map(|p| (p.threads as f64, p.ops_per_sec))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(*target)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
        }
        // One legend is enough: the first panel's, when there is more than one target.
        if i == 0 && targets.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FONT, 11))
                .draw()
                .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_a_png() {
        if find_font().is_none() {
            eprintln!("no system font: plot test skipped");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("p.png");
        let mut pts = Vec::new();
        for (target, k) in [("ext4", 1.0), ("tmpfs", 2.0)] {
            for w in [Workload::Dwol, Workload::Mwcm, Workload::Varmail] {
                for t in [1, 2] {
                    pts.push(Point {
                        target: target.into(),
                        workload: w,
                        threads: t,
                        ops_per_sec: k * 1000.0 * t as f64,
                    });
                }
            }
        }
        plot(&path, &pts).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(plot(&path, &[]).is_err());
    }
}
