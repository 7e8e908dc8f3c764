//! Replay the drafting side against captured model behaviour (`replay_capture`):
//! the prompt's top-k rows and the greedy output. A verify row on the true path
//! gets the true next token as its argmax; a row off it gets a token that matches
//! nothing. So acceptance, tokens per step, budgets and the modeled speed-up are
//! exactly what the real model gives for drafters that only read the prompt, the
//! output and the prefill rows (none, pld, sam, sam+cal, with or without the
//! conversation database) — in milliseconds, independent of machine load.
//! Extension also reads the argmax of rejected rows, which a replay does not know:
//! its harvest is empty here, so measure sam+ext / sdnpu with `rag-bench specdec`.
//! `--oracle` first prints the oracle bounds of each capture (`specdec::oracle`): the
//! best speed-up any drafter copying from the sources could reach with this curve.
//! `cargo run --release -p specdec --example replay_sim -- CURVE.json MODE[,MODE..] CAPTURE.jsonl.. [--fixed B] [--max-budget B] [--k K] [--branch 2,2] [--window N] [--conf] [--no-trees] [--follow-text] [--vote BELOW,WIDTH] [--oracle]`

use specdec::budget::CostCurve;
use specdec::drafter::{Mode, SamConfig, SamDrafter};
use specdec::oracle::{longest_true_continuations, oracle_schedule, OracleSchedule, OracleSources};
use specdec::{GenConfig, Generator, Metrics, PrefillOut, SpecError, Target, TokenDb};
use std::sync::Arc;

/// Off-path argmax: never a draft token.
const NOWHERE: u32 = u32::MAX - 1;

struct Replay {
    prompt: Vec<u32>,
    k: usize,
    ids: Vec<u32>,
    logits: Vec<f32>,
    /// Greedy output including its end-of-generation token (or one token past the cap).
    output: Vec<u32>,
    eog: Arc<Vec<u32>>,
}

struct ReplayTarget<'a> {
    r: &'a Replay,
    n_past: usize,
    k_used: usize,
}

impl Target for ReplayTarget<'_> {
    fn prefill(
        &mut self,
        tokens: &[u32],
        topk: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        let start = self.n_past;
        if self.r.prompt[start..start + tokens.len()] != *tokens {
            return Err(SpecError::Target(
                "prefill tokens differ from the capture".into(),
            ));
        }
        self.n_past += tokens.len();
        out.clear();
        out.next = self.r.output[0];
        let k = topk.min(self.r.k).min(self.k_used);
        if k > 0 {
            out.k = k;
            for p in start..self.n_past {
                let row = p * self.r.k;
                out.topk_ids.extend_from_slice(&self.r.ids[row..row + k]);
                out.topk_logits
                    .extend_from_slice(&self.r.logits[row..row + k]);
            }
        }
        Ok(())
    }

    fn verify(&mut self, tree: &specdec::FlatTree, argmax: &mut Vec<u32>) -> Result<(), SpecError> {
        // Output index the root predicts: KV holds prompt + output[..m-1], root = output[m-1].
        let m = self.n_past + 1 - self.r.prompt.len();
        argmax.clear();
        let mut on: Vec<Option<usize>> = Vec::with_capacity(tree.len());
        for i in 0..tree.len() {
            let idx = if tree.parents[i] < 0 {
                Some(m)
            } else {
                on[tree.parents[i] as usize]
                    .filter(|&j| self.r.output.get(j) == Some(&tree.tokens[i]))
                    .map(|j| j + 1)
            };
            on.push(idx);
            argmax.push(
                idx.and_then(|j| self.r.output.get(j).copied())
                    .unwrap_or(NOWHERE),
            );
        }
        Ok(())
    }

    fn commit(&mut self, rows: &[usize]) -> Result<(), SpecError> {
        self.n_past += rows.len();
        Ok(())
    }

    fn is_eog(&self, id: u32) -> bool {
        self.r.eog.contains(&id)
    }

    fn max_batch(&self) -> usize {
        64
    }

    fn context_left(&self) -> usize {
        1 << 20
    }

    fn prefill_chunk(&self) -> usize {
        256
    }
}

fn load(path: &str) -> Vec<Replay> {
    let text = std::fs::read_to_string(path).expect("capture");
    let mut eog: Option<Arc<Vec<u32>>> = None;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json");
            let u = |k: &str| -> Vec<u32> {
                v[k].as_array()
                    .expect(k)
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            };
            let e = eog.get_or_insert_with(|| Arc::new(u("eog_ids"))).clone();
            Replay {
                prompt: u("prompt"),
                k: v["k"].as_u64().unwrap() as usize,
                ids: u("topk_ids"),
                logits: v["topk_logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect(),
                output: u("output"),
                eog: e,
            }
        })
        .collect()
}

/// Output positions `1..needed` are what the decode steps must produce: the capture
/// ends with the end-of-generation token (which a step must produce) or one token
/// past the cap.
fn needed(r: &Replay, max_tokens: usize) -> usize {
    r.output.len().min(max_tokens)
}

/// Oracle bounds per source set and row cap, summed over the capture's prompts.
fn print_oracle(f: &str, reps: &[Replay], curve: &CostCurve, max_tokens: usize) {
    const MAX_LEN: usize = 63;
    // (label, include other prompts and every answer, min context, perfect drafter)
    let variants: [(&str, bool, usize, bool); 4] = [
        ("prompt+answers so far, context>=1", false, 1, false),
        ("prompt+answers so far", false, 0, false),
        ("every prompt and answer of the file", true, 0, false),
        ("perfect drafter (knows the output)", false, 0, true),
    ];
    for (label, all, ctx, perfect) in variants {
        for rows in [16usize, 64] {
            let mut tot = OracleSchedule::default();
            let mut cont_sum = 0usize;
            let mut positions = 0usize;
            for (i, r) in reps.iter().enumerate() {
                let need = needed(r, max_tokens);
                let cont = if perfect {
                    (0..r.output.len())
                        .map(|j| if j == 0 { 0 } else { MAX_LEN })
                        .collect()
                } else {
                    let mut fixed: Vec<&[u32]> = vec![&r.prompt];
                    for (k, o) in reps.iter().enumerate() {
                        if k < i || (all && k != i) {
                            fixed.push(&o.output);
                        }
                        if all && k != i {
                            fixed.push(&o.prompt);
                        }
                    }
                    let src = OracleSources {
                        fixed,
                        min_context: ctx,
                    };
                    longest_true_continuations(&r.output, &src, MAX_LEN)
                };
                cont_sum += cont[1..need.max(1)].iter().sum::<usize>();
                positions += need.saturating_sub(1);
                tot.add(&oracle_schedule(&cont, need, curve, rows));
            }
            println!(
                "{f} oracle {label:40} rows<={rows:2}  tok/step {:.2}  batch {:5.2}  modeled {:.3}x  (mean true continuation {:.2})",
                tot.tokens_per_step(),
                tot.rows as f64 / tot.steps.max(1) as f64,
                tot.speedup(),
                cont_sum as f64 / positions.max(1) as f64,
            );
        }
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let curve = CostCurve::load(std::path::Path::new(&a[1])).expect("curve");
    let modes: Vec<Mode> = a[2].split(',').map(|m| Mode::parse(m).unwrap()).collect();
    let mut files = Vec::new();
    let mut k = 4usize;
    let mut branch = vec![2usize, 2];
    let mut window = usize::MAX;
    let mut max_tokens = 128usize;
    let mut conf = false;
    let mut trees = true;
    let mut follow = false;
    let mut vote_below = 0usize;
    let mut vote_width = 3usize;
    let mut fixed: Option<usize> = None;
    let mut max_budget = GenConfig::default().max_budget;
    let mut oracle = false;
    let mut i = 3;
    while i < a.len() {
        match a[i].as_str() {
            "--k" => {
                k = a[i + 1].parse().unwrap();
                i += 1;
            }
            "--branch" => {
                branch = a[i + 1].split(',').map(|x| x.parse().unwrap()).collect();
                i += 1;
            }
            "--window" => {
                window = a[i + 1].parse().unwrap();
                i += 1;
            }
            "--fixed" => {
                fixed = Some(a[i + 1].parse().unwrap());
                i += 1;
            }
            "--max-budget" => {
                max_budget = a[i + 1].parse().unwrap();
                i += 1;
            }
            "--conf" => conf = true,
            "--oracle" => oracle = true,
            "--no-trees" => trees = false,
            "--follow-text" => follow = true,
            "--vote" => {
                let v: Vec<usize> = a[i + 1].split(',').map(|x| x.parse().unwrap()).collect();
                vote_below = v[0];
                vote_width = v.get(1).copied().unwrap_or(3);
                i += 1;
            }
            "--max-tokens" => {
                max_tokens = a[i + 1].parse().unwrap();
                i += 1;
            }
            f => files.push(f.to_owned()),
        }
        i += 1;
    }
    for f in &files {
        let reps = load(f);
        if oracle {
            print_oracle(f, &reps, &curve, max_tokens);
        }
        let mut base_model_ms = 0.0;
        for &mode in &modes {
            let mut cfg = SamConfig::for_mode(mode);
            cfg.calib_branch = branch.clone();
            cfg.calib_window = window;
            cfg.calib_confidence = conf;
            cfg.calib_trees = trees;
            cfg.calib_follow_text = follow;
            cfg.calib_vote_below = vote_below;
            cfg.calib_vote_width = vote_width;
            let gcfg = GenConfig {
                cost_curve: Some(curve.clone()),
                calib_window: window,
                fixed_budget: fixed,
                max_budget,
                ..Default::default()
            };
            let mk = |db: Option<Arc<specdec::sam::SuffixAutomaton>>| -> Box<dyn specdec::Drafter + Send> {
                match mode {
                    Mode::None | Mode::Pld => specdec::drafter::make_drafter(mode, db),
                    _ => Box::new(SamDrafter::new(cfg.clone(), db)),
                }
            };
            let mut gen = Generator::with_drafter(mode, mk(None), gcfg);
            let mut db = TokenDb::new(specdec::tokendb::DEFAULT_MAX_TOKENS);
            let mut tot = Metrics::default();
            let mut bad = 0;
            for r in &reps {
                let mut t = ReplayTarget {
                    r,
                    n_past: 0,
                    k_used: k,
                };
                let (out, m) = gen
                    .generate(&mut t, &r.prompt, max_tokens, &mut |_| {})
                    .expect("gen");
                let n = out.len();
                if out[..] != r.output[..n] {
                    bad += 1;
                }
                if !out.is_empty() {
                    db.add(&out);
                    gen.set_drafter(mk(Some(Arc::new(db.build_index()))));
                }
                tot.add(&m);
            }
            let model_ms = tot.modeled_verify_ms / tot.decode_tokens().max(1) as f64;
            if mode == Mode::None {
                base_model_ms = model_ms;
            }
            println!(
                "{f} {:8} tok/step {:.3}  batch {:5.2}  modeled {:.3}x  base-arm {:4}/{:4}  acc base/cal/ext {}/{}/{}  cal-only in tree/accepted {}/{} steps  pot @8 {:.2} @16 {:.2} @64 {:.2}  mismatch {bad}",
                mode.name(),
                tot.mean_accepted(),
                tot.mean_budget(),
                if model_ms > 0.0 { base_model_ms / model_ms } else { 0.0 },
                tot.base_arm_steps,
                tot.steps,
                tot.accepted_base,
                tot.accepted_calib_only,
                tot.accepted_ext_only,
                tot.steps_calib_in_tree,
                tot.steps_calib_accepted,
                tot.potential_accepted(8),
                tot.potential_accepted(16),
                tot.potential_accepted(64),
            );
        }
    }
}
