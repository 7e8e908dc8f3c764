//! Building the C examples with the system C compiler against this crate's libraries.
#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::Command;

pub const MODEL: &str = "smollm2-135m";

/// How an example links the library.
pub enum Link {
    /// librag_capi.so, found at run time through an rpath.
    Shared,
    /// librag_capi.a, copied into the executable.
    Static,
}

/// target/<profile>, where cargo puts the libraries (the tests run from its deps/).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sample-corpus")
}

/// Compiles `examples/<name>.c` into `out`; warnings are errors.
pub fn build_example(name: &str, link: Link, out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join(format!("examples/{name}.c")));
    match link {
        Link::Shared => {
            assert!(
                lib.join("librag_capi.so").is_file(),
                "no librag_capi.so in {}",
                lib.display()
            );
            cmd.arg(format!("-L{}", lib.display()))
                .arg("-lrag_capi")
                .arg(format!("-Wl,-rpath,{}", lib.display()));
        }
        Link::Static => {
            let archive = lib.join("librag_capi.a");
            assert!(archive.is_file(), "no librag_capi.a in {}", lib.display());
            // The system libraries the Rust standard library needs on Linux
            // (`rustc --print native-static-libs`).
            cmd.arg(archive).args([
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
                "-lc",
            ]);
        }
    }
    let status = cmd
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "{cc} failed to build examples/{name}.c");
}

/// The text between two marker lines of an example's output.
pub fn between<'a>(out: &'a str, start: &str, end: &str) -> &'a str {
    let a = out.find(start).expect("start marker") + start.len();
    let b = out[a..].find(end).expect("end marker") + a;
    &out[a..b]
}

/// `path:10-24`, `file.pdf#3` or the bare path, as the examples print them.
pub fn location(path: &str, lines: Option<(u32, u32)>, page: Option<u32>) -> String {
    match (lines, page) {
        (_, Some(p)) => format!("{path}#{p}"),
        (Some((a, b)), None) => format!("{path}:{a}-{b}"),
        (None, None) => path.to_owned(),
    }
}
