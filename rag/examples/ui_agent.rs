//! A UI-automation agent on top of `rag::Assistant`: for each recorded DroidTask step it
//! passes the current screen as context, asks for the next action, and scores the answer
//! against the reference action. Reports action accuracy and per-step latency.
//!
//!     cargo run --release -p rag --example ui_agent -- [DATASET] [--limit N] [--model M]
//!
//! DATASET defaults to ../shared/data/ui/droidtask_ui.jsonl. An action is correct when its
//! verb (Click / Input), the element id and, for Input, the typed text match the reference.

use anyhow::{Context, Result};
use rag::assistant::{AskOptions, Assistant, AssistantOptions};
use std::time::Instant;

#[derive(Debug, PartialEq)]
struct Action {
    verb: String,
    element_id: Option<u32>,
    text: Option<String>,
}

/// The first "Click on <...>" or "Input '...' into <...>" in `s`.
fn parse_action(s: &str) -> Option<Action> {
    let lower = s.to_lowercase();
    let (verb, start) = match (lower.find("click on"), lower.find("input '")) {
        (Some(c), Some(i)) if i < c => ("input", i),
        (Some(c), _) => ("click", c),
        (None, Some(i)) => ("input", i),
        (None, None) => return None,
    };
    let rest = &s[start..];
    let text = if verb == "input" {
        let after = &rest[7..];
        after.find('\'').map(|end| after[..end].to_owned())
    } else {
        None
    };
    let element_id = rest.find("id=").and_then(|p| {
        let digits: String = rest[p + 3..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    });
    Some(Action {
        verb: verb.to_owned(),
        element_id,
        text,
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut dataset = "../shared/data/ui/droidtask_ui.jsonl".to_owned();
    let mut limit = 40usize;
    let mut model = rag::models::DEFAULT_MODEL.to_owned();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--limit" => limit = args.next().context("--limit N")?.parse()?,
            "--model" => model = args.next().context("--model M")?,
            other => dataset = other.to_owned(),
        }
    }
    let text = std::fs::read_to_string(&dataset).with_context(|| format!("reading {dataset}"))?;
    let index_dir = std::env::temp_dir().join(format!("rag-ui-agent-{}", std::process::id()));
    let mut opts = AssistantOptions::new(&index_dir);
    opts.model = model;
    opts.dense = false; // the agent brings its own context; no retrieval needed
    let assistant = Assistant::open(opts)?;
    let ask = AskOptions {
        max_tokens: 48,
        ..AskOptions::default()
    };

    let (mut steps, mut correct, mut latencies) = (0usize, 0usize, Vec::new());
    for line in text.lines().filter(|l| !l.trim().is_empty()).take(limit) {
        let rec: serde_json::Value = serde_json::from_str(line)?;
        let prompt = rec["turns"][0]
            .as_str()
            .context("record without turns[0]")?;
        let reference = rec["reference"]
            .as_str()
            .context("record without reference")?;
        // The recorded prompt already holds the task, the actions so far and the screen;
        // the agent sends it as one user turn (the screen is the caller-supplied context).
        let (context, question) =
            match (prompt.find("Current screen:"), prompt.rfind("\nReply with")) {
                (Some(a), Some(b)) if a < b => (
                    prompt[a..b].to_owned(),
                    format!("{}{}", &prompt[..a], prompt[b..].trim_start()),
                ),
                _ => (String::new(), prompt.to_owned()),
            };
        let t = Instant::now();
        let answer = assistant.ask_with_context(&question, &context, None, &ask, &mut |_| true)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let ok = match (parse_action(&answer.answer), parse_action(reference)) {
            (Some(a), Some(r)) => a == r,
            _ => false,
        };
        steps += 1;
        correct += usize::from(ok);
        latencies.push(ms);
        eprintln!(
            "{} step {:>3} {:>7.0} ms  ref: {reference}  got: {}",
            if ok { "OK " } else { "BAD" },
            steps,
            ms,
            answer.answer.lines().next().unwrap_or("")
        );
    }
    let _ = std::fs::remove_dir_all(&index_dir);
    latencies.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "steps {steps}, action accuracy {:.1}% ({correct}/{steps}), latency p50 {:.0} ms, p90 {:.0} ms",
        100.0 * correct as f64 / steps.max(1) as f64,
        pct(0.5),
        pct(0.9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_action_forms() {
        let a = parse_action("Click on <button id=4>Clock</button> because...").unwrap();
        assert_eq!(
            a,
            Action {
                verb: "click".into(),
                element_id: Some(4),
                text: None
            }
        );
        let b = parse_action("Input 'Clock' into <input id=0 >Search</input>").unwrap();
        assert_eq!(
            b,
            Action {
                verb: "input".into(),
                element_id: Some(0),
                text: Some("Clock".into())
            }
        );
        assert!(parse_action("I don't know").is_none());
    }
}
