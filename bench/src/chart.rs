//! The PNG chart: pairs/s against the number of live holders, both on log
//! axes, one line per contender.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::contenders::Contender;
use crate::fmt::group_thousands;
use crate::scenarios::UNCONTENDED_LIMIT;
use crate::stats::Summary;
use crate::BoxError;

/// One fixed colour per contender, so a contender keeps its colour whichever
/// others a run includes (and the ones charted before the weighted contender
/// came keep theirs). `None` for the no-module floor, which is a control for
/// the command filter, reported in its own table, and would hide the floor's
/// line under its own.
fn colour(contender: Contender) -> Option<RGBColor> {
    Some(match contender {
        Contender::RedsemFair => RGBColor(214, 39, 40),
        Contender::Redsem => RGBColor(255, 127, 14),
        Contender::RedsemCount4 => RGBColor(44, 160, 44),
        Contender::RedsemSet2 => RGBColor(188, 189, 34),
        Contender::RecipeMulti => RGBColor(31, 119, 180),
        Contender::RecipeLua => RGBColor(23, 190, 207),
        Contender::NonFairLua => RGBColor(148, 103, 189),
        Contender::Floor => RGBColor(90, 90, 90),
        Contender::FloorPlain => return None,
    })
}

/// Loads the font at run time: the chart then needs neither a font compiled
/// into the binary nor a system font library.
pub fn load_font(path: &Path) -> Result<(), BoxError> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the chart font {}: {e}", path.display()))?;
    // The font table keeps `'static` references and the font is needed for
    // the whole run, so leaking this one buffer is the simple right thing.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a usable TrueType font", path.display()))?;
    Ok(())
}

/// One contender's line: its colour, and its (N, pairs/s) points.
type Line = (RGBColor, Contender, Vec<(f64, f64)>);

/// Draws the multi-connection holder scenarios of `summaries` to `path`.
pub fn pairs_vs_holders(
    path: &Path,
    summaries: &[Summary],
    connections: usize,
    contenders: &[Contender],
) -> Result<(), BoxError> {
    let lines: Vec<Line> = contenders
        .iter()
        .filter_map(|&contender| Some((colour(contender)?, contender)))
        .map(|(colour, contender)| {
            let points = summaries
                .iter()
                .filter(|s| {
                    s.contender == contender
                        && s.scenario.connections == connections
                        && s.scenario.limit == UNCONTENDED_LIMIT
                        && s.scenario.holders > 0
                })
                .map(|s| (s.scenario.holders as f64, s.pairs_per_sec.median))
                .collect();
            (colour, contender, points)
        })
        .collect();
    let all = || lines.iter().flat_map(|(_, _, points)| points.iter());
    let (Some(x_min), Some(x_max)) = (
        all().map(|p| p.0).reduce(f64::min),
        all().map(|p| p.0).reduce(f64::max),
    ) else {
        return Err("no holder scenario to chart".into());
    };
    let y_min = all().map(|p| p.1).fold(f64::INFINITY, f64::min).max(0.1);
    let y_max = all().map(|p| p.1).fold(0.0, f64::max).max(1.0);
    // Whole decades on the rate axis, and some room either side of N.
    let y_range = 10f64.powf(y_min.log10().floor())..10f64.powf(y_max.log10().ceil());
    let x_range = x_min / 2.0..x_max * 2.0;

    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Pairs/s against live holders ({connections} connections, limit {})",
                group_thousands(UNCONTENDED_LIMIT)
            ),
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("live holders N (log scale)")
        .y_desc("pairs/s (log scale)")
        .x_label_formatter(&|x| group_thousands(x.round() as u64))
        .y_label_formatter(&|y| group_thousands(y.round() as u64))
        // Faint minor lines: a log axis has many, and the data should stand out.
        .light_line_style(BLACK.mix(0.04))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for &(colour, contender, ref points) in &lines {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(contender.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], colour.stroke_width(3)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
