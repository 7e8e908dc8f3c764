//! SmolLM2-135M on the QNN HTP emulator against the exact reference (a scalar f64 forward
//! pass over the same dequantized weights, `common::oracle`) and against the CPU backend,
//! over several prompts, 16 greedy steps each.
//!
//! The CPU backend quantizes activations to int8 for its matmuls, so it is itself an
//! approximation: measured on these prompts it is 2-3x farther from the exact logits than
//! the fp16 QNN graphs are (docs/qnn.md, "Accuracy"). Tolerances are therefore stated
//! against the exact reference, per backend.
//!
//! Teacher forcing: every backend is fed the CPU's own greedy tokens, so all see the same
//! context; a step where QNN picks the CPU's token at every position up to it is exactly
//! a step the free-running QNN generation reproduces, so the leading-agreement count is the
//! free-running match length. QNN rows come from the 16-token graphs: the prompt, then the
//! continuation as one token chain in a tree batch (logits of every row): two executions.
//!
//! Graphs are compiled without a disk cache (nothing is written); emulation is slow, so
//! shapes are small: 2 blocks of 15 layers, 16-token graphs only, 64 KV slots.

mod common;
use common::{oracle, qnn_available, smollm2};
use npu_runtime::backend::{Backend, CpuBackend};
use npu_runtime::qnn::{BlockRunner, QnnBackend};
use npu_runtime::session::argmax;
use std::time::Instant;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a little",
];
/// Greedy steps per prompt (logit rows compared).
const STEPS: usize = 16;
/// Graph rows: a prompt in one execution, then the 15 continuation tokens in one tree.
const CHUNK: usize = 16;
/// Max |logit - exact| allowed, as a fraction of the prompt's largest |exact logit|.
/// Measured on these prompts: QNN 0.30-0.35 % with 16-row graphs (0.9-1.2 % with graphs of
/// 8 rows or fewer, see docs/qnn.md), CPU 2.8-3.8 %.
const QNN_TOL: f64 = 0.005;
const CPU_TOL: f64 = 0.045;

/// Logit rows for positions `p - 1 .. seq.len() - 1` (each predicting the next token),
/// teacher-forced with `seq`, `p` = prompt length.
fn teacher_forced<B: Backend>(r: &mut BlockRunner<B>, seq: &[u32], p: usize) -> Vec<Vec<f32>> {
    let (vocab, chunk) = (r.model().vocab_size(), CHUNK);
    r.reset().unwrap();
    let mut rows = vec![r.prefill(&seq[..p]).unwrap().to_vec()];
    let mut pos = p;
    while pos < seq.len() {
        let n = (seq.len() - pos).min(chunk);
        let parents: Vec<i32> = (0..n as i32).map(|i| i - 1).collect();
        let l = r.forward_tree(&seq[pos..pos + n], &parents).unwrap();
        rows.extend(l.chunks(vocab).map(<[f32]>::to_vec));
        if pos + n < seq.len() {
            r.prefill(&seq[pos..pos + n]).unwrap();
        }
        pos += n;
    }
    rows
}

fn top2(row: &[f64]) -> (usize, f64) {
    let (mut a, mut b) = (0, usize::MAX);
    for (i, &x) in row.iter().enumerate().skip(1) {
        if x > row[a] {
            (a, b) = (i, a);
        } else if b == usize::MAX || x > row[b] {
            b = i;
        }
    }
    (a, row[a] - row[b])
}

fn max_diff(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max)
}

#[test]
fn smollm2_logits_and_greedy_tokens_match_the_exact_reference_and_cpu() {
    if !qnn_available() {
        return;
    }
    let Some(model) = smollm2() else { return };
    let (cap, blocks) = (64, 2);
    let vocab = model.vocab_size();
    let t0 = Instant::now();
    let qb = QnnBackend::new(model.clone(), cap, None).unwrap();
    let mut q = BlockRunner::prefill_only(qb, model.clone(), blocks, CHUNK, cap).unwrap();
    eprintln!("qnn compile+load: {:.1}s", t0.elapsed().as_secs_f64());
    let mut c = BlockRunner::new(
        CpuBackend::new(model.clone(), cap),
        model.clone(),
        blocks,
        CHUNK,
        cap,
    )
    .unwrap();
    let (mut t_qnn, mut t_oracle) = (0.0, 0.0);
    for text in PROMPTS {
        let prompt = model.tokenizer().encode(text, false).unwrap();
        let p = prompt.len();
        // The CPU's greedy continuation; its logits are teacher-forced by construction.
        c.reset().unwrap();
        let mut lc = vec![c.prefill(&prompt).unwrap().to_vec()];
        let mut seq = prompt.clone();
        for _ in 1..STEPS {
            let t = argmax(lc.last().unwrap());
            seq.push(t);
            lc.push(c.decode_step(t).unwrap().to_vec());
        }
        let t1 = Instant::now();
        let lq = teacher_forced(&mut q, &seq, p);
        t_qnn += t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let exact = oracle::forward(&model, &seq);
        t_oracle += t2.elapsed().as_secs_f64();
        let exact: Vec<&[f64]> = exact.chunks(vocab).skip(p - 1).collect();
        assert_eq!((lq.len(), lc.len(), exact.len()), (STEPS, STEPS, STEPS));

        let scale = exact
            .iter()
            .flat_map(|r| r.iter())
            .fold(0f64, |m, x| m.max(x.abs()));
        let (mut dq, mut dc) = (0f64, 0f64);
        let (mut q_exact, mut c_exact, mut q_cpu, mut lead) = (0, 0, 0, None);
        for s in 0..STEPS {
            let (best, margin) = top2(exact[s]);
            let (aq, ac) = (argmax(&lq[s]) as usize, argmax(&lc[s]) as usize);
            dq = dq.max(max_diff(&lq[s], exact[s]));
            dc = dc.max(max_diff(&lc[s], exact[s]));
            q_exact += usize::from(aq == best);
            c_exact += usize::from(ac == best);
            q_cpu += usize::from(aq == ac);
            if aq != ac && lead.is_none() {
                lead = Some(s);
            }
            // Beyond twice the error bound a choice cannot flip: QNN must pick the exact
            // reference's token, and the CPU's wherever the CPU's own bound allows.
            if margin > 2.0 * QNN_TOL * scale {
                assert_eq!(aq, best, "{text:?} step {s}: exact margin {margin:.2}");
            }
            let lc64: Vec<f64> = lc[s].iter().map(|&x| f64::from(x)).collect();
            let (_, cpu_margin) = top2(&lc64);
            if cpu_margin > 2.0 * (QNN_TOL + CPU_TOL) * scale {
                assert_eq!(aq, ac, "{text:?} step {s}: CPU margin {cpu_margin:.2}");
            }
        }
        let lead = lead.unwrap_or(STEPS);
        eprintln!(
            "{text:?} -> {:?}\n  max |qnn - exact| {dq:.3} ({:.2}%), max |cpu - exact| {dc:.3} \
             ({:.2}%), max |exact| {scale:.1}\n  argmax = exact: qnn {q_exact}/{STEPS}, cpu \
             {c_exact}/{STEPS}; qnn = cpu {q_cpu}/{STEPS}, free-running match {lead}/{STEPS}",
            model.tokenizer().decode(&seq[p..]).unwrap_or_default(),
            100.0 * dq / scale,
            100.0 * dc / scale,
        );
        assert!(dq <= QNN_TOL * scale, "{text:?}: qnn error {dq:.3}");
        assert!(dc <= CPU_TOL * scale, "{text:?}: cpu error {dc:.3}");
    }
    eprintln!("qnn teacher-forced rows: {t_qnn:.1}s, exact reference: {t_oracle:.1}s");
}
