//! `rverbs-plot`: one line per series, from `series,x,y` lines on stdin, as a PNG
//! (`tools/compare-perftest` draws barrier latency against world size with it).
//!
//! ```text
//! printf 'dissemination,2,25.1\ndissemination,4,900\n' | \
//!     rverbs-plot out.png "Barrier latency on rxe" "ranks" "median [us]"
//! ```
//!
//! Text is drawn with DejaVu Sans read at run time (`RVERBS_PLOT_FONT` names another
//! TrueType file), so nothing but the font file is needed.
#![allow(clippy::std_instead_of_core)] // a std program

use std::collections::BTreeMap;
use std::io::Read;
use std::process::ExitCode;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rverbs-plot: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `series -> [(x, y)]` from `series,x,y` lines (blank lines and `#` comments skipped).
fn parse(text: &str) -> Res<BTreeMap<String, Vec<(f64, f64)>>> {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [name, x, y] = f[..] else {
            return Err(format!("line {}: expected series,x,y", i + 1).into());
        };
        series
            .entry(name.to_owned())
            .or_default()
            .push((x.parse()?, y.parse()?));
    }
    for points in series.values_mut() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    if series.is_empty() {
        return Err("no data on stdin".into());
    }
    Ok(series)
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, title, xlabel, ylabel] = &args[..] else {
        return Err("usage: rverbs-plot OUT.png TITLE X-LABEL Y-LABEL < series,x,y".into());
    };
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let series = parse(&text)?;
    let path = std::env::var("RVERBS_PLOT_FONT").unwrap_or_else(|_| FONT.to_owned());
    let font = std::fs::read(&path).map_err(|e| format!("font {path}: {e}"))?;
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| format!("font {path} is not a TrueType font"))?;

    let pts = series.values().flatten();
    let (x0, x1) = pts
        .clone()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = pts.fold(0.0f64, |m, p| m.max(p.1)) * 1.1;
    let root = BitMapBackend::new(out, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, 0.0..y1.max(1e-9))?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_labels(((x1 - x0) as usize + 1).min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_input_parses_into_sorted_series_and_refuses_short_or_empty_input() {
        let s = parse("# c\na,4,2.5\nb,2,1\na,2,1.5\n\n").unwrap();
        assert_eq!(s["a"], [(2.0, 1.5), (4.0, 2.5)]);
        assert_eq!(s["b"], [(2.0, 1.0)]);
        assert!(parse("a,1").is_err());
        assert!(parse("").is_err());
    }
}
