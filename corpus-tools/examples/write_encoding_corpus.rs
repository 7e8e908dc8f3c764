//! Writes the encoding test corpus (`corpus_tools::test_support::encoding_corpus`, plus the
//! binary headers of `binary_files`) into a folder, for measuring `rag index` on it:
//! `cargo run --release -p corpus-tools --example write_encoding_corpus -- DIR`.

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: write_encoding_corpus DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir)?;
    let files = corpus_tools::test_support::write_encoding_corpus(&dir)?;
    for (name, bytes, _) in corpus_tools::test_support::binary_files() {
        std::fs::write(dir.join(name), bytes)?;
    }
    println!(
        "{} text files and the binaries in {}",
        files.len(),
        dir.display()
    );
    Ok(())
}
