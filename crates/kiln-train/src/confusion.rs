//! Per-class results of a validation pass: the confusion matrix, and per class precision,
//! recall, F1 and support as scikit-learn's `classification_report` computes them (a class never
//! predicted has precision 0, as its `zero_division=0`), the most confused pairs, and the files
//! the run directory keeps of them.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
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

    fn row(&self, label: usize) -> u64 {
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

/// `confusion.svg`: each cell's share of its true class, dark for most, with the class names on
/// both axes. Drawn for at most [`HEAT_MAP_CLASSES`] classes.
pub fn heat_map(
    path: &Path,
    confusion: &Confusion,
    names: &[String],
    title: &str,
) -> Result<(), String> {
    let n = confusion.classes();
    if n == 0 || n > HEAT_MAP_CLASSES {
        return Ok(());
    }
    let cell = (600 / n as u32).clamp(6, 60);
    let margin = 140;
    let size = (margin + cell * n as u32 + 20, margin + cell * n as u32 + 40);
    let root = SVGBackend::new(path, size).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    root.draw(&Text::new(
        format!("{title} (rows: true class, columns: predicted; share of each row)"),
        (10, 10),
        ("sans-serif", 14).into_font(),
    ))
    .map_err(|e| draw(&e))?;
    let font = ("sans-serif", (cell as i32 - 2).clamp(6, 12)).into_font();
    for (label, name) in names.iter().enumerate().take(n) {
        let support = confusion.row(label).max(1) as f64;
        for predicted in 0..n {
            let share = confusion.count(label, predicted) as f64 / support;
            let shade = (255.0 * (1.0 - share)).round() as u8;
            let (x, y) = (
                (margin + predicted as u32 * cell) as i32,
                (margin + label as u32 * cell) as i32,
            );
            let colour = RGBColor(shade, shade, 255);
            root.draw(&Rectangle::new(
                [(x, y), (x + cell as i32, y + cell as i32)],
                colour.filled(),
            ))
            .map_err(|e| draw(&e))?;
        }
        let y = (margin + label as u32 * cell) as i32;
        let name: String = name.chars().take(18).collect();
        root.draw(&Text::new(name.clone(), (4, y), font.clone()))
            .map_err(|e| draw(&e))?;
        let x = (margin + label as u32 * cell) as i32;
        root.draw(&Text::new(
            name,
            (x, margin as i32 - 4),
            font.clone().transform(FontTransform::Rotate270),
        ))
        .map_err(|e| draw(&e))?;
    }
    root.present().map_err(|e| draw(&e))
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
    }
}
