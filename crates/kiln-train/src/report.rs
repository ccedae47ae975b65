//! `report.html`: a run on one self-contained page (no script, no network): how it ended, its
//! best epoch, timing and device, the plots (the run's SVG files inlined), the per-class table,
//! every epoch, and the config. Rewritten at every epoch end.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::TrainConfig;
use crate::confusion::Confusion;
use crate::run_dir::EpochSummary;

/// What the page shows beyond the config and the history.
pub struct ReportInputs<'a> {
    pub run: &'a Path,
    pub history: &'a [EpochSummary],
    /// The devices the run trains on, as people read them.
    pub device: &'a str,
    /// The last validated epoch's confusion matrix and class names.
    pub per_class: Option<(&'a Confusion, &'a [String])>,
}

/// The page's HTML.
pub fn report_html(config: &TrainConfig, inputs: &ReportInputs) -> String {
    let history = inputs.history;
    let mut page = String::new();
    let title = format!("kiln run {}", escape(&config.name));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    );
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
    page += "<h2>Plots</h2>\n<div class=\"plots\">\n";
    for file in ["loss.svg", "accuracy.svg", "lr.svg", "confusion.svg"] {
        if let Some(svg) = inline_svg(&inputs.run.join(file)) {
            let _ = writeln!(
                page,
                "<figure>{svg}<figcaption>{file}</figcaption></figure>"
            );
        }
    }
    page += "</div>\n";
    if let Some((confusion, names)) = inputs.per_class {
        page += &per_class_table(confusion, names);
    }
    page += &epoch_table(history);
    let _ = write!(
        page,
        "<h2>Config</h2>\n<pre>{}</pre>\n</body>\n</html>\n",
        escape(&config.to_toml())
    );
    page
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}\
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}\
.where{color:#555}table{border-collapse:collapse;margin:.5em 0}\
td,th{padding:.25em .7em;border-bottom:1px solid #e4e4e4;text-align:right}\
th:first-child,td:first-child{text-align:left}.cards{display:flex;gap:1em;flex-wrap:wrap}\
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em}\
.card b{display:block;font-size:1.4em}.plots{display:flex;flex-wrap:wrap;gap:1em}\
figure{margin:0}figure svg{max-width:100%;height:auto}figcaption{color:#777;font-size:.8em}\
pre{background:#f6f6f6;padding:1em;overflow:auto}";

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
        "<h2>Per class (last epoch)</h2>\n<table>\n<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>\n",
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
    html
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

/// An SVG file's markup, without its XML declaration, to inline; `None` if it is not there.
fn inline_svg(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let start = text.find("<svg")?;
    Some(text[start..].to_string())
}

/// Text as HTML shows it literally.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
