//! Per-class results of a validation pass: the confusion matrix, and per class precision,
//! recall, F1 and support as scikit-learn's `classification_report` computes them (a class never
//! predicted has precision 0, as its `zero_division=0`), the most confused pairs, and the files
//! the run directory keeps of them.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Counts of (true class, predicted class) pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confusion {
    classes: usize,
    /// Row-major: row = true class, column = predicted class.
    counts: Vec<u64>,
}

/// One class's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassResult {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Images of this class.
    pub support: u64,
}

impl Confusion {
    /// A matrix of `classes` x `classes` counts, row-major by true class.
    pub fn from_counts(classes: usize, counts: Vec<u64>) -> Self {
        assert_eq!(counts.len(), classes * classes, "a square matrix");
        Self { classes, counts }
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Images of class `label` predicted as `predicted`.
    pub fn count(&self, label: usize, predicted: usize) -> u64 {
        self.counts[label * self.classes + predicted]
    }

    pub fn row(&self, label: usize) -> u64 {
        (0..self.classes).map(|p| self.count(label, p)).sum()
    }

    fn column(&self, predicted: usize) -> u64 {
        (0..self.classes).map(|l| self.count(l, predicted)).sum()
    }

    pub fn per_class(&self) -> Vec<ClassResult> {
        let share = |part: u64, whole: u64| match whole {
            0 => 0.0,
            _ => part as f64 / whole as f64,
        };
        (0..self.classes)
            .map(|class| {
                let hits = self.count(class, class);
                let (precision, recall) = (
                    share(hits, self.column(class)),
                    share(hits, self.row(class)),
                );
                let f1 = match precision + recall {
                    0.0 => 0.0,
                    sum => 2.0 * precision * recall / sum,
                };
                ClassResult {
                    precision,
                    recall,
                    f1,
                    support: self.row(class),
                }
            })
            .collect()
    }

    /// The mean F1 over the classes that occur among the labels or the predictions
    /// (scikit-learn's `f1_score(average="macro")`).
    pub fn macro_f1(&self) -> f64 {
        let present: Vec<f64> = (0..self.classes)
            .zip(self.per_class())
            .filter(|&(class, _)| self.row(class) + self.column(class) > 0)
            .map(|(_, result)| result.f1)
            .collect();
        present.iter().sum::<f64>() / present.len().max(1) as f64
    }

    /// The `k` largest off-diagonal counts, as (true class, predicted class, count), largest
    /// first (ties in class order).
    pub fn most_confused(&self, k: usize) -> Vec<(usize, usize, u64)> {
        let mut pairs: Vec<(usize, usize, u64)> = (0..self.classes)
            .flat_map(|l| (0..self.classes).map(move |p| (l, p)))
            .filter(|&(l, p)| l != p)
            .map(|(l, p)| (l, p, self.count(l, p)))
            .filter(|&(_, _, n)| n > 0)
            .collect();
        pairs.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
        pairs.truncate(k);
        pairs
    }

    /// `confusion.csv`: a header of predicted class names, then a row per true class.
    pub fn csv(&self, names: &[String]) -> String {
        let mut text = String::from("true \\ predicted");
        for name in names {
            text += &format!(",{}", csv_field(name));
        }
        text.push('\n');
        for (label, name) in names.iter().enumerate() {
            text += &csv_field(name);
            for predicted in 0..self.classes {
                text += &format!(",{}", self.count(label, predicted));
            }
            text.push('\n');
        }
        text
    }

    /// `per_class.csv`: class, precision, recall, F1, support.
    pub fn per_class_csv(&self, names: &[String]) -> String {
        let mut text = String::from("class,precision,recall,f1,support\n");
        for (name, r) in names.iter().zip(self.per_class()) {
            text += &format!(
                "{},{},{},{},{}\n",
                csv_field(name),
                r.precision,
                r.recall,
                r.f1,
                r.support
            );
        }
        text
    }

    /// The per-class table and the five most confused pairs, for people.
    pub fn report(&self, names: &[String]) -> String {
        let width = names
            .iter()
            .map(|n| n.len())
            .max()
            .unwrap_or(5)
            .clamp(5, 40);
        let mut text = format!(
            "{:<width$} {:>9} {:>9} {:>9} {:>9}\n",
            "class", "precision", "recall", "f1", "support"
        );
        for (name, r) in names.iter().zip(self.per_class()) {
            let _ = writeln!(
                text,
                "{:<width$} {:>9.4} {:>9.4} {:>9.4} {:>9}",
                name, r.precision, r.recall, r.f1, r.support
            );
        }
        let _ = writeln!(text, "macro F1 {:.4}", self.macro_f1());
        let confused = self.most_confused(5);
        if !confused.is_empty() {
            text += "most confused (true -> predicted: images):\n";
            for (label, predicted, n) in confused {
                let _ = writeln!(text, "  {} -> {}: {n}", names[label], names[predicted]);
            }
        }
        text
    }
}

/// A CSV field, quoted when it holds a comma, quote or line break.
fn csv_field(text: &str) -> String {
    match text.contains([',', '"', '\n']) {
        true => format!("\"{}\"", text.replace('"', "\"\"")),
        false => text.to_string(),
    }
}

/// The most classes a heat map is drawn for: beyond, cells and names are too small to read
/// (the CSV files hold every class).
pub const HEAT_MAP_CLASSES: usize = 100;

/// The most classes whose matrix shows its counts in the cells and reads well; beyond, the
/// report lists the most confused pairs instead.
pub const COUNTED_CLASSES: usize = 30;

/// `confusion.svg`: the matrix as scikit-learn's `ConfusionMatrixDisplay` draws it (see
/// [`matrix_svg`]). Drawn for at most [`HEAT_MAP_CLASSES`] classes.
pub fn heat_map(
    path: &Path,
    confusion: &Confusion,
    names: &[String],
    title: &str,
) -> Result<(), String> {
    match matrix_svg(confusion, names, title) {
        Some(svg) => std::fs::write(path, svg).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// The matrix as scikit-learn draws it: true classes down, predicted across, class names on
/// both axes, each cell shaded by its share of its true class (so that a rare class's row
/// reads as well as a common one's) and, up to [`COUNTED_CLASSES`] classes, holding its count;
/// hovering a cell tells its count and row share. `None` beyond [`HEAT_MAP_CLASSES`].
pub fn matrix_svg(confusion: &Confusion, names: &[String], title: &str) -> Option<String> {
    let n = confusion.classes();
    if n == 0 || n > HEAT_MAP_CLASSES {
        return None;
    }
    let counted = n <= COUNTED_CLASSES;
    let digits = (0..n * n)
        .map(|i| confusion.counts[i].to_string().len())
        .max()
        .unwrap_or(1);
    let cell = match counted {
        true => (640.0 / n as f64)
            .clamp(26.0, 56.0)
            .max(7.5 * digits as f64 + 8.0),
        false => (640.0 / n as f64).clamp(6.0, 26.0),
    };
    let font = if counted {
        12.0
    } else {
        (cell - 1.0).min(12.0)
    };
    let label: Vec<String> = names.iter().map(|name| short(name, 22)).collect();
    let longest = label.iter().map(|l| l.chars().count()).max().unwrap_or(1) as f64;
    let (left, top) = (34.0 + longest * font * 0.6, 34.0);
    let side = cell * n as f64;
    let bottom = 34.0 + longest * font * 0.6 * 0.71 + 24.0;
    let (width, height) = (left + side + 16.0, top + side + bottom);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"confusion\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"system-ui, sans-serif\" font-size=\"{font}\" role=\"img\">\n<title>{}</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{left:.0}\" y=\"20\" font-size=\"15\" font-weight=\"600\" fill=\"#333\">{}</text>\n",
        escape(title),
        escape(title)
    );
    for (row, name) in names.iter().enumerate().take(n) {
        let support = confusion.row(row);
        for column in 0..n {
            let (x, y) = (left + column as f64 * cell, top + row as f64 * cell);
            svg += &matrix_cell(
                confusion,
                names,
                (row, column),
                support,
                (x, y, cell),
                counted,
            );
        }
        let y = top + (row as f64 + 0.5) * cell + font * 0.35;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\" fill=\"#333\"><title>{}</title>{}</text>",
            left - 6.0,
            escape(name),
            escape(&label[row])
        );
        let x = left + (row as f64 + 0.5) * cell;
        let _ = writeln!(
            svg,
            "<text transform=\"translate({x:.1} {:.1}) rotate(-45)\" text-anchor=\"end\" fill=\"#333\"><title>{}</title>{}</text>",
            top + side + 12.0,
            escape(name),
            escape(&label[row])
        );
    }
    let _ = writeln!(
        svg,
        "<rect x=\"{left:.1}\" y=\"{top}\" width=\"{side:.1}\" height=\"{side:.1}\" fill=\"none\" stroke=\"#999\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\" fill=\"#333\">Predicted class</text>\n<text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" fill=\"#333\">True class</text>\n</svg>",
        left + side / 2.0,
        height - 10.0,
        top + side / 2.0
    );
    Some(svg)
}

/// One cell: shaded by its share of the row, its count written in it where `counted`, and
/// both in its tooltip.
fn matrix_cell(
    confusion: &Confusion,
    names: &[String],
    (row, column): (usize, usize),
    support: u64,
    (x, y, cell): (f64, f64, f64),
    counted: bool,
) -> String {
    let count = confusion.count(row, column);
    let share = count as f64 / support.max(1) as f64;
    // scikit-learn's Blues, from near white to dark blue; white text on the dark half.
    let mix = |light: f64, dark: f64| (light + (dark - light) * share).round() as u8;
    let fill = format!(
        "#{:02x}{:02x}{:02x}",
        mix(247.0, 8.0),
        mix(251.0, 48.0),
        mix(255.0, 107.0)
    );
    let text = if share > 0.5 { "white" } else { "#222" };
    let mut svg = format!(
        "<g class=\"cell\" data-true=\"{row}\" data-predicted=\"{column}\"><title>true {}, predicted {}: {count} image{} ({:.1}% of {})</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" fill=\"{fill}\"/>",
        escape(&names[row]),
        escape(&names[column]),
        if count == 1 { "" } else { "s" },
        share * 100.0,
        escape(&names[row])
    );
    if counted {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"{text}\">{count}</text>",
            x + cell / 2.0,
            y + cell / 2.0 + 4.0
        );
    }
    svg + "</g>\n"
}

/// `name` cut to `max` characters, with an ellipsis where it was longer.
fn short(name: &str, max: usize) -> String {
    match name.chars().count() > max {
        true => name.chars().take(max - 1).chain(['…']).collect(),
        false => name.to_string(),
    }
}

fn escape(text: &str) -> String {
    crate::plot::escape(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three classes, worked by hand:
    ///
    /// ```text
    ///            predicted a  b  c
    /// true a               5  1  0
    /// true b               2  3  1
    /// true c               0  0  0
    /// ```
    /// a: precision 5/7, recall 5/6; b: precision 3/4, recall 3/6; c: never true, once
    /// predicted: precision 0, recall 0, F1 0, counted in the macro mean (it was predicted).
    #[test]
    fn per_class_figures_match_hand_values() {
        let confusion = Confusion::from_counts(3, vec![5, 1, 0, 2, 3, 1, 0, 0, 0]);
        let results = confusion.per_class();
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} {b}");
        close(results[0].precision, 5.0 / 7.0);
        close(results[0].recall, 5.0 / 6.0);
        close(
            results[0].f1,
            2.0 * (5.0 / 7.0) * (5.0 / 6.0) / (5.0 / 7.0 + 5.0 / 6.0),
        );
        close(results[1].precision, 0.75);
        close(results[1].recall, 0.5);
        close(results[1].f1, 0.6);
        assert_eq!(
            (results[2].precision, results[2].recall, results[2].f1),
            (0.0, 0.0, 0.0)
        );
        assert_eq!(
            results.iter().map(|r| r.support).collect::<Vec<_>>(),
            [6, 6, 0]
        );
        close(confusion.macro_f1(), (results[0].f1 + 0.6 + 0.0) / 3.0);
        assert_eq!(confusion.most_confused(2), [(1, 0, 2), (0, 1, 1)]);

        // A class neither true nor predicted stays out of the macro mean.
        let unseen = Confusion::from_counts(3, vec![2, 0, 0, 0, 2, 0, 0, 0, 0]);
        close(unseen.macro_f1(), 1.0);

        let names: Vec<String> = ["a", "b, the second", "c"].map(String::from).to_vec();
        let csv = confusion.csv(&names);
        assert_eq!(
            csv.lines().collect::<Vec<_>>(),
            [
                "true \\ predicted,a,\"b, the second\",c",
                "a,5,1,0",
                "\"b, the second\",2,3,1",
                "c,0,0,0"
            ]
        );
        assert!(confusion.per_class_csv(&names).contains("\nc,0,0,0,0\n"));
        let report = confusion.report(&names);
        assert!(report.contains("b, the second -> a: 2"), "{report}");

        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("confusion.svg");
        heat_map(&svg, &confusion, &names, "validation").unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("<svg") && text.contains("b, the second"),
            "{text}"
        );
        // scikit-learn's drawing: every count in its cell, and the row share on hover.
        for (label, predicted) in [(0, 0), (0, 1), (1, 2), (2, 2)] {
            let cell = format!("data-true=\"{label}\" data-predicted=\"{predicted}\">");
            let count = confusion.count(label, predicted);
            let after = text.split(&cell).nth(1).unwrap();
            let after = after.split("</g>").next().unwrap();
            assert!(after.ends_with(&format!(">{count}</text>")), "{after}");
        }
        assert!(
            text.contains("predicted a: 5 images (83.3% of a)"),
            "{text}"
        );
        // Beyond 30 classes the cells are too small for counts; beyond 100, no matrix.
        let many = Confusion::from_counts(40, vec![1; 1600]);
        let names: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
        let svg = matrix_svg(&many, &names, "many").unwrap();
        assert!(!svg.contains(">1</text>"));
        let too_many = Confusion::from_counts(101, vec![0; 101 * 101]);
        let names: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
        assert!(matrix_svg(&too_many, &names, "too many").is_none());
    }
}
