//! `kiln summary`: a ResNet stage by stage, counted from its config (`kiln_models::Summary`).

use clap::Args;
use kiln_models::{ResNetConfig, Stem, Summary};

#[derive(Args)]
pub struct SummaryArgs {
    /// resnet18 ... resnet152, resnext50_32x4d, resnext101_32x8d, resnext101_64x4d,
    /// wide_resnet50_2, wide_resnet101_2, resnet18d ... resnet200d.
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// The side of the square input.
    #[arg(long, default_value_t = 224)]
    image_size: usize,
    /// `imagenet` (the network's own), `cifar` or `deep`.
    #[arg(long, default_value = "imagenet", value_parser = crate::parse_stem)]
    stem: Stem,
    /// Channels of the first stage (torchvision's 64).
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Classes of the classifier.
    #[arg(long, default_value_t = 1000)]
    num_classes: usize,
    /// Print the summary as JSON, for scripts.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SummaryArgs) -> anyhow::Result<()> {
    if args.image_size == 0 || args.width == 0 || args.num_classes == 0 {
        anyhow::bail!("--image-size, --width and --num-classes must be at least 1");
    }
    let config = ResNetConfig::from_name(&args.model)?
        .with_width(args.width)
        .with_num_classes(args.num_classes)
        .with_input_stem(args.stem);
    let summary = config.summary(args.image_size, args.image_size)?;
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&summary)?),
        false => print!("{}", table(&summary)),
    }
    Ok(())
}

/// The summary as a table: a row per stage, then the totals and the training memory per image.
fn table(summary: &Summary) -> String {
    let [c, h, w] = summary.input;
    let mut text = format!("{} on {c}x{h}x{w} inputs\n", summary.model);
    text += &format!(
        "{:<8} {:>16} {:>14} {:>14} {:>18}\n",
        "stage", "output", "parameters", "mult-adds", "activations/image"
    );
    for stage in &summary.stages {
        let [c, h, w] = stage.output;
        text += &format!(
            "{:<8} {:>16} {:>14} {:>14} {:>18}\n",
            stage.name,
            format!("{c}x{h}x{w}"),
            thousands(stage.parameters),
            thousands(stage.mult_adds),
            thousands(stage.activations_per_image),
        );
    }
    text += &format!(
        "{:<8} {:>16} {:>14} {:>14} {:>18}\n",
        "total",
        "",
        thousands(summary.parameters),
        thousands(summary.mult_adds),
        thousands(summary.activations_per_image),
    );
    let mib = |elements: u64| elements as f64 * 4.0 / (1 << 20) as f64;
    text += &format!(
        "{:.2} G multiply-adds per image; batch-norm buffers {}; parameters {:.1} MiB in f32; \
         training keeps about {:.1} MiB of activations per image in f32\n",
        summary.mult_adds as f64 / 1e9,
        thousands(summary.buffers),
        mib(summary.parameters),
        mib(summary.activations_per_image),
    );
    text
}

/// `n` with a comma every three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
