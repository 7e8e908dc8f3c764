//! The schedules executed on the QNN HTP emulator, where a switch is a real `contextFree`
//! of the G1 context and `contextCreateFromBinary` of the G2 one. CI scale: SmolLM2 in 2
//! blocks, chunks of 8 tokens, G2 runs of 4, a 12-token prompt (one full chunk and a
//! partial one), 64 KV slots. Warm-up must measure non-zero loads, frees and the context
//! binaries' memory; the prefill output (logits and KV) and first decode step of the
//! paper's greedy (P0's partial chunk and all of P1 on G2) must equal sync's, which
//! switches only after prefill. Not bit-exact on this backend, and so not asserted here: a
//! full chunk of the first block on G2 (0.047 max logit difference, docs/scheduling.md).

mod common;
use common::{qnn_available, smollm2};
use npu_runtime::qnn::BinaryCache;
use npu_runtime::schedule::exec::execute;
use npu_runtime::schedule::qnn::QnnExecutor;
use npu_runtime::schedule::sim::{EventKind, Unit};
use npu_runtime::schedule::warmup::{warmup_profile, WarmupConfig};
use npu_runtime::schedule::{Form, Instance, ScheduleKind};
use std::time::Instant;

#[test]
fn qnn_switches_are_real_and_leave_the_prefill_output_unchanged() {
    if !qnn_available() {
        return;
    }
    let Some(model) = smollm2() else { return };
    let t0 = Instant::now();
    let exec = QnnExecutor::new_qnn(
        model.clone(),
        2,
        8,
        4,
        64,
        Some(BinaryCache::new(BinaryCache::default_dir())),
    )
    .unwrap();
    eprintln!(
        "compile (or cache read): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 7919 + 13) % vocab).collect();

    // Warm-up on the first chunk: real loads and frees, memory of the context binaries.
    exec.set_prompt(&prompt[..8]).unwrap();
    exec.reset_forms().unwrap();
    let t1 = Instant::now();
    let profile = warmup_profile(
        &exec,
        &WarmupConfig {
            model: "smollm2-135m".into(),
            backend: "qnn".into(),
            machine: "test".into(),
            chunk_tokens: 8,
            g2_tokens: 4,
            layers: exec.layer_labels(),
            reps: 1,
            switch_needed: true,
        },
    )
    .unwrap();
    eprintln!(
        "warm-up: {:.1} s\n{}",
        t1.elapsed().as_secs_f64(),
        profile.to_json()
    );
    assert_eq!(profile.blocks.len(), 2);
    for b in &profile.blocks {
        assert!(b.g1_chunk_ms > 0.0 && b.g2_chunk_ms > 0.0, "{b:?}");
        assert!(b.load_g2_ms > 0.0 && b.unload_g1_ms > 0.0, "{b:?}");
        // fp16 weights of 15 layers: far more than activation buffers.
        assert!(
            b.mem_g1_bytes > 10 << 20 && b.mem_g2_bytes > 10 << 20,
            "{b:?}"
        );
    }

    exec.set_prompt(&prompt).unwrap();
    let (n, c) = (exec.n_blocks(), exec.n_chunks());
    assert_eq!((n, c), (2, 2));
    // Sync (everything on G1, then the switches) is the reference: the run without
    // switching during prefill. The paper's greedy, on an instance where loads are cheap
    // enough to start in the first chunk, computes steps on G2.
    let inst = Instance::uniform(n, c, 10, 11, 15, 1, 5);
    let mut reference: Option<(Vec<f32>, Vec<f32>, Vec<f32>)> = None;
    let mut g2_steps = Vec::new();
    for kind in [ScheduleKind::Sync, ScheduleKind::Progressive] {
        let plan = kind.plan(&inst).unwrap();
        exec.reset_forms().unwrap();
        let rep = execute(&exec, n, c, &plan, false).unwrap();
        let (logits, kv) = exec.output();
        assert!(logits.iter().all(|x| x.is_finite()) && logits.iter().any(|&x| x != 0.0));
        let (ref_logits, ref_kv, ref_decode) = reference
            .get_or_insert_with(|| (logits.clone(), kv.clone(), exec.decode_logits()))
            .clone();
        let worst = logits
            .iter()
            .zip(&ref_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            logits == ref_logits,
            "{}: logits differ from sync's (max |diff| {worst})",
            kind.name()
        );
        assert!(kv == ref_kv, "{}: KV cache differs", kind.name());
        assert!(exec.decode_logits() == ref_decode, "{}", kind.name());
        // Every block was freed and reloaded, for real and with measurable duration.
        for b in 0..n {
            let ev = |want: fn(&EventKind, usize) -> bool| {
                rep.events
                    .iter()
                    .filter(|e| e.unit == Unit::Loader && want(&e.kind, b))
                    .count()
            };
            assert_eq!(
                ev(|k, b| matches!(k, EventKind::Unload { block, form: Form::G1 } if *block == b)),
                1
            );
            assert_eq!(
                ev(|k, b| matches!(k, EventKind::Load { block, form: Form::G2 } if *block == b)),
                1
            );
        }
        g2_steps.push(rep.forms.iter().filter(|&&f| f == Form::G2).count());
        eprintln!("{}: {:?}", kind.name(), rep.metrics(0));
    }
    assert_eq!(g2_steps[0], 0, "sync computes everything on G1");
    assert!(g2_steps[1] > 0, "progressive computes on G2: {g2_steps:?}");
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
}
