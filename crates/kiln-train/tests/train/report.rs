//! The run's page and the runs' comparison as a reader sees them: rendered by a headless
//! Chromium (where one is installed), every image decoded, the confusion matrix's counts those
//! of `confusion.csv`, and the comparison naming the one key two runs differ in.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use base64::Engine as _;
use kiln_records::RunDir;
use kiln_records::report::runs_page;
use kiln_train::Silent;

use crate::common::{self, take_turn, train_on_cpu};

const CONFIG: &str = r#"
name = "pages"
seed = 5
epochs = 2
batch_size = 8
[model]
name = "resnet18"
stem = "cifar"
width = 4
[data]
source = { kind = "synthetic", train_size = 32, val_size = 24, image_size = 8, num_classes = 4 }
workers = 1
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[logging]
print_every = 2
"#;

/// Two tiny runs that differ in the learning rate alone.
#[test]
fn the_pages_show_a_reader_the_plots_counts_mistakes_and_differences() {
    let _turn = take_turn();
    let runs = tempfile::tempdir().unwrap();
    let never = AtomicBool::new(false);
    let train = |lr: &str| {
        let config = common::parse(CONFIG, runs.path(), &[&format!("optimizer.lr={lr}")]);
        let run = RunDir::create(runs.path(), &config).unwrap();
        train_on_cpu(&config, &run, false, 1, &mut Silent, &never).unwrap();
        run
    };
    let (fast, slow) = (train("0.05"), train("0.01"));

    // Every step's loss, 4 steps an epoch.
    let steps = std::fs::read_to_string(fast.path.join("iterations.csv")).unwrap();
    let lines: Vec<&str> = steps.lines().collect();
    assert_eq!(lines.len(), 1 + 8, "{steps}");
    assert!(lines[4].starts_with("4,1.0000,") && lines[8].starts_with("8,2.0000,"));

    let page = fast.path.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    for plot in [">Loss</text>", ">Accuracy</text>", ">Learning rate</text>"] {
        assert!(html.contains(plot), "{plot}");
    }
    assert!(html.contains(">train, smoothed</text>") && html.contains("Most confident mistakes"));
    let images = decoded_images(&html);
    assert_eq!(images, shown_mistakes(&fast.path, &html));
    let counts = confusion_csv(&fast.path);
    assert_eq!(cell_counts(&html), counts);
    assert!(html.contains("<a href=\"iterations.csv\">") && html.contains("<a href=\"best/\">"));
    assert!(html.len() < 1 << 20, "{} bytes", html.len());

    let compared = runs.path().join("compare.html");
    let text = runs_page(&[fast.path.clone(), slow.path.clone()], runs.path()).unwrap();
    std::fs::write(&compared, &text).unwrap();
    assert_eq!(differing_keys(&text), ["optimizer.lr"]);
    assert!(text.contains("<td><code>0.05</code></td><td><code>0.01</code></td>"));

    let Some(dom) = common::rendered_dom(&page) else {
        println!("no Chromium here: the pages were not rendered");
        return;
    };
    assert!(
        dom.contains(&format!("data-images=\"{images}/{images}\"")),
        "images did not load"
    );
    assert_eq!(cell_counts(&dom), counts);
    let dom = common::rendered_dom(&compared).unwrap();
    assert_eq!(differing_keys(&dom), ["optimizer.lr"]);
    assert!(dom.contains(&fast.path.file_name().unwrap().to_string_lossy().to_string()));
}

/// Decodes every image of the page (PNG data URIs) and returns how many there are.
fn decoded_images(html: &str) -> usize {
    let mut count = 0;
    for source in html.split("<img src=\"").skip(1) {
        let uri = &source[..source.find('"').unwrap()];
        let data = uri
            .strip_prefix("data:image/png;base64,")
            .expect("a PNG data URI");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let image = image::load_from_memory(&bytes).unwrap();
        assert!(image.width() > 0 && image.width() <= 96 && image.height() <= 96);
        count += 1;
    }
    count
}

/// The images the page should show: the rows of `mistakes.csv`, and of `best/mistakes.csv`
/// where the page shows the best epoch apart.
fn shown_mistakes(run: &Path, html: &str) -> usize {
    let rows = |file: &str| {
        let text = std::fs::read_to_string(run.join(file)).unwrap();
        text.lines().count() - 1
    };
    let best = match html.contains(", the best</h3>") {
        true => rows("best/mistakes.csv"),
        false => 0,
    };
    rows("mistakes.csv") + best
}

/// `confusion.csv`'s counts, row by row.
fn confusion_csv(run: &Path) -> Vec<Vec<u64>> {
    let text = std::fs::read_to_string(run.join("confusion.csv")).unwrap();
    (text.lines().skip(1))
        .map(|line| {
            line.split(',')
                .skip(1)
                .map(|n| n.parse().unwrap())
                .collect()
        })
        .collect()
}

/// The counts written in the confusion matrix's cells, row by row.
fn cell_counts(html: &str) -> Vec<Vec<u64>> {
    let mut rows: Vec<Vec<u64>> = Vec::new();
    for cell in html.split("<g class=\"cell\" ").skip(1) {
        let attribute = |name: &str| -> usize {
            let value = cell.split(&format!("{name}=\"")).nth(1).unwrap();
            value[..value.find('"').unwrap()].parse().unwrap()
        };
        let (row, column) = (attribute("data-true"), attribute("data-predicted"));
        let inside = &cell[..cell.find("</g>").unwrap()];
        let text = inside.rsplit("</text>").nth(1).unwrap();
        let count: u64 = text[text.rfind('>').unwrap() + 1..].parse().unwrap();
        if row == rows.len() {
            rows.push(Vec::new());
        }
        assert_eq!((rows.len() - 1, rows[row].len()), (row, column));
        rows[row].push(count);
    }
    rows
}

/// The keys of the comparison's table of differences.
fn differing_keys(html: &str) -> Vec<String> {
    let table = html.split("<table class=\"differences\">").nth(1).unwrap();
    let table = &table[..table.find("</table>").unwrap()];
    (table.split("<tr><td><code>").skip(1))
        .map(|row| row[..row.find('<').unwrap()].to_string())
        .collect()
}
