//! `rag bench prefill`.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("'rag bench prefill' is not available in this build yet")
}
