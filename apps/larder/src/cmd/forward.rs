//! `larder forward`: logits of every position, for checks and scripts.

use std::path::PathBuf;

use serde_json::json;

/// Arguments of `larder forward`.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  larder forward --model ./fixtures/qwen3_moe_tiny --ids 1,17,42 --json")]
pub struct Args {
    /// Checkpoint folder or packed store (see `larder pack`).
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    experts: super::ExpertArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    ids: Vec<u32>,
    /// Print {"logits": [[f32; vocab] per position]} on stdout.
    #[arg(long)]
    json: bool,
    /// Without --json: how many top tokens to show per position, 1 to 1048576.
    #[arg(long, default_value_t = 5, value_parser = super::range(1, super::MAX_COUNT))]
    top: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let engine = super::load_engine_with(&args.model, &args.experts, args.json)?;
    let logits = engine.forward(&args.ids)?;
    if args.json {
        let rows: Vec<&[f32]> = (0..logits.rows()).map(|r| logits.row(r)).collect();
        return super::print_json(&json!({ "logits": rows }));
    }
    let tok = engine.tokenizer().ok();
    for (p, &id) in args.ids.iter().enumerate() {
        let row = logits.row(p);
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let top: Vec<String> = order
            .iter()
            .take(args.top)
            .map(|&i| match tok.and_then(|t| t.decode(&[i as u32], false).ok()) {
                Some(text) => format!("{i} {text:?} {:.4}", row[i]),
                None => format!("{i} {:.4}", row[i]),
            })
            .collect();
        println!("position {p} (id {id}): {}", top.join(" | "));
    }
    Ok(())
}
