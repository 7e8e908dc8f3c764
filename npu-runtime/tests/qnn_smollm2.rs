//! SmolLM2-135M on the QNN HTP emulator versus the CPU backend: logits of a prompt within
//! the fp16 tolerance and teacher-forced greedy choices identical wherever the CPU's choice is not a near tie. Slow in emulation (about a
//! minute with a cold context cache on 2 cores), so shapes are small: prefill chunks of 8
//! tokens, single-token decode, 64 KV slots.

mod common;
use common::qnn_available;
use npu_runtime::backend::CpuBackend;
use npu_runtime::qnn::{BinaryCache, BlockRunner, QnnBackend};
use npu_runtime::session::{argmax, LoadOptions, Model};
use std::time::Instant;

fn smollm2() -> Option<std::sync::Arc<Model>> {
    match npu_runtime::model_path::resolve("smollm2-135m") {
        Ok(p) => Some(Model::load(&p, &LoadOptions::default()).unwrap()),
        Err(e) if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => {
            panic!("{e}: run scripts/fetch-model.sh smollm2-135m (or set RAG_SKIP_MODEL_TESTS=1)")
        }
    }
}

#[test]
fn smollm2_logits_and_confident_greedy_tokens_match_cpu() {
    if !qnn_available() {
        return;
    }
    let Some(model) = smollm2() else { return };
    let (chunk, cap, blocks) = (8, 64, 2);
    let prompt = model
        .tokenizer()
        .encode("The capital of France is", false)
        .unwrap();
    let t0 = Instant::now();
    let qb = QnnBackend::new(
        model.clone(),
        cap,
        Some(BinaryCache::new(BinaryCache::default_dir())),
    )
    .unwrap();
    let mut q = BlockRunner::new(qb, model.clone(), blocks, chunk, cap).unwrap();
    eprintln!("qnn compile+load: {:.1}s", t0.elapsed().as_secs_f64());
    let mut c = BlockRunner::new(
        CpuBackend::new(model.clone(), cap),
        model.clone(),
        blocks,
        chunk,
        cap,
    )
    .unwrap();

    // Logits of the prompt: fp16 tolerance relative to the logit range.
    let lq = q.prefill(&prompt).unwrap().to_vec();
    let lc = c.prefill(&prompt).unwrap().to_vec();
    let scale = lc.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = lq
        .iter()
        .zip(&lc)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("prompt logits: max |qnn - cpu| = {worst:.3} (max |logit| {scale:.1})");
    assert!(
        worst <= 0.05 * scale,
        "max |qnn - cpu| = {worst} vs logit scale {scale}"
    );
    assert_eq!(argmax(&lq), argmax(&lc));

    // 16 greedy steps, teacher-forced with the CPU's token so both backends always see
    // the same context. fp16 logits differ from the CPU's by up to ~0.8 here (see
    // docs/qnn.md), so only steps whose CPU top-2 margin is at least MIN_MARGIN must agree;
    // the others are counted and printed.
    const MIN_MARGIN: f32 = 2.0 * 0.8;
    let fresh_q = QnnBackend::new(
        model.clone(),
        cap,
        Some(BinaryCache::new(BinaryCache::default_dir())),
    )
    .unwrap();
    let mut q = BlockRunner::new(fresh_q, model.clone(), blocks, chunk, cap).unwrap();
    let mut c = BlockRunner::new(
        CpuBackend::new(model.clone(), cap),
        model.clone(),
        blocks,
        chunk,
        cap,
    )
    .unwrap();
    let t1 = Instant::now();
    let (mut tq, mut tc, mut margins) = (Vec::new(), Vec::new(), Vec::new());
    let mut lq = q.prefill(&prompt).unwrap().to_vec();
    let mut lc = c.prefill(&prompt).unwrap().to_vec();
    for step in 0..16 {
        let (a, b) = (argmax(&lq), argmax(&lc));
        let mut s = lc.clone();
        s.sort_by(|x, y| y.total_cmp(x));
        margins.push(s[0] - s[1]);
        tq.push(a);
        tc.push(b);
        if step < 15 {
            lq = q.decode_step(b).unwrap().to_vec();
            lc = c.decode_step(b).unwrap().to_vec();
        }
    }
    eprintln!(
        "qnn prefill + 15 decode steps: {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    let text = |t: &[u32]| model.tokenizer().decode(t).unwrap_or_default();
    let agree = tq.iter().zip(&tc).filter(|(a, b)| a == b).count();
    eprintln!(
        "cpu: {:?}\nqnn argmax: {:?}\nagree {agree}/16, cpu top-2 margins: {margins:.2?}",
        text(&tc),
        text(&tq)
    );
    let confident: Vec<usize> = (0..16).filter(|&i| margins[i] >= MIN_MARGIN).collect();
    assert!(
        confident.len() >= 4,
        "too few confident steps: margins {margins:.2?}"
    );
    for &i in &confident {
        assert_eq!(
            tq[i], tc[i],
            "step {i}: argmax differs at CPU margin {:.2}",
            margins[i]
        );
    }
}
