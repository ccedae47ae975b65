//! `kiln report`: several runs compared on one page.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct ReportArgs {
    /// The run folders to compare.
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,

    /// The page to write.
    #[arg(long, default_value = "report-compare.html")]
    out: PathBuf,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let folder = match args.out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let page = kiln_records::report::runs_page(&args.runs, &folder)?;
    std::fs::write(&args.out, page).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {} ({} runs)", args.out.display(), args.runs.len());
    Ok(())
}
