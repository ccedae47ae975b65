//! `kiln shard`: a config's data set written as WebDataset tar shards (`kiln_data::shards`).

use std::path::PathBuf;

use anyhow::Context;
use bytesize::ByteSize;
use clap::Args;
use kiln_config::TrainConfig;
use kiln_data::Dataset;

#[derive(Args)]
pub struct ShardArgs {
    /// The config whose data source (training and validation parts) to write.
    #[arg(long)]
    config: PathBuf,
    /// Override a config key, for example --set data.source.root='"/data"' (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// The folder to write train-NNNNNN.tar, val-NNNNNN.tar and manifest.json into.
    #[arg(long)]
    out: PathBuf,
    /// The most one shard may hold (WebDataset's usual: a few hundred MB to a few GB).
    #[arg(long, default_value = "1GB")]
    size: String,
}

pub fn run(args: ShardArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.overrides)?;
    let size: ByteSize = args.size.parse().map_err(|e| {
        anyhow::anyhow!(
            "--size {:?} is not a size such as 1GB or 500MiB: {e}",
            args.size
        )
    })?;
    let data = &config.data;
    let splits = data.source.open(config.seed, data.image_limits())?;
    let mut parts: Vec<(&str, &dyn Dataset)> = vec![("train", splits.train.as_ref())];
    if let Some(val) = &splits.val {
        parts.push(("val", val.as_ref()));
    }
    let manifest = kiln_data::shards::write(&parts, &args.out, size.as_u64())
        .with_context(|| format!("writing shards into {}", args.out.display()))?;
    for (name, split) in &manifest.splits {
        println!(
            "{name}: {} images in {} shards",
            split.samples,
            split.shards.len()
        );
    }
    let pattern = |name: &str| {
        manifest.splits.get(name).map(|s| {
            let path = args.out.join(&s.pattern);
            format!("{:?}", path.display().to_string())
        })
    };
    let val = pattern("val").map_or(String::new(), |v| format!(", val = {v}"));
    println!(
        "wrote {}; train from them with\nsource = {{ kind = \"shards\", train = {}{val} }}",
        args.out.join(kiln_data::shards::MANIFEST).display(),
        pattern("train").unwrap_or_default()
    );
    Ok(())
}
