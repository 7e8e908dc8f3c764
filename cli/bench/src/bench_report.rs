//! Shared plumbing for `rag-bench`: the machine description and the Markdown section
//! writer. Each benchmark owns one section between markers, so a re-run replaces its own
//! table and leaves the others alone. Reports are written only where `--report` says.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// `--report FILE`, flattened into every benchmark that writes a section.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Also write the results into this Markdown file (e.g. BENCHMARKS.md), as this
    /// benchmark's section between its markers: a re-run replaces its own section and
    /// keeps the rest of the file. Without it no file is written.
    #[arg(long = "report", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// `--no-report` / `--no-write`, accepted so recorded command lines still run: without
    /// `--report` nothing is written.
    #[arg(long, alias = "no-write", hide = true, conflicts_with = "file")]
    no_report: bool,
}

/// "AMD EPYC (family 26 model 2), 2 hardware threads" from /proc/cpuinfo, or a generic
/// fallback. Family and model tell CPU generations apart that share a model name (a
/// 2-core "AMD EPYC" VM was Zen 4 one week and Zen 5 the next).
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    describe(&info, n)
}

fn describe(cpuinfo: &str, threads: usize) -> String {
    let field = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_owned())
    };
    let mut cpu = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    if let (Some(family), Some(model)) = (field("cpu family"), field("model")) {
        cpu = format!("{cpu} (family {family} model {model})");
    }
    format!("{cpu}, {threads} hardware threads")
}

/// Today's date (UTC) as YYYY-MM-DD, without a date crate.
pub fn today() -> String {
    utc_now()[..10].to_owned()
}

/// The current UTC time as YYYY-MM-DD HH:MM, without a date crate.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// The command line as typed, for reproduction notes: arguments with spaces quoted, and a
/// `RAG_ISA` setting (it picks the kernels) in front.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = std::env::var("RAG_ISA")
        .ok()
        .map(|v| format!("RAG_ISA={v} "));
    shown_command(env.as_deref().unwrap_or(""), &args)
}

fn shown_command(env: &str, args: &[String]) -> String {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| match a.contains(' ') {
            true => format!("\"{a}\""),
            false => a.clone(),
        })
        .collect();
    format!("{env}rag-bench {}", quoted.join(" "))
}

/// Replace (or append) the section `key` of the Markdown file `path` with `body`, stamped
/// with the command, machine and date.
pub fn write_section_in(path: &Path, key: &str, title: &str, body: &str) -> Result<()> {
    let begin = format!("<!-- bench:{key}:begin -->");
    let end = format!("<!-- bench:{key}:end -->");
    let section = format!(
        "{begin}\n## {title}\n\nCommand: `{}`  \nMachine: {}  \nDate: {}\n\n{}\n{end}",
        command_line(),
        machine(),
        today(),
        body.trim_end()
    );
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmarks\n".to_owned());
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &old[..b], section, &old[e + end.len()..]),
        _ => format!("{}\n\n{}\n", old.trim_end(), section),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_command_quotes_spaced_arguments_and_keeps_the_isa() {
        let args = ["vs-llamacpp", "--peer-build", "GGML_AVX2=ON, no AVX-512"];
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            shown_command("RAG_ISA=avx2 ", &args),
            "RAG_ISA=avx2 rag-bench vs-llamacpp --peer-build \"GGML_AVX2=ON, no AVX-512\""
        );
        assert_eq!(shown_command("", &args[..1]), "rag-bench vs-llamacpp");
    }

    #[test]
    fn machine_names_family_and_model_when_cpuinfo_has_them() {
        let info = "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n";
        assert_eq!(
            describe(info, 2),
            "AMD EPYC (family 26 model 2), 2 hardware threads"
        );
        let bare = "model name\t: Some CPU\n";
        assert_eq!(describe(bare, 4), "Some CPU, 4 hardware threads");
        assert!(describe("", 1).ends_with(", 1 hardware threads"));
    }

    #[test]
    fn sections_are_replaced_in_place_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("B.md");
        write_section_in(&p, "a", "A", "first").unwrap();
        write_section_in(&p, "b", "B", "other").unwrap();
        write_section_in(&p, "a", "A", "second").unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains("second") && !s.contains("first") && s.contains("other"));
        assert!(s.find("## A").unwrap() < s.find("## B").unwrap());
    }

    #[test]
    fn date_is_well_formed() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }
}
