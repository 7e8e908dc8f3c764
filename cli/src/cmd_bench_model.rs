//! `rag bench model`.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("'rag bench model' is not available in this build yet")
}
