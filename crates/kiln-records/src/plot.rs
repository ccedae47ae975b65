//! Line charts as SVG, kiln's one plotter, drawn by hand so that they read at a glance: the x
//! axis in epochs with whole-number ticks (or round ticks of other values, as the range test's
//! learning rates), text of at least 12 px, lines of at least 2 px, Okabe and Ito's
//! colour-blind-safe palette, a light grid, and the legend above the plot where it hides no
//! data. The run's page inlines the same markup that its `.svg` files hold.

use std::fmt::Write as _;

/// Okabe and Ito's palette, without its yellow (unreadable on white): blue, vermillion, bluish
/// green, reddish purple, orange, sky blue, black.
pub const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
];

/// The most points a line is drawn with: more add bytes, not detail, at a plot's width.
const MAX_POINTS: usize = 1200;

/// How one series is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Style {
    pub colour: &'static str,
    pub width: f64,
    pub opacity: f64,
    pub dashed: bool,
    /// A dot at every point (per-epoch figures).
    pub markers: bool,
}

impl Style {
    /// A solid line of 2.5 px.
    pub fn line(colour: &'static str) -> Self {
        Self {
            colour,
            width: 2.5,
            opacity: 1.0,
            dashed: false,
            markers: false,
        }
    }

    /// A line with a dot at every point.
    pub fn dotted(colour: &'static str) -> Self {
        Self {
            markers: true,
            width: 2.0,
            ..Self::line(colour)
        }
    }

    /// A pale line of 2 px, under its smoothed version.
    pub fn faint(colour: &'static str) -> Self {
        Self {
            width: 2.0,
            opacity: 0.25,
            ..Self::line(colour)
        }
    }

    pub fn dashed(self) -> Self {
        Self {
            dashed: true,
            ..self
        }
    }
}

/// One named line of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

/// How the y axis labels its ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YFormat {
    Plain,
    /// Shares shown as percentages (0.95 as 95%).
    Percent,
    /// Small numbers such as learning rates (4e-3).
    Scientific,
}

/// What a chart's x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis<'a> {
    /// Epochs: whole ticks from 0 (see [`epoch_ticks`]).
    Epochs,
    /// Other values, under this name (a learning rate's log10): round ticks over the data.
    Values(&'a str),
}

/// A chart of lines.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_axis: XAxis<'a>,
    pub y_label: &'a str,
    pub y_format: YFormat,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 540.0;
const HEIGHT: f64 = 330.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const BOTTOM: f64 = 46.0;
const TEXT: &str = "#333";

impl Chart<'_> {
    /// The chart's SVG document (its `<svg>` element alone, as a page inlines it).
    pub fn svg(&self) -> String {
        let (legend, legend_rows) = self.legend();
        let top = 34.0 + 20.0 * legend_rows as f64;
        let plot = Area {
            left: LEFT,
            top,
            width: WIDTH - LEFT - RIGHT,
            height: HEIGHT - top - BOTTOM,
        };
        let points = self.series.iter().flat_map(|s| s.points.iter());
        let (x_range, x_ticks) = match self.x_axis {
            XAxis::Epochs => {
                let x_max = points.clone().map(|p| p.0).fold(0.0, f64::max);
                let (x_end, x_ticks) = epoch_ticks(x_max);
                ((0.0, x_end), x_ticks)
            }
            XAxis::Values(_) => {
                let (x0, x1) = (points.clone())
                    .map(|p| p.0)
                    .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
                let x_ticks = nice_ticks(x0, x1, 6);
                ((x_ticks[0], *x_ticks.last().expect("ticks")), x_ticks)
            }
        };
        let (y0, y1) = points
            .map(|p| p.1)
            .fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
        let y_ticks = nice_ticks(y0, y1, 5);
        let scale = Scale {
            area: plot,
            x: x_range,
            y: (y_ticks[0], *y_ticks.last().expect("ticks")),
        };
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"system-ui, sans-serif\" font-size=\"13\" role=\"img\">\n<title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"20\" font-size=\"15\" font-weight=\"600\" fill=\"{TEXT}\">{}</text>\n",
            escape(self.title),
            escape(self.title)
        );
        svg += &legend;
        svg += &axes(
            &scale,
            (&x_ticks, self.x_axis),
            &y_ticks,
            self.y_format,
            self.y_label,
        );
        for series in &self.series {
            svg += &draw(series, &scale);
        }
        svg += "</svg>\n";
        svg
    }

    /// The legend's markup under the title, wrapped into rows, and how many rows it takes.
    fn legend(&self) -> (String, usize) {
        let (mut svg, mut x, mut row) = (String::new(), LEFT, 0);
        for series in self.series.iter().filter(|s| !s.name.is_empty()) {
            let width = 30.0 + 7.2 * series.name.chars().count() as f64 + 16.0;
            if x + width > WIDTH - RIGHT && x > LEFT {
                (x, row) = (LEFT, row + 1);
            }
            let y = 38.0 + 20.0 * row as f64;
            let style = series.style;
            let _ = write!(
                svg,
                "<line x1=\"{x}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" {}/>",
                y - 4.0,
                x + 24.0,
                y - 4.0,
                stroke(&Style {
                    opacity: style.opacity.max(0.5),
                    ..style
                })
            );
            if style.markers {
                let _ = write!(
                    svg,
                    "<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"/>",
                    x + 12.0,
                    y - 4.0,
                    style.colour
                );
            }
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{y}\" fill=\"{TEXT}\">{}</text>",
                x + 30.0,
                escape(&series.name)
            );
            x += width;
        }
        let rows = if svg.is_empty() { 0 } else { row + 1 };
        (svg, rows)
    }
}

#[derive(Debug, Clone, Copy)]
struct Area {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
}

/// Data coordinates to the picture's.
struct Scale {
    area: Area,
    x: (f64, f64),
    y: (f64, f64),
}

impl Scale {
    fn x(&self, x: f64) -> f64 {
        self.area.left + (x - self.x.0) / (self.x.1 - self.x.0) * self.area.width
    }

    fn y(&self, y: f64) -> f64 {
        self.area.top + (1.0 - (y - self.y.0) / (self.y.1 - self.y.0)) * self.area.height
    }
}

/// The grid, the ticks and their labels, and the axes' names.
fn axes(
    scale: &Scale,
    (x_ticks, x_axis): (&[f64], XAxis),
    y_ticks: &[f64],
    format: YFormat,
    y_label: &str,
) -> String {
    let a = scale.area;
    let (bottom, right) = (a.top + a.height, a.left + a.width);
    let mut svg = String::from("<g stroke=\"#e3e3e3\" stroke-width=\"1\">");
    for &x in x_ticks {
        let px = scale.x(x);
        let _ = write!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"{}\" x2=\"{px:.1}\" y2=\"{bottom}\"/>",
            a.top
        );
    }
    for &y in y_ticks {
        let py = scale.y(y);
        let _ = write!(
            svg,
            "<line x1=\"{}\" y1=\"{py:.1}\" x2=\"{right}\" y2=\"{py:.1}\"/>",
            a.left
        );
    }
    svg += "</g>\n";
    let _ = writeln!(
        svg,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
        a.left, a.top, a.width, a.height
    );
    let _ = write!(
        svg,
        "<g font-size=\"12\" fill=\"{TEXT}\" text-anchor=\"middle\">"
    );
    let x_step = x_ticks.get(1).map_or(1.0, |t| t - x_ticks[0]);
    for &x in x_ticks {
        let label = match x_axis {
            XAxis::Epochs => x.to_string(),
            XAxis::Values(_) => tick_label(x, x_step, YFormat::Plain),
        };
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\">{label}</text>",
            scale.x(x),
            bottom + 16.0
        );
    }
    svg += "</g>\n";
    let step = y_ticks.get(1).map_or(1.0, |t| t - y_ticks[0]);
    let _ = write!(
        svg,
        "<g font-size=\"12\" fill=\"{TEXT}\" text-anchor=\"end\">"
    );
    for &y in y_ticks {
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\">{}</text>",
            a.left - 6.0,
            scale.y(y) + 4.0,
            tick_label(y, step, format)
        );
    }
    svg += "</g>\n";
    let middle = a.top + a.height / 2.0;
    let x_label = match x_axis {
        XAxis::Epochs => "epoch",
        XAxis::Values(label) => label,
    };
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"{TEXT}\">{}</text>\n<text transform=\"translate(15 {middle:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"{TEXT}\">{}</text>",
        a.left + a.width / 2.0,
        bottom + 36.0,
        escape(x_label),
        escape(y_label)
    );
    svg
}

/// A series' line (and dots).
fn draw(series: &Series, scale: &Scale) -> String {
    let points = thin(&series.points, MAX_POINTS);
    let mut svg = String::new();
    if points.len() > 1 {
        let path: Vec<String> = (points.iter())
            .map(|&(x, y)| format!("{:.1},{:.1}", scale.x(x), scale.y(y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\" {} points=\"{}\"/>",
            stroke(&series.style),
            path.join(" ")
        );
    }
    if series.style.markers || points.len() == 1 {
        let _ = write!(svg, "<g fill=\"{}\">", series.style.colour);
        for &(x, y) in &points {
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\"/>",
                scale.x(x),
                scale.y(y)
            );
        }
        svg += "</g>\n";
    }
    svg
}

fn stroke(style: &Style) -> String {
    let dash = if style.dashed {
        " stroke-dasharray=\"7 5\""
    } else {
        ""
    };
    format!(
        "stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\"{dash}",
        style.colour, style.width, style.opacity
    )
}

/// At most `max` of `points`, evenly spaced, the last always kept.
fn thin(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    let step = points.len().div_ceil(max);
    let mut kept: Vec<(f64, f64)> = points.iter().copied().step_by(step).collect();
    if kept.last() != points.last() {
        kept.extend(points.last());
    }
    kept
}

/// The x axis for data up to epoch `max`: its end and its ticks, whole epochs from 0, 3 to 8
/// intervals of 1, 2, 5, 10, 20, 25, 50, ... epochs; the axis ends at the data's last epoch
/// where a step divides it, else at the next tick after it.
pub fn epoch_ticks(max: f64) -> (f64, Vec<f64>) {
    let end = max.ceil().max(1.0);
    let steps: Vec<f64> = [1.0, 2.0, 5.0, 10.0, 20.0, 25.0, 50.0]
        .into_iter()
        .chain((2..12).flat_map(|p| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(p))))
        .collect();
    let intervals = |step: f64| (end / step).ceil();
    let fits = |step: &f64| intervals(*step) <= 8.0;
    let dividing = (steps.iter())
        .find(|&&s| fits(&s) && (end / s).fract() == 0.0 && (intervals(s) >= 3.0 || end <= 8.0));
    let step = *dividing
        .or_else(|| steps.iter().find(|s| fits(s)))
        .expect("a step fits");
    let end = intervals(step) * step;
    let ticks = (0..=intervals(step) as usize)
        .map(|i| i as f64 * step)
        .collect();
    (end, ticks)
}

/// About `target` evenly spaced round ticks (1, 2 or 5 times a power of ten apart) that cover
/// `lo..=hi`; the first and last are the axis' ends.
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let (lo, hi) = match (lo.is_finite() && hi.is_finite() && lo <= hi, hi - lo) {
        // No data.
        (false, _) => (0.0, 1.0),
        (true, span) if span <= 0.0 => match lo.abs() {
            0.0 => (0.0, 1.0),
            size => (lo - size * 0.1, hi + size * 0.1),
        },
        (true, _) => (lo, hi),
    };
    let raw = (hi - lo) / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step + 1e-9).floor();
    let last = (hi / step - 1e-9).ceil();
    (0..=(last - first) as usize)
        .map(|i| round_to((first + i as f64) * step, step))
        .collect()
}

/// `value` without the float noise of a multiple of `step` (0.30000000000000004 as 0.3).
fn round_to(value: f64, step: f64) -> f64 {
    let digits = decimals(step) as i32;
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The decimals a tick label needs for ticks `step` apart.
fn decimals(step: f64) -> usize {
    match step {
        s if s >= 1.0 || s <= 0.0 => 0,
        s => (-s.log10() - 1e-9).ceil() as usize,
    }
}

/// A tick's label, with the decimals its spacing needs.
pub fn tick_label(value: f64, step: f64, format: YFormat) -> String {
    match format {
        YFormat::Percent => format!("{:.*}%", decimals(step * 100.0), value * 100.0),
        YFormat::Scientific if value == 0.0 => "0".to_string(),
        YFormat::Scientific if value.abs() < 1e-2 => {
            let text = format!("{value:.1e}");
            text.replace(".0e", "e")
        }
        YFormat::Scientific | YFormat::Plain => format!("{:.*}", decimals(step), value),
    }
}

/// TensorBoard's smoothing of a scalar: an exponential moving average with `weight` on the past,
/// divided by `1 - weight^n` so that the first points are not pulled towards zero. Non-finite
/// values stay as they are and do not enter the average.
pub fn smooth(values: &[f64], weight: f64) -> Vec<f64> {
    let (mut last, mut count) = (0.0, 0);
    values
        .iter()
        .map(|&value| {
            if !value.is_finite() {
                return value;
            }
            last = last * weight + (1.0 - weight) * value;
            count += 1;
            let debias = match weight {
                1.0 => 1.0,
                w => 1.0 - w.powi(count),
            };
            last / debias
        })
        .collect()
}

/// The smoothing weight for a line of `points`: TensorBoard's 0.6 suits a few hundred logged
/// values; kiln logs every step, so the average spans about a fiftieth of the line instead.
pub fn smoothing_weight(points: usize) -> f64 {
    let span = (points as f64 / 50.0).max(1.0);
    1.0 - 1.0 / span
}

/// Text as SVG and HTML show it literally.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-12, "{a:?} {b:?}");
        }
    }

    /// TensorBoard's numbers, worked by hand: with weight 0.5, 0 then 1 is 0 then
    /// 0.5 / (1 - 0.25); a constant stays constant (the debiasing); NaN passes through.
    #[test]
    fn smoothing_is_tensorboards_debiased_average() {
        close(&smooth(&[0.0, 1.0], 0.5), &[0.0, 0.5 / 0.75]);
        close(&smooth(&[2.0; 5], 0.9), &[2.0; 5]);
        close(&smooth(&[3.0, 1.0], 0.0), &[3.0, 1.0]);
        let with_nan = smooth(&[1.0, f64::NAN, 1.0], 0.6);
        assert!(with_nan[1].is_nan());
        close(&[with_nan[0], with_nan[2]], &[1.0, 1.0]);
        assert_eq!(smoothing_weight(10), 0.0);
        assert!((smoothing_weight(500) - 0.9).abs() < 1e-12);
    }

    #[test]
    fn epochs_get_whole_ticks_from_zero() {
        assert_eq!(epoch_ticks(0.4), (1.0, vec![0.0, 1.0]));
        assert_eq!(epoch_ticks(3.0).1, [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(epoch_ticks(15.0), (15.0, vec![0.0, 5.0, 10.0, 15.0]));
        let (end, ticks) = epoch_ticks(13.0);
        assert_eq!((end, ticks.len()), (14.0, 8));
        assert!(ticks.iter().all(|t| t.fract() == 0.0));
        assert_eq!(epoch_ticks(12.0).1.len(), 7);
        assert_eq!(
            epoch_ticks(600.0),
            (600.0, (0..=6).map(|i| i as f64 * 100.0).collect())
        );
        assert_eq!(epoch_ticks(90.0).0, 100.0);
    }

    #[test]
    fn value_ticks_are_round_and_cover_the_data() {
        assert_eq!(nice_ticks(0.03, 2.31, 5), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        assert_eq!(nice_ticks(0.9, 1.0, 5), [0.9, 0.92, 0.94, 0.96, 0.98, 1.0]);
        assert_eq!(nice_ticks(0.0, 0.004, 4), [0.0, 0.001, 0.002, 0.003, 0.004]);
        // One value: a range around it.
        assert_eq!(
            nice_ticks(f64::MAX, f64::MIN, 5),
            [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        );
        let ticks = nice_ticks(2.0, 2.0, 5);
        assert!(
            ticks[0] <= 1.8 && *ticks.last().unwrap() >= 2.2,
            "{ticks:?}"
        );
        assert_eq!(tick_label(0.95, 0.01, YFormat::Percent), "95%");
        assert_eq!(tick_label(0.955, 0.005, YFormat::Percent), "95.5%");
        assert_eq!(tick_label(0.004, 0.001, YFormat::Scientific), "4e-3");
        assert_eq!(tick_label(1.5, 0.5, YFormat::Plain), "1.5");
    }

    /// Lines of at least 2 px, text of at least 12 px, every series in the legend, and long
    /// lines thinned.
    #[test]
    fn charts_are_drawn_to_be_read() {
        let steps: Vec<(f64, f64)> = (0..5000)
            .map(|i| (i as f64 / 1000.0, 1.0 / (1.0 + i as f64)))
            .collect();
        let chart = Chart {
            title: "loss <train>",
            x_axis: XAxis::Epochs,
            y_label: "loss",
            y_format: YFormat::Plain,
            series: vec![
                Series {
                    name: "train, each step".into(),
                    points: steps,
                    style: Style::faint(PALETTE[0]),
                },
                Series {
                    name: "validation".into(),
                    points: vec![(1.0, 0.5), (5.0, 0.2)],
                    style: Style::dotted(PALETTE[1]).dashed(),
                },
            ],
        };
        let svg = chart.svg();
        assert!(svg.starts_with("<svg") && svg.contains("loss &lt;train&gt;"));
        assert!(svg.contains(">train, each step</text>") && svg.contains(">validation</text>"));
        for width in svg.split("stroke-width=\"").skip(1) {
            let width: f64 = width.split('"').next().unwrap().parse().unwrap();
            assert!(width >= 1.0, "{width}");
        }
        for line in svg.split("<polyline").skip(1) {
            let width: f64 = line
                .split("stroke-width=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(width >= 2.0);
        }
        for size in svg.split("font-size=\"").skip(1) {
            let size: f64 = size.split('"').next().unwrap().parse().unwrap();
            assert!(size >= 12.0, "{size}");
        }
        let drawn = svg.split("<polyline").nth(1).unwrap().matches(',').count();
        assert!(drawn <= MAX_POINTS + 1, "{drawn} points");
        for tick in ["0", "1", "2", "3", "4", "5"] {
            assert!(svg.contains(&format!(">{tick}</text>")), "tick {tick}");
        }
    }

    /// An axis of other values (the range test's log10 learning rates) spans the data with
    /// round ticks, negative ones included, under its own name.
    #[test]
    fn a_value_axis_is_named_and_covers_negative_values() {
        let chart = Chart {
            title: "learning-rate range test",
            x_axis: XAxis::Values("log10 learning rate"),
            y_label: "loss",
            y_format: YFormat::Plain,
            series: vec![Series {
                name: "loss".into(),
                points: (0..=80).map(|i| (-7.0 + i as f64 / 10.0, 2.0)).collect(),
                style: Style::line(PALETTE[0]),
            }],
        };
        let svg = chart.svg();
        assert!(svg.contains(">log10 learning rate</text>") && !svg.contains(">epoch</text>"));
        for tick in ["-8", "-6", "-4", "-2", "0", "2"] {
            assert!(
                svg.contains(&format!(">{tick}</text>")),
                "tick {tick}: {svg}"
            );
        }
        // -8 is the left edge and 2 the right: -7 a tenth of the way in, 1 a tenth from the end.
        let line = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let xs: Vec<f64> = (line.split(' '))
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        let width = WIDTH - LEFT - RIGHT;
        assert!((xs[0] - (LEFT + width / 10.0)).abs() < 0.1, "{}", xs[0]);
        let last = *xs.last().unwrap();
        assert!((last - (LEFT + width * 0.9)).abs() < 0.1, "{last}");
    }
}
