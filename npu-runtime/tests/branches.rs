//! Multi-sequence decoding: N branches decoded together over one prefilled prompt give
//! every branch bit for bit the logits, and so the tokens, of that branch decoded alone.

mod common;

use npu_runtime::kv_cache::KvPrecision;
use npu_runtime::session::{
    argmax, decode_branches, generate_picked, Session, SessionOptions, StopReason,
};
use std::collections::HashMap;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn opts(kv_precision: KvPrecision) -> SessionOptions {
    SessionOptions {
        kv_capacity: 512,
        max_verify: 16,
        kv_precision,
        ..SessionOptions::default()
    }
}

/// A reproducible sampled choice: Gumbel-max over the logits with noise keyed by
/// (seed, index, token), so a branch's choices depend only on its seed and its logits.
fn gumbel_pick(seed: u64) -> impl FnMut(&[f32], usize) -> u32 {
    move |logits: &[f32], i: usize| {
        let mut best = (f32::NEG_INFINITY, 0u32);
        for (t, &l) in logits.iter().enumerate() {
            let mut z = seed ^ ((i as u64) << 32) ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let g = -(-u.ln()).ln() as f32;
            if l + g > best.0 {
                best = (l + g, t as u32);
            }
        }
        best.1
    }
}

fn prompt() -> Vec<u32> {
    (0..90u32).map(|i| 300 + (i * 7919) % 20000).collect()
}

#[test]
fn every_branch_equals_the_branch_decoded_alone() {
    let Some(model) = common::smollm2() else {
        return;
    };
    for precision in [KvPrecision::F32, KvPrecision::F16] {
        let prompt = prompt();
        let max_tokens = 24;
        let seeds = [3u64, 11, 12, 40, 41];
        // Each branch's logits at each index, decoded together.
        let mut seen: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
        let mut together = Session::new(model.clone(), opts(precision)).unwrap();
        let (outs, stats) = {
            let seen = std::cell::RefCell::new(&mut seen);
            let mut picks: Vec<_> = seeds
                .iter()
                .enumerate()
                .map(|(b, &s)| {
                    let mut pick = gumbel_pick(s);
                    let seen = &seen;
                    move |l: &[f32], i: usize| {
                        seen.borrow_mut().insert((b, i), bits(l));
                        pick(l, i)
                    }
                })
                .collect();
            // A branch that stops early through the callback leaves the others running.
            let mut emitted = vec![0usize; seeds.len()];
            decode_branches(&mut together, &prompt, max_tokens, &mut picks, |b, _| {
                emitted[b] += 1;
                !(b == 2 && emitted[b] == 7)
            })
            .unwrap()
        };
        assert_eq!(
            together.n_past(),
            prompt.len(),
            "only the prompt stays committed"
        );
        assert_eq!(together.held_rows(), 0);
        assert_eq!(outs[2].stop, StopReason::Callback);
        assert_eq!(outs[2].tokens.len(), 7);
        assert_eq!(
            stats.generated,
            outs.iter().map(|o| o.tokens.len()).sum::<usize>()
        );
        // One forward per step after the prefill: the longest branch's tokens but its first
        // (from the prefill), plus one more if it ended on an end-of-generation token (that
        // token was computed, not kept).
        let longest = outs.iter().max_by_key(|o| o.tokens.len()).unwrap();
        let eog = usize::from(longest.stop == StopReason::EndOfGeneration);
        assert_eq!(
            stats.steps,
            longest.tokens.len() - 1 + eog,
            "{:?}",
            longest.stop
        );
        let distinct: std::collections::HashSet<_> = outs.iter().map(|o| &o.tokens).collect();
        assert!(distinct.len() > 1, "seeds gave identical branches");

        for (b, &seed) in seeds.iter().enumerate() {
            let mut alone = Session::new(model.clone(), opts(precision)).unwrap();
            let mut pick = gumbel_pick(seed);
            let mut got = Vec::new();
            let mut i_seen = 0;
            let limit = outs[b].tokens.len();
            let mut check = |l: &[f32], i: usize| {
                if let Some(want) = seen.get(&(b, i)) {
                    assert_eq!(&bits(l), want, "{precision:?} branch {b} index {i}");
                    i_seen += 1;
                }
                pick(l, i)
            };
            generate_picked(&mut alone, &prompt, limit, &mut check, |t| {
                got.push(t);
                true
            })
            .unwrap();
            assert_eq!(got, outs[b].tokens, "{precision:?} branch {b}");
            assert!(
                i_seen >= limit.min(max_tokens),
                "branch {b} compared {i_seen}"
            );
            // The log-probability the branch reports is that of its own tokens.
            assert!(outs[b].logprob < 0.0 && outs[b].logprob.is_finite());
        }
    }
}

#[test]
fn greedy_branches_equal_greedy_decoding_and_the_session_continues() {
    let Some(model) = common::smollm2() else {
        return;
    };
    let prompt = prompt();
    let mut s = Session::new(model.clone(), opts(KvPrecision::F32)).unwrap();
    let mut picks = vec![|l: &[f32], _: usize| argmax(l); 3];
    let (outs, _) = decode_branches(&mut s, &prompt, 16, &mut picks, |_, _| true).unwrap();
    let mut alone = Session::new(model.clone(), opts(KvPrecision::F32)).unwrap();
    let mut want = Vec::new();
    npu_runtime::session::generate_greedy(&mut alone, &prompt, 16, |t| {
        want.push(t);
        true
    })
    .unwrap();
    for o in &outs {
        assert_eq!(o.tokens, want);
        assert_eq!(o.stop, StopReason::MaxTokens);
    }
    // Same log-probabilities for identical branches.
    assert_eq!(outs[0].logprob.to_bits(), outs[2].logprob.to_bits());
    // The branches' rows are gone: the session continues from the prompt.
    let mut fresh = Session::new(model, opts(KvPrecision::F32)).unwrap();
    fresh.prefill(&prompt, 0).unwrap();
    assert_eq!(
        bits(s.decode_step(want[0]).unwrap()),
        bits(fresh.decode_step(want[0]).unwrap())
    );
}

#[test]
fn bad_branch_batches_are_errors() {
    let Some(model) = common::smollm2() else {
        return;
    };
    let mut s = Session::new(model, opts(KvPrecision::F32)).unwrap();
    s.prefill(&prompt(), 0).unwrap();
    assert!(
        s.forward_branches(&[1, 2], &[&[]]).is_err(),
        "tails mismatch"
    );
    assert!(s.forward_branches(&[], &[]).is_err(), "empty batch");
    assert!(
        s.forward_branches(&[1; 17], &[&[][..]; 17]).is_err(),
        "beyond max_verify"
    );
    assert!(
        s.forward_branches(&[1], &[&[0]]).is_err(),
        "no held rows yet"
    );
    s.forward_branches(&[1, 2], &[&[], &[]]).unwrap();
    assert_eq!(s.held_rows(), 2);
    assert!(s.forward_branches(&[1], &[&[1, 0]]).is_err(), "descending");
    assert!(s.forward_branches(&[1], &[&[2]]).is_err(), "not yet held");
    s.forward_branches(&[3, 4], &[&[0], &[1]]).unwrap();
    assert_eq!(s.held_rows(), 4);
    let mut picks: Vec<fn(&[f32], usize) -> u32> = vec![];
    assert!(decode_branches(&mut s, &[5], 4, &mut picks, |_, _| true).is_err());
    // Another forward drops the held rows.
    s.decode_step(5).unwrap();
    assert_eq!(s.held_rows(), 0);
}
