//! The schedules executed on the QNN HTP emulator, where a switch is a real `contextFree`
//! of the G1 context and `contextCreateFromBinary` of the G2 one. CI scale: SmolLM2 in 2
//! blocks, chunks of 32 tokens on G1 and G2 graphs of 16 rows (a chunk on G2 is two runs),
//! a 64-token prompt (two full chunks), 96 KV slots. Warm-up must measure non-zero loads,
//! frees and the context binaries' memory. The prefill output (logits and every KV row)
//! and the first decode step must be bit-identical to sync's (all prefill on G1, switches
//! after it) for async, the paper's greedy (which computes 3 of the 4 steps on G2, among
//! them a full chunk of the first block) and the exact optimum. G2 graphs of fewer than 16
//! rows (less precise HTP code) are refused.

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
    let cache = || Some(BinaryCache::new(BinaryCache::default_dir()));
    let refused = QnnExecutor::new_qnn(model.clone(), 2, 32, 8, 96, cache());
    assert!(refused.is_err_and(|e| e.to_string().contains("at least 16 rows")));
    let exec = QnnExecutor::new_qnn(model.clone(), 2, 32, 16, 96, cache()).unwrap();
    eprintln!(
        "compile (or cache read): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab).collect();

    // Warm-up on the first chunk: real loads and frees, memory of the context binaries.
    exec.set_prompt(&prompt[..32]).unwrap();
    exec.reset_forms().unwrap();
    let t1 = Instant::now();
    let profile = warmup_profile(
        &exec,
        &WarmupConfig {
            model: "smollm2-135m".into(),
            backend: "qnn".into(),
            machine: "test".into(),
            chunk_tokens: 32,
            g2_tokens: 16,
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
    let kinds = [
        ScheduleKind::Sync,
        ScheduleKind::Async,
        ScheduleKind::Progressive,
        ScheduleKind::Optimal,
    ];
    for kind in kinds {
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
        g2_steps.push(rep.forms.clone());
        eprintln!("{}: {:?} {:?}", kind.name(), rep.forms, rep.metrics(0));
    }
    use Form::{G1, G2};
    assert_eq!(g2_steps[0], [G1; 4], "sync computes everything on G1");
    // Steps are (block 0, chunk 0), (1, 0), (0, 1), (1, 1): the greedy runs the first
    // block's second (full) chunk on G2 too.
    assert_eq!(g2_steps[2], [G1, G2, G2, G2], "progressive");
    assert_eq!(g2_steps[3], [G1, G1, G1, G2], "optimal");
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
}
