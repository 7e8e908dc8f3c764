//! A UI-automation agent on top of `rag::Assistant`: for each recorded DroidTask step it
//! passes the current screen as context, asks for the next action, and scores the answer
//! against the reference action. Reports action accuracy and per-step latency.
//!
//!     cargo run --release -p rag --example ui_agent -- [DATASET] [--limit N] [--every K]
//!         [--skip N] [--model M] [--raw] [--samples N[,N...] [--temperature T] [--seed S]
//!         [--verify]]
//!
//! DATASET defaults to ../shared/data/ui/droidtask_ui.jsonl. `--every K` scores every K-th
//! step (a spread over all 13 apps when time allows fewer than 560 steps); `--limit N` stops
//! after N scored steps. An action is correct when its verb (Click / Input), the element id
//! and, for Input, the typed text (case-insensitive) match the reference.
//!
//! Prompt: a fixed system message with the action format and one worked example taken from
//! a different app than the step being scored (so the example never leaks the answer), then
//! the task, the actions so far and the screen. The fixed system message is a common prefix
//! the assistant's KV reuse skips on every step. `--raw` sends the dataset's own prompt
//! instead (the first session's baseline).
//!
//! `--samples` (test-time scaling): each step samples N answers in one batched decode
//! (temperature T, default 0.7, top-p 0.95, seed S + step) and keeps one by majority vote
//! over the parsed actions or by mean log-probability. With a list (`--samples 1,4,16`)
//! every step runs each N in turn (rotating the order), so the per-N latencies come from the
//! same run. Sample b of N is the same for every N (its seed depends on b only), so the
//! largest N's samples also score every smaller k, for both selectors. `--verify` makes
//! every run keep its answer by the model's own judgement (`Selector::Verify`) and scores
//! that selector too.

use anyhow::{Context, Result};
use rag::assistant::{Answer, AskOptions, Assistant, AssistantOptions, Sampling};
use rag::select::{self, Candidate, Selector, VoteKey};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, PartialEq)]
struct Action {
    verb: String,
    element_id: Option<u32>,
    text: Option<String>,
}

/// The system message; `{EXAMPLE}` is replaced by one worked step.
const SYSTEM: &str = "You operate an Android app for the user. Each turn shows the task, the \
actions done so far and the current screen as a list of elements with ids. Reply with \
exactly one line holding the single next action, in one of these two forms:\n\
Click on <element>\n\
Input 'text' into <element>\n\
Copy the element from the screen exactly, including its id. Do not repeat the task, do not \
explain.\n\nExample:\n{EXAMPLE}";

/// Two recorded DroidTask steps (applauncher step 1, notes step 2) as worked examples; a step
/// is shown the first one whose app differs from its own, so exactly one example.
const EXAMPLES: [(&str, &str); 2] = [
    (
        "applauncher",
        "Task: search 'Clock' app and open it\n\
Actions so far:\n- Input 'Clock' into <input id=0 >Search</input>\n\
Current screen:\n<input id=0 >Clock</input>\n <button id=1 text='Sort by'></button>\n \
<button id=2 text='Toggle app name visibility'></button>\n <button id=3 text='More options'></button>\n \
<button id=4>Clock</button>\n <button id=5>go back</button>\n\
Next action:\nClick on <button id=4>Clock</button>",
    ),
    (
        "notes",
        "Task: Rename the note 'diary' to 'events'\n\
Actions so far:\n- Click on <button id=3 text='More options'></button>\n\
- Click on <button id=0>Rename note</button>\n\
Current screen:\n<p id=0>Rename note</p>\n <input id=1 >Diary</input>\n \
<button id=2>Cancel</button>\n <button id=3>OK</button>\n <button id=4>go back</button>\n\
Next action:\nInput 'events' into <input id=1 >Diary</input>",
    ),
];

fn system_for(app: &str) -> String {
    let ex = EXAMPLES
        .iter()
        .find(|(a, _)| *a != app)
        .map_or("", |(_, e)| e);
    SYSTEM.replace("{EXAMPLE}", ex)
}

/// The element tag with id `id` on `screen` (`button`, `input`, ...).
fn tag_of(screen: &str, id: u32) -> Option<String> {
    let needle = format!(" id={id}");
    screen.lines().find_map(|l| {
        let l = l.trim();
        let tag_end = l.find(&needle)?;
        let after = &l[tag_end + needle.len()..];
        if !after.starts_with([' ', '>']) {
            return None;
        }
        l.strip_prefix('<').map(|t| t[..tag_end - 1].to_owned())
    })
}

/// The action in a model reply: the first "click" / "input"/"type"/"enter" verb, the first
/// `id=N` after it, and for input the quoted text. Without a verb, a bare element counts as a
/// click unless it is an input field on `screen`. Case and surrounding prose are ignored.
fn parse_action(s: &str, screen: &str) -> Option<Action> {
    let lower = s.to_lowercase();
    let verbs = [
        ("click", "click"),
        ("tap", "click"),
        ("input", "input"),
        ("type", "input"),
        ("enter", "input"),
    ];
    // Verbs count only as words in the prose before the first element tag.
    let prose = &lower[..lower.find('<').unwrap_or(lower.len())];
    let is_word_at = |p: usize, w: &str| {
        let before = prose[..p].chars().next_back();
        let after = prose[p + w.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    };
    let found = verbs
        .iter()
        .filter_map(|(w, v)| {
            prose
                .match_indices(w)
                .find(|(p, _)| is_word_at(*p, w))
                .map(|(p, _)| (p, *v))
        })
        .min_by_key(|(p, _)| *p);
    let start = found.map_or(0, |(p, _)| p);
    let rest = &s[start..];
    let element_id = rest.find("id=").and_then(|p| {
        let digits: String = rest[p + 3..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    });
    let text = ['\'', '"'].iter().find_map(|&q| {
        let a = rest.find(q)?;
        let after = &rest[a + 1..];
        let b = after.find(q)?;
        // A quote inside the element (text='Sort by') is not the typed text.
        (!rest[..a].contains('<')).then(|| after[..b].to_owned())
    });
    let verb = match found {
        Some((_, v)) => v,
        None => {
            let tag = element_id.and_then(|id| tag_of(screen, id))?;
            if tag == "input" && text.is_some() {
                "input"
            } else {
                "click"
            }
        }
    };
    element_id?;
    Some(Action {
        verb: verb.to_owned(),
        element_id,
        text: if verb == "input" {
            text.map(|t| t.trim().to_lowercase())
        } else {
            None
        },
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut dataset = "../shared/data/ui/droidtask_ui.jsonl".to_owned();
    let mut limit = usize::MAX;
    let mut every = 1usize;
    let mut skip = 0usize;
    let mut raw = false;
    let mut model = rag::models::DEFAULT_MODEL.to_owned();
    let mut samples: Vec<usize> = Vec::new();
    let (mut temperature, mut seed) = (0.7f32, 1u64);
    let mut verify = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--limit" => limit = args.next().context("--limit N")?.parse()?,
            "--every" => every = args.next().context("--every K")?.parse::<usize>()?.max(1),
            "--skip" => skip = args.next().context("--skip N")?.parse()?,
            "--model" => model = args.next().context("--model M")?,
            "--raw" => raw = true,
            "--samples" => {
                samples = args
                    .next()
                    .context("--samples N[,N...]")?
                    .split(',')
                    .map(|n| n.trim().parse::<usize>().context("--samples N[,N...]"))
                    .collect::<Result<Vec<_>>>()?;
                anyhow::ensure!(
                    samples.iter().all(|&n| (1..=16).contains(&n)),
                    "--samples: each N in 1..=16"
                );
            }
            "--temperature" => temperature = args.next().context("--temperature T")?.parse()?,
            "--seed" => seed = args.next().context("--seed S")?.parse()?,
            "--verify" => verify = true,
            other => dataset = other.to_owned(),
        }
    }
    let text = std::fs::read_to_string(&dataset).with_context(|| format!("reading {dataset}"))?;
    let index_dir = std::env::temp_dir().join(format!("rag-ui-agent-{}", std::process::id()));
    let mut opts = AssistantOptions::new(&index_dir);
    opts.model = model.clone();
    opts.dense = false; // the agent brings its own context; no retrieval needed
    let assistant = Assistant::open(opts)?;
    // Load the model before the first step so per-step latency excludes the one-time load.
    let t = Instant::now();
    assistant.load_model()?;
    eprintln!(
        "model {model} loaded in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let ask = AskOptions {
        max_tokens: if raw { 48 } else { 40 },
        ..AskOptions::default()
    };

    let (mut steps, mut correct, mut latencies) = (0usize, 0usize, Vec::new());
    let max_n = samples.iter().copied().max().unwrap_or(0);
    // k samples scored from the largest run: powers of two and the listed sizes.
    let mut ks: Vec<usize> = (0..5).map(|e| 1 << e).filter(|&k| k <= max_n).collect();
    ks.extend(samples.iter().copied());
    ks.sort_unstable();
    ks.dedup();
    let mut k_correct = vec![[0usize; 3]; ks.len()];
    let run_select = if verify {
        Selector::Verify
    } else {
        Selector::Vote
    };
    let mut n_latency: Vec<Vec<f64>> = vec![Vec::new(); samples.len()];
    let mut per_app: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let records = text.lines().filter(|l| !l.trim().is_empty());
    for line in records.skip(skip).step_by(every).take(limit) {
        let rec: serde_json::Value = serde_json::from_str(line)?;
        let prompt = rec["turns"][0]
            .as_str()
            .context("record without turns[0]")?;
        let reference = rec["reference"]
            .as_str()
            .context("record without reference")?;
        let app = rec["app"].as_str().unwrap_or("");
        let screen = prompt.find("Current screen:").map_or("", |a| &prompt[a..]);
        let t = Instant::now();
        let answer = if raw {
            // The recorded prompt as is: task, actions so far, screen, format instruction.
            let (context, question) =
                match (prompt.find("Current screen:"), prompt.rfind("\nReply with")) {
                    (Some(a), Some(b)) if a < b => (
                        prompt[a..b].to_owned(),
                        format!("{}{}", &prompt[..a], prompt[b..].trim_start()),
                    ),
                    _ => (String::new(), prompt.to_owned()),
                };
            assistant.ask_with_context(&question, &context, None, &ask, &mut |_| true)?
        } else {
            // Task, actions so far and screen, without the dataset's header and its
            // "Then say in one sentence why" instruction.
            let body_start = prompt.find("Task:").unwrap_or(0);
            let body_end = prompt.rfind("\nReply with").unwrap_or(prompt.len());
            let context = prompt[body_start..body_end].trim_end();
            let system = system_for(app);
            if samples.is_empty() {
                // Only the first line is the action; stop generating after it.
                let mut seen = String::new();
                let mut first_line = |s: &str| {
                    seen.push_str(s);
                    !seen.trim_start().contains('\n')
                };
                assistant.ask_with_context(
                    "Next action:",
                    context,
                    Some(&system),
                    &ask,
                    &mut first_line,
                )?
            } else {
                let screen_owned = screen.to_owned();
                let key = VoteKey(Arc::new(move |t: &str| {
                    parse_action(t, &screen_owned).map(|a| format!("{a:?}"))
                }));
                let sampled = |n: usize| AskOptions {
                    sampling: Sampling::new(temperature, 0.95, seed + steps as u64)
                        .expect("temperature in range"),
                    samples: n,
                    stop: vec!["\n".into()],
                    vote_key: Some(key.clone()),
                    select: run_select,
                    ..ask.clone()
                };
                let mut widest: Option<Answer> = None;
                let mut chosen: Vec<(usize, String)> = Vec::new();
                // Rotate the order so no N always runs first (after the step's prefill).
                for j in 0..samples.len() {
                    let i = (j + steps) % samples.len();
                    let t = Instant::now();
                    let a = assistant.ask_with_context(
                        "Next action:",
                        context,
                        Some(&system),
                        &sampled(samples[i]),
                        &mut |_| true,
                    )?;
                    n_latency[i].push(t.elapsed().as_secs_f64() * 1e3);
                    chosen.push((samples[i], a.answer.clone()));
                    if samples[i] == max_n {
                        widest = Some(a);
                    }
                }
                let widest = widest.expect("the largest N ran");
                let cands = if max_n == 1 {
                    vec![Candidate {
                        text: widest.answer.clone(),
                        mean_logprob: 0.0,
                        votes: 1,
                        tokens: widest.tokens_generated,
                        verify: None,
                    }]
                } else {
                    widest.candidates.clone()
                };
                let reference_action = parse_action(reference, screen);
                for (ki, &k) in ks.iter().enumerate() {
                    let sels: &[Selector] = if verify {
                        &[Selector::Vote, Selector::Logprob, Selector::Verify]
                    } else {
                        &[Selector::Vote, Selector::Logprob]
                    };
                    for (si, &sel) in sels.iter().enumerate() {
                        let mut first = cands[..k].to_vec();
                        let pick = select::select(&mut first, sel, Some(&key));
                        let got = parse_action(&first[pick].text, screen);
                        k_correct[ki][si] += usize::from(got.is_some() && got == reference_action);
                        // Each N's own run kept what a vote over the widest run's first N keeps.
                        if sel == run_select && k > 1 {
                            for (n, answer) in &chosen {
                                anyhow::ensure!(
                                    *n != k || *answer == first[pick].text,
                                    "step {steps}: {n} samples kept {answer:?}, the widest run's first {n} choose {:?}",
                                    first[pick].text
                                );
                            }
                        }
                    }
                }
                widest
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let got = answer.answer.trim_start();
        let got = got.lines().next().unwrap_or("");
        let ok = match (parse_action(got, screen), parse_action(reference, screen)) {
            (Some(a), Some(r)) => a == r,
            _ => false,
        };
        steps += 1;
        correct += usize::from(ok);
        let e = per_app.entry(app.to_owned()).or_default();
        e.0 += 1;
        e.1 += usize::from(ok);
        latencies.push(ms);
        eprintln!(
            "{} step {:>3} {app:<13} {:>7.0} ms  ref: {reference}  got: {got}",
            if ok { "OK " } else { "BAD" },
            steps,
            ms,
        );
    }
    let _ = std::fs::remove_dir_all(&index_dir);
    if !samples.is_empty() {
        println!("samples at temperature {temperature}, top-p 0.95, seed {seed} + step; accuracy of k samples (the first k of {max_n}):");
        for (ki, &k) in ks.iter().enumerate() {
            let pct = |c: usize| 100.0 * c as f64 / steps.max(1) as f64;
            let judged = if verify {
                format!(
                    ", verify {:.1}% ({}/{steps})",
                    pct(k_correct[ki][2]),
                    k_correct[ki][2]
                )
            } else {
                String::new()
            };
            println!(
                "  k = {k:>2}: vote {:.1}% ({}/{steps}), logprob {:.1}% ({}/{steps}){judged}",
                pct(k_correct[ki][0]),
                k_correct[ki][0],
                pct(k_correct[ki][1]),
                k_correct[ki][1]
            );
        }
        for (i, &n) in samples.iter().enumerate() {
            let mut l = n_latency[i].clone();
            l.sort_by(|a, b| a.total_cmp(b));
            let mean = l.iter().sum::<f64>() / l.len().max(1) as f64;
            println!(
                "  N = {n:>2}: latency per step p50 {:.0} ms, mean {mean:.0} ms ({} steps, same run, order rotated)",
                l.get(l.len() / 2).copied().unwrap_or(0.0),
                l.len()
            );
        }
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let apps: Vec<String> = per_app
        .iter()
        .map(|(a, (n, c))| format!("{a} {c}/{n}"))
        .collect();
    println!(
        "model {model}, prompt {}, steps {steps} (every {every} from {skip}), action accuracy {:.1}% ({correct}/{steps}), latency p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, mean {:.0} ms\nper app: {}",
        if raw { "raw" } else { "one-shot" },
        100.0 * correct as f64 / steps.max(1) as f64,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        latencies.iter().sum::<f64>() / latencies.len().max(1) as f64,
        apps.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCREEN: &str = "Current screen:\n<input id=0 >Search</input>\n \
<button id=1 text='Sort by'></button>\n <button id=4>Clock</button>";

    fn act(verb: &str, id: u32, text: Option<&str>) -> Option<Action> {
        Some(Action {
            verb: verb.into(),
            element_id: Some(id),
            text: text.map(Into::into),
        })
    }

    #[test]
    fn parses_both_action_forms() {
        let p = |s| parse_action(s, SCREEN);
        assert_eq!(
            p("Click on <button id=4>Clock</button> because..."),
            act("click", 4, None)
        );
        assert_eq!(
            p("Input 'Clock' into <input id=0 >Search</input>"),
            act("input", 0, Some("clock"))
        );
        assert_eq!(p("I don't know"), None);
    }

    #[test]
    fn tolerates_variants_of_the_format() {
        let p = |s| parse_action(s, SCREEN);
        assert_eq!(
            p("Next action: click on <button id=1 text='Sort by'></button>"),
            act("click", 1, None)
        );
        assert_eq!(
            p("Type \"clock\" into <input id=0 >Search</input>"),
            act("input", 0, Some("clock"))
        );
        assert_eq!(p("<button id=4>Clock</button>"), act("click", 4, None));
        // A bare element that is an input field with no text to type is still a click.
        assert_eq!(p("<input id=0 >Search</input>"), act("click", 0, None));
        assert_eq!(p("Click on the search field"), None);
    }

    #[test]
    fn examples_never_come_from_the_scored_app() {
        for app in ["applauncher", "notes", "clock"] {
            let s = system_for(app);
            let ex = EXAMPLES.iter().find(|(_, e)| s.contains(e)).unwrap();
            assert_ne!(ex.0, app);
            assert_eq!(EXAMPLES.iter().filter(|(_, e)| s.contains(e)).count(), 1);
        }
    }

    #[test]
    fn finds_element_tags() {
        assert_eq!(tag_of(SCREEN, 0).as_deref(), Some("input"));
        assert_eq!(tag_of(SCREEN, 4).as_deref(), Some("button"));
        assert_eq!(tag_of(SCREEN, 9), None);
    }
}
