//! `rag bench retrieval`.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("'rag bench retrieval' is not available in this build yet")
}
