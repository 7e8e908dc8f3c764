//! `rag-bench vs-llamacpp`: our CPU engine and llama.cpp on the same GGUF with the same
//! thread count, back to back in one run. Rounds alternate (ours, llama.cpp, ours, ...) and
//! each engine keeps its best round, so a burst of load on this shared machine hurts neither
//! side more than the other. The physical floors (memory bandwidth for decode, the int8
//! multiply-accumulate peak for prefill) are measured in the same run, not copied from
//! elsewhere.
//!
//! llama.cpp runs through `scripts/peers/llamacpp_bench.py` in a virtualenv outside the
//! repository (`--python`); `--requant q4_0` also compares on llama.cpp's own re-quantization
//! of the file, made once with `scripts/peers/llamacpp_requantize.py` into the model cache.
//!
//! Lower kernel tiers (users' CPUs without AVX-512) are compared by running the command with
//! `RAG_ISA=avx2` (or `avxvnni`) against a llama.cpp built for the same instruction set
//! (`--peer-build` says how); such a run reports into its own section.

use crate::bench_report;
use anyhow::{bail, Context, Result};
use graphs::gguf::GgufFile;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path or a model name from `rag model list`.
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    /// Python interpreter of a virtualenv with llama-cpp-python installed.
    #[arg(long)]
    pub python: PathBuf,
    /// Compute threads for both engines.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Repetitions per measurement inside each engine run (median).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Alternating rounds per engine; each engine's best round is reported.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Also compare on llama.cpp's re-quantization of the file to this type (q4_0, q8_0).
    #[arg(long)]
    pub requant: Option<String>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
    /// How the peer's llama.cpp was built, for the report (e.g. the CMake flags of an
    /// AVX2-only build when comparing with `RAG_ISA=avx2`).
    #[arg(long, default_value = "built from source with GGML_NATIVE")]
    pub peer_build: String,
    /// Writes the report into its own BENCHMARKS.md section named with this label (e.g. a
    /// different host), leaving the default section as it is.
    #[arg(long)]
    pub label: Option<String>,
    /// Our KV cache precision (llama.cpp's cache is f16 either way).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub kv_cache: String,
}

/// The kernel tier this run uses when it is not this CPU's best (`RAG_ISA`), else `None`.
fn forced_tier() -> Option<npu_runtime::kernels::Isa> {
    let isa = npu_runtime::kernels::detected();
    (isa != npu_runtime::kernels::Isa::available()[0]).then_some(isa)
}

const VERIFY_SIZES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

pub fn run(args: Args) -> Result<()> {
    if args.rounds == 0 || args.threads == 0 {
        bail!("--rounds and --threads must be at least 1");
    }
    if let Some(label) = &args.label {
        check_label(label)?;
    }
    let base = rag::models::ensure(&args.model)?;
    let mut files = vec![base.clone()];
    if let Some(t) = &args.requant {
        files.push(requantized(&args, &base, t)?);
    }
    let mut probes = Probes::new(args.threads);
    let mut results = Vec::new();
    let mut measured = Vec::new();
    for file in &files {
        let (ours, peer) = measure_pair(&args, file, &mut probes)?;
        measured.push((file, ours, peer));
    }
    let Probes {
        bw,
        bw_pattern,
        peak,
        count,
        ..
    } = probes;
    let peak_text = match peak {
        Some(p) => format!(
            "int8 multiply-accumulate peak measured in this run (independent dot-product \
             chains on every thread, registers only, best of {count} probes): {:.0} G MAC/s",
            p / 1e9
        ),
        None => "no int8 SIMD path on this CPU: no int8 peak".to_owned(),
    };
    let tier = forced_tier();
    let kv_text = match args.kv_cache.as_str() {
        "f32" => String::new(),
        kv => format!("Our KV cache is {kv} (`--kv-cache {kv}`). "),
    };
    let ours_text = match tier {
        Some(isa) => format!(
            "Our engine runs its {} kernels (`RAG_ISA={}`; the CPU has better ones), the peak \
             below is that tier's. ",
            isa.name(),
            isa.name()
        ),
        None => String::new(),
    };
    let mut body = format!(
        "Both engines on the same file with {} threads, back to back: {} alternating rounds \
         (ours, llama.cpp, ...), best round per engine, each measurement the median of {} \
         repetitions (the verify curve's: of {} rounds in which the sizes take turns). \
         {ours_text}{kv_text}llama.cpp is llama-cpp-python 0.3.36 ({}) in a virtualenv \
         outside the repo. Memory read bandwidth measured in this run: {bw:.1} GB/s ({bw_pattern}; the best \
         read pattern of {count} probes, one before every round, each trying every thread \
         count up to the run's, one or two streams per thread, 4 KiB and huge pages over \
         1 GiB); {peak_text}. A decode step's floor counts the bytes it must read: every \
         weight once (the LM head's screen instead of the head on greedy rows when it has \
         one) plus, at depth 1000, the K and V rows of our cache. Decode rows feed fixed \
         pseudo-random tokens and compute all logits in both engines; the greedy rows \
         continue the bundled sample corpus with the model's own argmax, as `rag ask` does, \
         where ours takes the screened LM head if the model has one (a Q8_0 head of 64M+ \
         weights, `benchmarks/runs/kernels-worklog.md#item-85`) and llama.cpp's cost is its decode row's (it computes the same logits whatever the \
         tokens); their share of the floor is against the same file bytes.\n\n",
        args.threads,
        args.rounds,
        args.reps,
        crate::cmd_bench_model::verify_rounds(args.reps),
        args.peer_build
    );
    for (file, ours, peer) in measured {
        let floors = Floors::of(file, bw, peak, kv_bytes_per_elem(&args.kv_cache))?;
        body.push_str(&table(file, &ours, &peer, &floors));
        results.push(json!({
            "model": file_name(file),
            "weight_bytes_per_token": floors.decode_bytes,
            "greedy_weight_bytes_per_token": floors.greedy_bytes,
            "kv_bytes_per_position": floors.kv_bytes_per_position,
            "ours": ours,
            "llamacpp": peer,
        }));
    }
    if let Some(path) = &args.report.file {
        // The default run (best kernels, f32 cache) keeps the section it always had.
        let mut key = format!("vs-llamacpp:{}", file_name(&base));
        let mut title = format!("CPU engine vs llama.cpp: {}", file_name(&base));
        if let Some(isa) = tier {
            key.push_str(&format!(":{}", isa.name()));
            title.push_str(&format!(", our {} kernels", isa.name()));
        }
        if args.kv_cache != "f32" {
            key.push_str(&format!(":kv-{}", args.kv_cache));
            title.push_str(&format!(", our KV cache {}", args.kv_cache));
        }
        if let Some(label) = &args.label {
            key.push_str(&format!(":{label}"));
            title.push_str(&format!(" ({label})"));
        }
        bench_report::write_section_in(path, &key, &title, &body)?;
    }
    if args.json {
        println!(
            "{}",
            json!({"threads": args.threads, "bandwidth_gbs": bw, "bandwidth_pattern": bw_pattern,
                "isa": npu_runtime::kernels::detected().name(),
                "int8_peak_gmacs": peak.map(|p| p / 1e9), "files": results})
        );
    } else {
        println!("{body}");
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

/// The script beside this crate in a source checkout.
pub(crate) fn peer_script(name: &str) -> Result<PathBuf> {
    let candidates = [
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/peers")
            .join(name),
        PathBuf::from("scripts/peers").join(name),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("scripts/peers/{name} not found: run from a source checkout"))
}

/// llama.cpp's re-quantization of `base` to `ty`, made once and kept in the model cache.
fn requantized(args: &Args, base: &Path, ty: &str) -> Result<PathBuf> {
    let ty = ty.to_ascii_lowercase();
    if !matches!(ty.as_str(), "q4_0" | "q8_0") {
        bail!("--requant must be q4_0 or q8_0, not {ty}");
    }
    let stem = base
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let out = base.with_file_name(format!("{stem}.llamacpp-{ty}.gguf"));
    if out.is_file() {
        return Ok(out);
    }
    let tmp = out.with_extension("gguf.partial");
    eprintln!("re-quantizing {} to {ty} with llama.cpp", base.display());
    let status = Command::new(&args.python)
        .arg(peer_script("llamacpp_requantize.py")?)
        .arg(base)
        .arg(&tmp)
        .args(["--type", &ty, "--threads", &args.threads.to_string()])
        .status()
        .with_context(|| format!("running {}", args.python.display()))?;
    if !status.success() {
        bail!("llama.cpp re-quantization failed ({status})");
    }
    std::fs::rename(&tmp, &out).with_context(|| format!("renaming to {}", out.display()))?;
    Ok(out)
}

/// The machine's physical limits, re-probed before every round: a probe that lands in a
/// busy moment of the shared host reads low (bandwidth 24-50 GB/s within one hour here,
/// the int8 peak once 233 instead of ~460 G MAC/s), and a floor is the best the machine
/// gives, so each keeps its best reading.
struct Probes {
    threads: usize,
    /// Memory read bandwidth, GB/s, and the read pattern that reached it.
    bw: f64,
    bw_pattern: String,
    /// int8 multiply-accumulates per second (`None` without an int8 SIMD path).
    peak: Option<f64>,
    count: usize,
}

impl Probes {
    fn new(threads: usize) -> Self {
        let mut p = Probes {
            threads,
            bw: 0.0,
            bw_pattern: String::new(),
            peak: None,
            count: 0,
        };
        p.probe();
        p
    }

    fn probe(&mut self) {
        let read = crate::bandwidth::best_read(self.threads);
        let bw = read.gbs;
        let peak = npu_runtime::kernels::peak::int8_macs_per_sec(self.threads, 3);
        eprintln!(
            "probe {}: memory read bandwidth {bw:.1} GB/s ({}), int8 peak {}",
            self.count + 1,
            read.describe(),
            peak.map_or("n/a".to_owned(), |p| format!("{:.0} G MAC/s", p / 1e9))
        );
        if bw > self.bw {
            self.bw = bw;
            self.bw_pattern = read.describe();
        }
        self.peak = match (self.peak, peak) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.count += 1;
    }
}

/// Alternating rounds; returns each engine's best figures. Re-probes the machine's limits
/// before each round.
fn measure_pair(args: &Args, file: &Path, probes: &mut Probes) -> Result<(Value, Value)> {
    let (mut ours, mut peer) = (None, None);
    let exe = std::env::current_exe().context("locating the rag-bench binary")?;
    let common = [
        "--threads".to_owned(),
        args.threads.to_string(),
        "--reps".to_owned(),
        args.reps.to_string(),
    ];
    for round in 0..args.rounds {
        eprintln!(
            "{}: round {} of {}",
            file_name(file),
            round + 1,
            args.rounds
        );
        probes.probe();
        let mut cmd = Command::new(&exe);
        cmd.args(["model", "--json", "--model"])
            .arg(file)
            .args(["--kv-cache", &args.kv_cache])
            .args(&common);
        ours = Some(best(ours, run_json(cmd, "rag-bench model")?));
        let mut cmd = Command::new(&args.python);
        cmd.arg(peer_script("llamacpp_bench.py")?)
            .arg("--model")
            .arg(file)
            .args(&common);
        peer = Some(best(peer, run_json(cmd, "llamacpp_bench.py")?));
    }
    Ok((ours.unwrap_or(Value::Null), peer.unwrap_or(Value::Null)))
}

/// Runs `cmd` and parses the last stdout line as JSON.
fn run_json(mut cmd: Command, what: &str) -> Result<Value> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.trim_start().starts_with('{'));
    let line = line.with_context(|| format!("{what} printed no JSON"))?;
    serde_json::from_str(line).with_context(|| format!("parsing the JSON of {what}"))
}

/// A `--label` becomes part of the section's HTML-comment markers in BENCHMARKS.md, so it
/// is kept to characters that cannot end or confuse a marker.
fn check_label(label: &str) -> Result<()> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if label.is_empty() || !label.chars().all(ok) {
        bail!("--label {label:?}: use letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

/// Keeps the better of two runs per figure: higher tok/s, lower verify ms, higher RSS.
fn best(prev: Option<Value>, new: Value) -> Value {
    let Some(mut acc) = prev else { return new };
    for (key, higher_is_better) in [
        ("prefill_tok_s", true),
        ("decode_tok_s", true),
        ("greedy_text_tok_s", true),
        ("verify_ms", false),
    ] {
        let (Some(a), Some(b)) = (
            acc.get_mut(key).and_then(Value::as_object_mut),
            new.get(key).and_then(Value::as_object),
        ) else {
            continue;
        };
        for (k, v) in b {
            let (Some(x), Some(y)) = (a.get(k).and_then(Value::as_f64), v.as_f64()) else {
                continue;
            };
            let keep_new = if higher_is_better { y > x } else { y < x };
            if keep_new {
                a.insert(k.clone(), v.clone());
            }
        }
    }
    if let (Some(x), Some(y)) = (
        acc.get("peak_rss_mb").and_then(Value::as_f64),
        new.get("peak_rss_mb").and_then(Value::as_f64),
    ) {
        acc["peak_rss_mb"] = x.max(y).into();
    }
    acc
}

/// Bytes per K or V element of our cache.
fn kv_bytes_per_elem(kv_cache: &str) -> u64 {
    if kv_cache == "f16" {
        2
    } else {
        4
    }
}

/// What the hardware allows for this file.
struct Floors {
    /// Weight bytes one decode step must read (the LM head included; the embedding table
    /// only when it doubles as the LM head).
    decode_bytes: u64,
    /// The same on greedy rows, where a screened LM head reads its coarse Q5_0 copy
    /// (22 bytes per 32 weights against Q8_0's 34) instead of the head; the few rows the
    /// screen keeps are not counted. Equal to `decode_bytes` without a screen.
    greedy_bytes: u64,
    /// K and V bytes per past position of our cache (every layer).
    kv_bytes_per_position: u64,
    /// The measured read bandwidth, GB/s.
    bw_gbs: f64,
    /// Multiply-accumulates per prefill token (every matmul weight except the LM head, which
    /// prefill applies to the last token only).
    prefill_macs_per_token: f64,
    /// Measured int8 multiply-accumulates per second of the machine, if it has an int8 path.
    int8_peak_macs: Option<f64>,
}

impl Floors {
    fn of(
        file: &Path,
        bw_gbs: f64,
        int8_peak_macs: Option<f64>,
        kv_elem_bytes: u64,
    ) -> Result<Floors> {
        let g = GgufFile::open(file).with_context(|| format!("reading {}", file.display()))?;
        let tied = g.tensor("output.weight").is_none();
        let mut bytes = 0u64;
        let mut macs = 0u64;
        let mut head_saving = 0u64;
        for t in g.tensors() {
            let is_embd = t.name == "token_embd.weight";
            let is_head = t.name == "output.weight" || (tied && is_embd);
            if !is_embd || tied {
                bytes += t.n_bytes as u64;
            }
            if t.dims.len() >= 2 && !is_embd && !is_head {
                macs += t.n_elements();
            }
            let q8_0 = t.ggml_type == graphs::quant::GgmlType::Q8_0;
            let screened = is_head
                && q8_0
                && t.n_elements() >= npu_runtime::kernels::screen::MIN_SCREENED_WEIGHTS as u64;
            if screened {
                head_saving = t.n_bytes as u64 - t.n_elements() / 32 * 22;
            }
        }
        let arch = g.get_str("general.architecture").unwrap_or("llama");
        let key = |k: &str| g.get_u64(&format!("{arch}.{k}"));
        let layers = key("block_count").unwrap_or(0);
        let heads = key("attention.head_count").unwrap_or(1).max(1);
        let kv_heads = key("attention.head_count_kv").unwrap_or(heads);
        let head_dim = key("attention.key_length")
            .unwrap_or_else(|| key("embedding_length").unwrap_or(0) / heads);
        Ok(Floors {
            decode_bytes: bytes,
            greedy_bytes: bytes - head_saving,
            kv_bytes_per_position: 2 * layers * kv_heads * head_dim * kv_elem_bytes,
            bw_gbs,
            prefill_macs_per_token: macs as f64,
            int8_peak_macs,
        })
    }

    /// Bytes a decode step at `depth` past positions reads.
    fn step_bytes(&self, depth: u64, greedy: bool) -> u64 {
        let weights = if greedy {
            self.greedy_bytes
        } else {
            self.decode_bytes
        };
        weights + depth * self.kv_bytes_per_position
    }

    /// The step's floor in ms at the measured bandwidth.
    fn step_ms(&self, depth: u64, greedy: bool) -> f64 {
        self.step_bytes(depth, greedy) as f64 / (self.bw_gbs * 1e9) * 1e3
    }
}

/// A decode row's depth key ("0", "1000") as a number.
fn depth(key: &str) -> u64 {
    key.parse().unwrap_or(0)
}

fn get(v: &Value, key: &str, sub: &str) -> f64 {
    v.get(key)
        .and_then(|m| m.get(sub))
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}

fn table(file: &Path, ours: &Value, peer: &Value, floors: &Floors) -> String {
    let mut s = format!(
        "### {}\n\nDecode floor: {:.0} MB of weights per token at the measured bandwidth = \
         {:.1} ms/token ({:.1} tok/s); {:.0} MB on greedy rows; our cache adds {:.1} MB per \
         1000 positions. Prefill work: {:.2} G multiply-accumulates per token.\n\n\
         | metric | ours | llama.cpp | ratio | ours against the floor |\n|---|---|---|---|---|\n",
        file_name(file),
        floors.decode_bytes as f64 / 1e6,
        floors.step_ms(0, false),
        1e3 / floors.step_ms(0, false),
        floors.greedy_bytes as f64 / 1e6,
        floors.kv_bytes_per_position as f64 * 1000.0 / 1e6,
        floors.prefill_macs_per_token / 1e9,
    );
    for t in ["128", "512"] {
        let (a, b) = (get(ours, "prefill_tok_s", t), get(peer, "prefill_tok_s", t));
        let macs = a * floors.prefill_macs_per_token;
        let share = floors.int8_peak_macs.map_or(String::new(), |p| {
            format!(", {:.0}% of the int8 peak", macs / p * 100.0)
        });
        s.push_str(&format!(
            "| prefill T={t} (tok/s) | {a:.1} | {b:.1} | {:.2}x | {:.0} G MAC/s{share} |\n",
            a / b,
            macs / 1e9
        ));
    }
    for d in ["0", "1000"] {
        let (a, b) = (get(ours, "decode_tok_s", d), get(peer, "decode_tok_s", d));
        let share = a * floors.step_ms(depth(d), false) / 1e3 * 100.0;
        s.push_str(&format!(
            "| decode depth {d} (tok/s) | {a:.1} | {b:.1} | {:.2}x | {share:.0}% of the floor |\n",
            a / b
        ));
    }
    // llama.cpp computes the same logits whatever the tokens, so its decode figure
    // stands for greedy decoding too; ours reads the screened LM head there.
    for d in ["0", "1000"] {
        let (a, b) = (
            get(ours, "greedy_text_tok_s", d),
            get(peer, "decode_tok_s", d),
        );
        if a.is_nan() {
            continue;
        }
        let share = a * floors.step_ms(depth(d), true) / 1e3 * 100.0;
        s.push_str(&format!(
            "| greedy decode on text, depth {d} (tok/s) | {a:.1} | {b:.1} | {:.2}x | {share:.0}% of the floor |\n",
            a / b
        ));
    }
    let rss = |v: &Value| {
        v.get("peak_rss_mb")
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    s.push_str(&format!(
        "| peak RSS (MB) | {:.0} | {:.0} | {:.2}x | |\n\n",
        rss(ours),
        rss(peer),
        rss(ours) / rss(peer)
    ));
    s.push_str(
        "Verify cost at depth 1000 (one forward of N new tokens; ours computes each row's \
         argmax, as speculative verification uses it, llama.cpp the logits of all N):\n\n\
         | N | ours ms | ours / N=1 | llama.cpp ms | llama.cpp / N=1 |\n|---|---|---|---|---|\n",
    );
    let (o1, p1) = (get(ours, "verify_ms", "1"), get(peer, "verify_ms", "1"));
    for n in VERIFY_SIZES {
        let k = n.to_string();
        let (o, p) = (get(ours, "verify_ms", &k), get(peer, "verify_ms", &k));
        s.push_str(&format!(
            "| {n} | {o:.1} | {:.2} | {p:.1} | {:.2} |\n",
            o / o1,
            p / p1
        ));
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_kept_to_marker_safe_characters() {
        assert!(check_label("intel-xeon").is_ok() && check_label("zen5_v1.2").is_ok());
        for bad in ["", "a b", "x-->", "a:b", "é"] {
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn best_keeps_the_better_figure_of_each_kind() {
        let a = json!({"prefill_tok_s": {"128": 10.0}, "decode_tok_s": {"0": 5.0},
                       "verify_ms": {"1": 3.0, "8": 9.0}, "peak_rss_mb": 100.0});
        let b = json!({"prefill_tok_s": {"128": 12.0}, "decode_tok_s": {"0": 4.0},
                       "verify_ms": {"1": 4.0, "8": 7.0}, "peak_rss_mb": 90.0});
        let m = best(Some(a), b);
        assert_eq!(m["prefill_tok_s"]["128"], 12.0);
        assert_eq!(m["decode_tok_s"]["0"], 5.0);
        assert_eq!(m["verify_ms"]["1"], 3.0);
        assert_eq!(m["verify_ms"]["8"], 7.0);
        assert_eq!(m["peak_rss_mb"], 100.0);
    }

    #[test]
    fn json_parser_takes_the_last_object_line() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo noise; echo '{\"a\": 1}'"]);
        assert_eq!(run_json(cmd, "sh").unwrap()["a"], 1);
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo only noise"]);
        assert!(run_json(cmd, "sh").is_err());
    }
}
