//! Generates the C header from the FFI sources into OUT_DIR; `tests/header.rs` compares it
//! with the checked-in `include/rag.h` (copy it there after changing the API).

use std::path::PathBuf;

const SOURCES: [&str; 5] = [
    "src/guard.rs",
    "src/handle.rs",
    "src/search.rs",
    "src/ask.rs",
    "src/chat.rs",
];

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("rag.h");
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .expect("rag/capi/cbindgen.toml is valid");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for s in SOURCES {
        builder = builder.with_src(dir.join(s));
        println!("cargo:rerun-if-changed={s}");
    }
    println!("cargo:rerun-if-changed=cbindgen.toml");
    builder
        .generate()
        .expect("cbindgen parses the FFI sources")
        .write_to_file(out);
}
