//! `rag model pull|list`.

#[derive(clap::Subcommand)]
pub enum ModelCmd {
    /// Fetch a model into the cache (idempotent, sha256-verified).
    Pull { name: String },
    /// List known models and whether they are cached.
    List,
}

pub fn run(_cmd: ModelCmd) -> anyhow::Result<()> {
    anyhow::bail!("'rag model' is not available in this build yet")
}
