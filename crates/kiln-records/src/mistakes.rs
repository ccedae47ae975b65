//! The validation images a model gets most confidently wrong, and the right ones it is least
//! sure of, as fastai's `plot_top_losses` shows them: small thumbnails of the images as the
//! loader decodes them (before normalization), with the true and predicted class and the
//! probability. Chosen on the host from every image's prediction (`Evaluation::predictions`),
//! recorded as `mistakes.csv`, and shown in `report.html` and `kiln eval --mistakes`' page.

use std::fmt::Write as _;
use std::io::Cursor;

use base64::Engine as _;
use image::RgbImage;
use image::imageops::FilterType;
use kiln_data::Loader;

use crate::evaluation::{Evaluation, ImagePrediction};
use crate::plot::escape;

/// Images of each kind a run's page shows.
pub const SHOWN: usize = 24;

/// A thumbnail's longest side at most: a page of a hundred of them stays a few MB whatever the
/// images' size.
pub const THUMBNAIL: u32 = 96;

/// The images to show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mistakes {
    /// Wrong predictions, the most confident first.
    pub wrong: Vec<ImagePrediction>,
    /// Right predictions, the least confident first.
    pub unsure: Vec<ImagePrediction>,
}

/// The `count` most confident wrong predictions and the `count` least confident right ones
/// (ties in index order).
pub fn select(predictions: &[ImagePrediction], count: usize) -> Mistakes {
    let pick = |right: bool, most_confident_first: bool| {
        let mut chosen: Vec<ImagePrediction> = (predictions.iter())
            .filter(|p| (p.predicted == p.label) == right)
            .copied()
            .collect();
        chosen.sort_by(|a, b| {
            let order = a.probability.total_cmp(&b.probability);
            let order = if most_confident_first {
                order.reverse()
            } else {
                order
            };
            order.then(a.index.cmp(&b.index))
        });
        chosen.truncate(count);
        chosen
    };
    Mistakes {
        wrong: pick(false, true),
        unsure: pick(true, false),
    }
}

/// `mistakes.csv`: kind (`wrong`, most confident first, then `unsure`, the right ones least
/// confident first), the image's index in the validation set, the true and predicted class
/// numbers, the probability, the class names, and the image (its file where it has one).
pub fn csv(mistakes: &Mistakes, names: &[String], loader: &Loader) -> String {
    let mut text =
        String::from("kind,index,label,predicted,probability,true_class,predicted_class,image\n");
    let rows = (mistakes.wrong.iter().map(|p| ("wrong", p)))
        .chain(mistakes.unsure.iter().map(|p| ("unsure", p)));
    for (kind, p) in rows {
        let _ = writeln!(
            text,
            "{kind},{},{},{},{},{},{},{}",
            p.index,
            p.label,
            p.predicted,
            p.probability,
            csv_field(class_name(names, p.label)),
            csv_field(class_name(names, p.predicted)),
            csv_field(&loader.dataset().describe(p.index))
        );
    }
    text
}

/// The images `csv` wrote (its first five fields; the names follow them).
pub fn parse_csv(text: &str) -> Mistakes {
    let mut mistakes = Mistakes::default();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.splitn(6, ',').collect();
        let parsed = (fields.len() == 6).then(|| {
            Some(ImagePrediction {
                index: fields[1].parse().ok()?,
                label: fields[2].parse().ok()?,
                predicted: fields[3].parse().ok()?,
                probability: fields[4].parse().ok()?,
            })
        });
        match (fields[0], parsed.flatten()) {
            ("wrong", Some(p)) => mistakes.wrong.push(p),
            ("unsure", Some(p)) => mistakes.unsure.push(p),
            _ => {}
        }
    }
    mistakes
}

fn csv_field(text: &str) -> String {
    match text.contains([',', '"', '\n']) {
        true => format!("\"{}\"", text.replace('"', "\"\"")),
        false => text.to_string(),
    }
}

fn class_name(names: &[String], class: usize) -> &str {
    names.get(class).map_or("?", String::as_str)
}

/// Both galleries of one evaluation, under `heading`.
pub fn section(heading: &str, mistakes: &Mistakes, names: &[String], loader: &Loader) -> String {
    let mut html = format!("<h3>{}</h3>\n", escape(heading));
    html += &gallery(
        "Most confident mistakes",
        "none: every image is right",
        &mistakes.wrong,
        names,
        loader,
    );
    html += &gallery(
        "Least confident right answers",
        "none: every image is wrong",
        &mistakes.unsure,
        names,
        loader,
    );
    html
}

/// A row of thumbnails, each with its true and predicted class and the probability.
fn gallery(
    title: &str,
    empty: &str,
    images: &[ImagePrediction],
    names: &[String],
    loader: &Loader,
) -> String {
    let mut html = format!("<h4>{title}</h4>\n");
    if images.is_empty() {
        return html + &format!("<p class=\"where\">{empty}</p>\n");
    }
    html += "<div class=\"gallery\">\n";
    for p in images {
        let picture = match loader.image(0, p.index) {
            Ok(image) => thumbnail_img(&image, &format!("validation image {}", p.index)),
            Err(e) => format!(
                "<span class=\"unreadable\">{}</span>",
                escape(&e.to_string())
            ),
        };
        let verdict = match p.predicted == p.label {
            true => "right",
            false => "wrong",
        };
        let _ = writeln!(
            html,
            "<figure class=\"thumb\" title=\"{}\">{picture}<figcaption>true <b>{}</b><br>predicted <b class=\"{verdict}\">{}</b><br>{:.1}%</figcaption></figure>",
            escape(&loader.dataset().describe(p.index)),
            escape(class_name(names, p.label)),
            escape(class_name(names, p.predicted)),
            p.probability * 100.0
        );
    }
    html + "</div>\n"
}

/// An `<img>` of `image` as a PNG data URI, shrunk to at most [`THUMBNAIL`] px a side, and
/// shown enlarged (with sharp pixels) when it is tiny.
pub fn thumbnail_img(image: &RgbImage, alt: &str) -> String {
    let image = shrink(image, THUMBNAIL);
    let (width, height) = image.dimensions();
    let scale = (THUMBNAIL / width.max(height).max(1)).max(1);
    let class = if scale > 1 { " class=\"pixels\"" } else { "" };
    format!(
        "<img src=\"{}\" alt=\"{}\" width=\"{}\" height=\"{}\"{class}>",
        png_data_uri(&image),
        escape(alt),
        width * scale,
        height * scale
    )
}

/// `image` with its longest side at most `max`, its shape kept.
fn shrink(image: &RgbImage, max: u32) -> RgbImage {
    let (width, height) = image.dimensions();
    if width.max(height) <= max {
        return image.clone();
    }
    let scale = max as f64 / width.max(height) as f64;
    let size = |side: u32| ((side as f64 * scale).round() as u32).max(1);
    image::imageops::resize(image, size(width), size(height), FilterType::Triangle)
}

/// `image` as a `data:image/png;base64,...` URI.
pub fn png_data_uri(image: &RgbImage) -> String {
    let mut png = Vec::new();
    image
        .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .expect("PNG encoding into memory does not fail");
    let encoded = base64::engine::general_purpose::STANDARD.encode(&png);
    format!("data:image/png;base64,{encoded}")
}

/// `kiln eval --mistakes`' page: the evaluation's figures and its `count` most confident
/// mistakes and least confident right answers, one self-contained file.
pub fn page(title: &str, evaluation: &Evaluation, loader: &Loader, count: usize) -> String {
    let mistakes = select(&evaluation.predictions, count);
    let mut html = crate::run_report::page_head(title);
    let _ = writeln!(
        html,
        "<p class=\"where\">{} validation images: top-1 {:.2}%, top-5 {:.2}%, loss {:.4}; {} wrong</p>",
        evaluation.images,
        evaluation.top1 * 100.0,
        evaluation.top5 * 100.0,
        evaluation.loss,
        (evaluation.predictions.iter())
            .filter(|p| p.predicted != p.label)
            .count()
    );
    html += &section("Mistakes", &mistakes, &evaluation.class_names, loader);
    html + "</body>\n</html>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prediction(
        index: usize,
        label: usize,
        predicted: usize,
        probability: f32,
    ) -> ImagePrediction {
        ImagePrediction {
            index,
            label,
            predicted,
            probability,
        }
    }

    #[test]
    fn the_most_confident_mistakes_and_least_confident_right_answers_are_chosen() {
        let predictions = [
            prediction(0, 0, 0, 0.99),
            prediction(1, 0, 1, 0.60),
            prediction(2, 1, 1, 0.40),
            prediction(3, 1, 0, 0.95),
            prediction(4, 2, 2, 0.55),
            prediction(5, 2, 0, 0.60),
            prediction(6, 2, 2, 0.40),
        ];
        let chosen = select(&predictions, 2);
        let indices = |p: &[ImagePrediction]| p.iter().map(|p| p.index).collect::<Vec<_>>();
        assert_eq!(indices(&chosen.wrong), [3, 1]);
        assert_eq!(indices(&chosen.unsure), [2, 6]);
        assert_eq!(select(&predictions, 10).wrong.len(), 3);
        assert_eq!(select(&predictions[..1], 5).wrong, []);
    }

    #[test]
    fn thumbnails_are_small_pngs_that_keep_the_shape() {
        let photo = RgbImage::from_fn(400, 300, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let small = shrink(&photo, THUMBNAIL);
        assert_eq!(small.dimensions(), (96, 72));
        let tiny = RgbImage::new(8, 8);
        let img = thumbnail_img(&tiny, "a <digit>");
        assert!(
            img.contains("width=\"96\" height=\"96\" class=\"pixels\""),
            "{img}"
        );
        assert!(img.contains("alt=\"a &lt;digit&gt;\""));
        let uri = png_data_uri(&small);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(uri.strip_prefix("data:image/png;base64,").unwrap())
            .unwrap();
        let decoded = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(decoded, small);
    }

    #[test]
    fn the_csv_reads_back_and_the_galleries_show_each_image() {
        let dataset = std::sync::Arc::new(kiln_data::Synthetic::new(10, 4, 3, 3, 0).unwrap());
        let pipeline = kiln_data::Pipeline::new(&[]).unwrap();
        let loader = Loader::new(dataset, pipeline, kiln_data::LoaderConfig::new(4, 0)).unwrap();
        let mistakes = Mistakes {
            wrong: vec![prediction(3, 1, 0, 0.95)],
            unsure: vec![prediction(2, 1, 1, 0.25), prediction(7, 2, 2, 0.5)],
        };
        let names: Vec<String> = ["zero", "one, b", "<two>"].map(String::from).to_vec();
        let text = csv(&mistakes, &names, &loader);
        assert!(
            text.contains("\nwrong,3,1,0,0.95,\"one, b\",zero,image 3\n"),
            "{text}"
        );
        assert_eq!(parse_csv(&text), mistakes);

        let html = section("Epoch 2", &mistakes, &names, &loader);
        assert_eq!(html.matches("<img src=\"data:image/png;base64,").count(), 3);
        assert!(
            html.contains("predicted <b class=\"wrong\">zero</b><br>95.0%"),
            "{html}"
        );
        assert!(html.contains("&lt;two&gt;"));
    }
}
