//! `report.html`: a run on one self-contained page (no script, nothing fetched; links only
//! to the run folder's own files): how it ended, its best epoch, timing and device, the plots
//! (the run's SVG files inlined), the confusion matrix with its counts, the images it gets
//! most confidently wrong, the per-class table, every epoch, and the config. Rewritten at every
//! epoch end.

use std::fmt::Write as _;
use std::path::Path;

use crate::confusion::{COUNTED_CLASSES, Confusion, matrix_svg};
use crate::epoch::EpochSummary;
use crate::figures::Figures;
use crate::plot::escape;
use kiln_config::config::TrainConfig;

/// What the page shows beyond the config.
pub struct ReportInputs<'a> {
    pub run: &'a Path,
    pub history: &'a [EpochSummary],
    /// The devices the run trains on, as people know them.
    pub device: &'a str,
    /// The last validated epoch's confusion matrix and class names.
    pub per_class: Option<(&'a Confusion, &'a [String])>,
    pub figures: &'a Figures,
    /// The mistakes' galleries (see `mistakes::section`), last epoch and best.
    pub mistakes: &'a str,
}

/// The page's HTML.
pub fn report_html(config: &TrainConfig, inputs: &ReportInputs) -> String {
    let history = inputs.history;
    let mut page = page_head(&format!("kiln run {}", config.name));
    let folder = inputs.run.display().to_string();
    let _ = writeln!(
        page,
        "<p class=\"where\">{} &middot; {} &middot; {} epoch{} of {} &middot; {}</p>",
        escape(&folder),
        escape(&config.model.name),
        history.len(),
        if history.len() == 1 { "" } else { "s" },
        config.epochs,
        escape(inputs.device)
    );
    page += &headline(history);
    let figures = inputs.figures;
    let _ = writeln!(
        page,
        "<h2>Plots</h2>\n<div class=\"plots\">\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n</div>",
        figures.loss, figures.accuracy, figures.lr
    );
    if let Some((confusion, names)) = inputs.per_class {
        let epoch = history.last().map_or(0, |s| s.epoch);
        page += &confusion_section(confusion, names, epoch);
    }
    if !inputs.mistakes.is_empty() {
        page += "<h2>Mistakes</h2>\n<p class=\"where\">Validation images as the model sees them \
            (before normalization); hover one for its file.</p>\n";
        page += inputs.mistakes;
    }
    page += &epoch_table(history);
    page += &files(inputs.run);
    let _ = write!(
        page,
        "<h2>Config</h2>\n<pre>{}</pre>\n</body>\n</html>\n",
        escape(&config.to_toml())
    );
    page
}

/// A page's start: its title, styles and heading.
pub fn page_head(title: &str) -> String {
    let title = escape(title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    )
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1120px;padding:0 1em;color:#222}\
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ccc}\
h3{font-size:1.1em;margin-bottom:.2em}h4{font-size:1em;margin:.8em 0 .3em;color:#444}\
.where{color:#555}table{border-collapse:collapse;margin:.5em 0}\
td,th{padding:.25em .7em;border-bottom:1px solid #e4e4e4;text-align:right}\
th:first-child,td:first-child{text-align:left}.cards{display:flex;gap:1em;flex-wrap:wrap}\
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em}\
.card b{display:block;font-size:1.4em}.plots{display:flex;flex-wrap:wrap;gap:1em}\
.side{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}\
figure{margin:0}figure svg{max-width:100%;height:auto}\
.gallery{display:flex;flex-wrap:wrap;gap:.6em}.thumb{width:112px;font-size:12px;text-align:center}\
.thumb img{display:block;margin:0 auto 2px;background:#eee}img.pixels{image-rendering:pixelated}\
b.wrong{color:#D55E00}b.right{color:#009E73}.unreadable{font-size:12px;color:#a00}\
table.differences td{text-align:left}pre{background:#f6f6f6;padding:1em;overflow:auto}";

/// The last epoch's matrix with its counts where it reads (up to 30 classes; beyond, the 20
/// most confused pairs), beside the per-class table.
fn confusion_section(confusion: &Confusion, names: &[String], epoch: usize) -> String {
    let mut html = String::from("<h2>Per class (last epoch)</h2>\n<div class=\"side\">\n");
    if confusion.classes() <= COUNTED_CLASSES {
        let title = format!("Confusion matrix, validation, epoch {epoch}");
        if let Some(svg) = matrix_svg(confusion, names, &title) {
            let _ = writeln!(html, "<figure>{svg}</figure>");
        }
    } else {
        html += &confused_pairs(confusion, names, 20);
    }
    html += &per_class_table(confusion, names);
    html + "</div>\n"
}

/// The `k` most confused (true, predicted) pairs as a table.
fn confused_pairs(confusion: &Confusion, names: &[String], k: usize) -> String {
    let pairs = confusion.most_confused(k);
    let mut html = format!(
        "<table class=\"pairs\">\n<caption>The {} most confused pairs</caption>\n<tr><th>true class</th><th>predicted</th><th>images</th><th>share of the true class</th></tr>\n",
        pairs.len()
    );
    let per_class = confusion.per_class();
    for (label, predicted, count) in pairs {
        let support = per_class[label].support.max(1) as f64;
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{count}</td><td>{:.1}%</td></tr>",
            escape(&names[label]),
            escape(&names[predicted]),
            count as f64 / support * 100.0
        );
    }
    html + "</table>\n"
}

/// Links to the run folder's files, relative, so that the page works wherever the folder is.
fn files(run: &Path) -> String {
    const FILES: [(&str, &str); 16] = [
        ("metrics.csv", "every epoch's figures (also metrics.jsonl)"),
        (
            "iterations.csv",
            "every step's training loss and learning rate",
        ),
        ("loss.svg", "the loss plot"),
        ("accuracy.svg", "the accuracy plot"),
        ("lr.svg", "the learning-rate plot"),
        ("confusion.csv", "the last epoch's confusion matrix"),
        (
            "per_class.csv",
            "the last epoch's precision, recall and F1 per class",
        ),
        ("mistakes.csv", "the last epoch's mistakes shown above"),
        ("confusion.svg", "the confusion matrix"),
        ("best/", "the same files for the best epoch"),
        ("config.toml", "the config the run trains with"),
        ("classes.txt", "the class names, in the model's order"),
        (
            "tensorboard/",
            "TensorBoard's records (tensorboard --logdir)",
        ),
        ("checkpoints/", "checkpoints, to resume from"),
        (
            "model.safetensors",
            "the trained weights (written when the run ends)",
        ),
        ("summary.txt", "how the run ended (written when it ends)"),
    ];
    let mut html = String::from("<h2>Files</h2>\n<ul class=\"files\">\n");
    for (file, what) in FILES {
        let ends = file.starts_with("model") || file.starts_with("summary");
        if ends || run.join(file).exists() {
            let _ = writeln!(html, "<li><a href=\"{file}\">{file}</a>: {what}</li>");
        }
    }
    html + "</ul>\n"
}

/// Cards: the last epoch's figures, the best validation top-1, speed, step time and memory.
fn headline(history: &[EpochSummary]) -> String {
    let Some(last) = history.last() else {
        return "<p>No epoch has ended yet.</p>\n".to_string();
    };
    let percent =
        |v: Option<f64>| v.map_or("&ndash;".to_string(), |v| format!("{:.2}%", v * 100.0));
    let best = history
        .iter()
        .filter_map(|s| s.val_top1.map(|t| (s.epoch, t)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let iterations = last.iteration
        - history
            .iter()
            .rev()
            .nth(1)
            .map_or(0, |before| before.iteration);
    let mut cards = vec![
        ("validation top-1", percent(last.val_top1)),
        ("validation top-5", percent(last.val_top5)),
        (
            "validation loss",
            last.val_loss
                .map_or("&ndash;".to_string(), |v| format!("{v:.4}")),
        ),
        ("train loss", format!("{:.4}", last.train_loss)),
        ("train accuracy", percent(Some(last.train_accuracy))),
    ];
    if let Some(f1) = last.val_macro_f1 {
        cards.push(("macro F1", format!("{f1:.4}")));
    }
    if let Some(top1) = last.ema_val_top1 {
        cards.push(("average's top-1", percent(Some(top1))));
    }
    if let Some((epoch, top1)) = best {
        cards.push((
            "best top-1",
            format!("{} (epoch {epoch})", percent(Some(top1))),
        ));
    }
    cards.push(("images/s", format!("{:.0}", last.images_per_s)));
    if iterations > 0 {
        cards.push((
            "time per step",
            format!("{:.1} ms", last.seconds / iterations as f64 * 1000.0),
        ));
    }
    cards.push(("epoch time", format!("{:.1} s", last.seconds)));
    if let Some(bytes) = last.peak_memory_bytes {
        cards.push((
            "peak memory",
            format!("{:.2} GiB", bytes as f64 / f64::from(1 << 30)),
        ));
    }
    let mut html = format!("<h2>Epoch {}</h2>\n<div class=\"cards\">\n", last.epoch);
    for (name, value) in cards {
        let _ = writeln!(html, "<div class=\"card\">{name}<b>{value}</b></div>");
    }
    html + "</div>\n"
}

fn per_class_table(confusion: &Confusion, names: &[String]) -> String {
    let mut html = String::from(
        "<div>\n<table>\n<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>\n",
    );
    for (name, r) in names.iter().zip(confusion.per_class()) {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td><td>{}</td></tr>",
            escape(name),
            r.precision,
            r.recall,
            r.f1,
            r.support
        );
    }
    html += "</table>\n";
    let confused = confusion.most_confused(5);
    if !confused.is_empty() {
        html += "<p>Most confused (true &rarr; predicted): ";
        let pairs: Vec<String> = confused
            .iter()
            .map(|&(l, p, n)| format!("{} &rarr; {} ({n})", escape(&names[l]), escape(&names[p])))
            .collect();
        html += &pairs.join(", ");
        html += "</p>\n";
    }
    html + "</div>\n"
}

fn epoch_table(history: &[EpochSummary]) -> String {
    let mut html = String::from(
        "<h2>Epochs</h2>\n<table>\n<tr><th>epoch</th><th>lr</th><th>train loss</th><th>train acc.</th><th>val. loss</th><th>top-1</th><th>top-5</th><th>seconds</th><th>images/s</th></tr>\n",
    );
    let number =
        |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    for s in history {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{:.3e}</td><td>{:.4}</td><td>{:.4}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.0}</td></tr>",
            s.epoch,
            s.lr,
            s.train_loss,
            s.train_accuracy,
            number(s.val_loss, 4),
            number(s.val_top1, 4),
            number(s.val_top5, 4),
            s.seconds,
            s.images_per_s
        );
    }
    html + "</table>\n"
}
