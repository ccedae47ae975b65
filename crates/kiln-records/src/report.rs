//! `kiln report runs/a runs/b ...`: several runs on one page, as TensorBoard's and Weights &
//! Biases' run comparisons show them: their curves overlaid, their final and best figures side
//! by side, and the config keys they differ in, with each run's value. Read from the run
//! folders alone (`metrics.jsonl`, `iterations.csv`, `config.toml`), so any finished or running
//! run can be compared, on any machine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use crate::epoch::EpochSummary;
use crate::figures::{per_epoch, smoothed};
use crate::iterations::{self, StepLoss};
use crate::plot::{Chart, PALETTE, Series, Style, XAxis, YFormat, escape};
use crate::run_dir::RunDir;
use crate::run_report::page_head;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{} is not a kiln run folder (it has no config.toml)", .0.display())]
    NotARun(PathBuf),
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    #[error("give at least one run folder")]
    NoRuns,
}

/// What the page reads of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub path: PathBuf,
    /// How the page names the run: its folder's name.
    pub name: String,
    pub history: Vec<EpochSummary>,
    pub steps: Vec<StepLoss>,
    /// Its config as `key.path = value` (values in TOML, as `--set` takes them).
    pub config: BTreeMap<String, String>,
}

impl RunRecord {
    pub fn read(path: &Path) -> Result<Self, ReportError> {
        let run = RunDir::open(path);
        let text = std::fs::read_to_string(run.config_path())
            .map_err(|_| ReportError::NotARun(path.to_path_buf()))?;
        let config: toml::Value = toml::from_str(&text).map_err(|e| ReportError::Config {
            path: run.config_path(),
            reason: e.to_string(),
        })?;
        let name = (path.file_name()).map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Ok(Self {
            path: path.to_path_buf(),
            name,
            history: run.history(),
            steps: iterations::read(&path.join("iterations.csv")),
            config: flatten(&config),
        })
    }
}

/// A TOML document's values by dotted key (`optimizer.lr`); arrays stay whole.
pub fn flatten(value: &toml::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    let key = match prefix {
                        "" => key.clone(),
                        _ => format!("{prefix}.{key}"),
                    };
                    walk(&key, value, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

/// Keys that say where a run was written, not how it trained: runs kept in two folders differ
/// there without differing at all.
const WHERE_NOT_HOW: [&str; 1] = ["logging.runs_dir"];

/// The keys whose values are not the same in every config, with each config's value (`None`
/// where it lacks the key), in key order; not [`WHERE_NOT_HOW`].
pub fn differences(configs: &[&BTreeMap<String, String>]) -> Vec<(String, Vec<Option<String>>)> {
    let keys: BTreeSet<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    keys.into_iter()
        .filter(|key| !WHERE_NOT_HOW.contains(&key.as_str()))
        .map(|key| {
            let values: Vec<Option<String>> = configs.iter().map(|c| c.get(key).cloned()).collect();
            (key.clone(), values)
        })
        .filter(|(_, values)| values.iter().any(|v| v != &values[0]))
        .collect()
}

/// The comparison page of the runs in `runs`, to be written into folder `out_dir` (its links
/// to each run's own page are relative to it).
pub fn runs_page(runs: &[PathBuf], out_dir: &Path) -> Result<String, ReportError> {
    if runs.is_empty() {
        return Err(ReportError::NoRuns);
    }
    let runs: Vec<RunRecord> = (runs.iter())
        .map(|path| RunRecord::read(path))
        .collect::<Result<_, _>>()?;
    let mut page = page_head(&format!("kiln: {} runs compared", runs.len()));
    page += "<p class=\"where\">Each run in one colour throughout; its name links to its own page.</p>\n";
    page += &results_table(&runs, out_dir);
    page += &differences_table(&runs);
    page += "<h2>Curves</h2>\n<div class=\"plots\">\n";
    for chart in charts(&runs) {
        let _ = writeln!(page, "<figure>{}</figure>", chart.svg());
    }
    page += "</div>\n<p class=\"where\">Loss: solid, the training loss of every step smoothed \
        as TensorBoard does; dashed with dots, the validation loss of each epoch.</p>\n</body>\n</html>\n";
    Ok(page)
}

/// The run's colour: the palette in turn.
fn colour(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

fn results_table(runs: &[RunRecord], out_dir: &Path) -> String {
    let mut html = String::from(
        "<h2>Results</h2>\n<table>\n<tr><th>run</th><th>epochs</th><th>train loss</th><th>val. loss</th><th>top-1</th><th>top-5</th><th>best top-1</th><th>time</th><th>images/s</th></tr>\n",
    );
    let percent = |v: Option<f64>| v.map_or("&ndash;".into(), |v| format!("{:.2}%", v * 100.0));
    for (i, run) in runs.iter().enumerate() {
        let link = relative(out_dir, &run.path.join("report.html"));
        let _ = write!(
            html,
            "<tr><td><span style=\"color:{}\">&#9632;</span> <a href=\"{}\">{}</a></td>",
            colour(i),
            escape(&link),
            escape(&run.name)
        );
        let Some(last) = run.history.last() else {
            html += "<td colspan=\"8\">no epoch has ended yet</td></tr>\n";
            continue;
        };
        let best = (run.history.iter())
            .filter_map(|s| s.val_top1.map(|t| (s.epoch, t)))
            .fold(None, |best: Option<(usize, f64)>, (e, t)| match best {
                Some((_, b)) if b >= t => best,
                _ => Some((e, t)),
            });
        let seconds: f64 = run.history.iter().map(|s| s.seconds).sum();
        let _ = writeln!(
            html,
            "<td>{}</td><td>{:.4}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{seconds:.0} s</td><td>{:.0}</td></tr>",
            last.epoch,
            last.train_loss,
            last.val_loss
                .map_or("&ndash;".into(), |v| format!("{v:.4}")),
            percent(last.val_top1),
            percent(last.val_top5),
            best.map_or("&ndash;".into(), |(e, t)| format!(
                "{} (epoch {e})",
                percent(Some(t))
            )),
            last.images_per_s
        );
    }
    html + "</table>\n"
}

fn differences_table(runs: &[RunRecord]) -> String {
    let configs: Vec<&BTreeMap<String, String>> = runs.iter().map(|r| &r.config).collect();
    let differing = differences(&configs);
    let mut html = String::from("<h2>Config differences</h2>\n");
    if differing.is_empty() {
        return html + "<p>The runs' configs are the same.</p>\n";
    }
    html += "<table class=\"differences\">\n<tr><th>key</th>";
    for run in runs {
        let _ = write!(html, "<th>{}</th>", escape(&run.name));
    }
    html += "</tr>\n";
    for (key, values) in differing {
        let _ = write!(html, "<tr><td><code>{}</code></td>", escape(&key));
        for value in values {
            let value = value.map_or("&ndash;".into(), |v| format!("<code>{}</code>", escape(&v)));
            let _ = write!(html, "<td>{value}</td>");
        }
        html += "</tr>\n";
    }
    html + "</table>\n"
}

/// Loss (training smoothed, validation per epoch), validation top-1 and the learning rate, a
/// series per run.
fn charts(runs: &[RunRecord]) -> Vec<Chart<'static>> {
    let (mut loss, mut top1, mut lr) = (Vec::new(), Vec::new(), Vec::new());
    for (i, run) in runs.iter().enumerate() {
        let colour = colour(i);
        let train = match run.steps.is_empty() {
            true => per_epoch(&run.history, |s| Some(s.train_loss)),
            false => smoothed(&run.steps),
        };
        loss.push(Series {
            name: run.name.clone(),
            points: train,
            style: Style::line(colour),
        });
        loss.push(Series {
            name: String::new(),
            points: per_epoch(&run.history, |s| s.val_loss),
            style: Style::dotted(colour).dashed(),
        });
        top1.push(Series {
            name: run.name.clone(),
            points: per_epoch(&run.history, |s| s.val_top1),
            style: Style::dotted(colour),
        });
        lr.push(Series {
            name: run.name.clone(),
            points: run.steps.iter().map(|s| (s.epoch, s.lr)).collect(),
            style: Style::line(colour),
        });
    }
    let chart = |title, y_label, y_format, series: Vec<Series>| Chart {
        title,
        x_axis: XAxis::Epochs,
        y_label,
        y_format,
        series: series
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect(),
    };
    vec![
        chart("Loss", "cross-entropy loss", YFormat::Plain, loss),
        chart("Validation top-1", "accuracy", YFormat::Percent, top1),
        chart("Learning rate", "learning rate", YFormat::Scientific, lr),
    ]
    .into_iter()
    .filter(|c| !c.series.is_empty())
    .collect()
}

/// `target` as a link from a page in folder `from`: relative where both resolve on this
/// machine, so that the page and the runs can move together.
fn relative(from: &Path, target: &Path) -> String {
    let (Ok(from), Some(Ok(parent))) = (
        std::fs::canonicalize(from),
        target.parent().map(std::fs::canonicalize),
    ) else {
        return target.display().to_string();
    };
    let target = parent.join(target.file_name().unwrap_or_default());
    let (from, to): (Vec<Component>, Vec<Component>) =
        (from.components().collect(), target.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut link: Vec<String> = vec!["..".to_string(); from.len() - common];
    link.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    link.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_differ_in_the_keys_whose_values_differ() {
        let a: toml::Value = toml::from_str(
            "name = 'q'\n[optimizer]\nname = 'adam'\nlr = 0.004\n[data]\nsource = { kind = 'digits' }\ntransforms = [1, 2]\n",
        )
        .unwrap();
        let b: toml::Value = toml::from_str(
            "name = 'q'\n[optimizer]\nname = 'adam'\nlr = 0.001\nbetas = [0.9, 0.99]\n[data]\nsource = { kind = 'digits' }\ntransforms = [1, 2]\n[logging]\nruns_dir = 'elsewhere'\n",
        )
        .unwrap();
        let (a, b) = (flatten(&a), flatten(&b));
        assert_eq!(a["data.source.kind"], "\"digits\"");
        assert_eq!(a["data.transforms"], "[1, 2]");
        assert_eq!(
            differences(&[&a, &b]),
            [
                (
                    "optimizer.betas".to_string(),
                    vec![None, Some("[0.9, 0.99]".to_string())]
                ),
                (
                    "optimizer.lr".to_string(),
                    vec![Some("0.004".into()), Some("0.001".into())]
                ),
            ]
        );
        assert!(differences(&[&a, &a]).is_empty());
    }

    #[test]
    fn links_to_runs_are_relative_to_the_page() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("runs/a");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::create_dir_all(dir.path().join("pages")).unwrap();
        assert_eq!(
            relative(dir.path(), &run.join("report.html")),
            "runs/a/report.html"
        );
        assert_eq!(
            relative(&dir.path().join("pages"), &run.join("report.html")),
            "../runs/a/report.html"
        );
        let missing = Path::new("/nowhere/at/all/report.html");
        assert_eq!(relative(dir.path(), missing), "/nowhere/at/all/report.html");
        assert!(matches!(
            runs_page(&[dir.path().join("pages")], dir.path()),
            Err(ReportError::NotARun(_))
        ));
    }
}
