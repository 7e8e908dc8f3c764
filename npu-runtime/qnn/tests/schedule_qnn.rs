//! The schedules executed on the QNN HTP emulator through a `Session<QnnBackend>`'s own
//! graphs (`Session::prefill_planned`), where a switch is a real `contextFree` of the G1
//! context and `contextCreateFromBinary` of the G2 one. CI scale: SmolLM2 in 2 blocks,
//! chunks of 32 tokens on G1 and G2 graphs of 16 rows (a chunk on G2 is two runs), a
//! 64-token prompt (two full chunks), 96 KV slots. Warm-up (`Session::profile_forms`) must
//! measure non-zero loads, frees and the context binaries' memory. The prefill output
//! (logits and every KV row) and the first decode step must be bit-identical to sync's
//! (all prefill on G1, switches after it) for async, the paper's greedy (which computes 3
//! of the 4 steps on G2, among them a full chunk of the first block) and the exact optimum.

mod common;
use common::{qnn_available, smollm2};
use npu_qnn::{BinaryCache, QnnBackend};
use npu_runtime::schedule::sim::{EventKind, Unit};
use npu_runtime::schedule::{Form, Instance, ScheduleKind};
use npu_runtime::session::{argmax, Session, SessionOptions};
use std::time::Instant;

#[test]
fn qnn_switches_are_real_and_leave_the_prefill_output_unchanged() {
    if !qnn_available() {
        return;
    }
    let Some(model) = smollm2() else { return };
    let t0 = Instant::now();
    let backend = QnnBackend::new(
        model.clone(),
        96,
        Some(BinaryCache::new(BinaryCache::default_dir())),
    )
    .unwrap();
    let opts = SessionOptions {
        kv_capacity: 96,
        prefill_chunk: 32,
        max_verify: 16,
        min_verify: 16,
        blocks: 2,
        ..SessionOptions::default()
    };
    let mut s = Session::with_backend(backend, model.clone(), opts).unwrap();
    eprintln!(
        "compile (or cache read): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab).collect();

    // Warm-up on the first chunk: real loads and frees, memory of the context binaries.
    let t1 = Instant::now();
    let profile = s.profile_forms("smollm2-135m", "test", 1).unwrap();
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

    let (n, c) = (2, 2);
    // Sync (everything on G1, then the switches) is the reference: the run without
    // switching during prefill. The paper's greedy, on an instance where loads are cheap
    // enough to start in the first chunk, computes steps on G2.
    let inst = Instance::uniform(n, c, 10, 11, 15, 1, 5);
    let mut reference: Option<(Vec<f32>, Vec<f32>, Vec<f32>)> = None;
    let decode = |s: &mut Session<QnnBackend>, logits: &[f32]| {
        s.decode_step(argmax(logits)).unwrap().to_vec()
    };
    let mut g2_steps = Vec::new();
    let kinds = [
        ScheduleKind::Sync,
        ScheduleKind::Async,
        ScheduleKind::Progressive,
        ScheduleKind::Optimal,
    ];
    for kind in kinds {
        let plan = kind.plan(&inst).unwrap();
        let (rep, logits) = s.prefill_planned(&prompt, &plan, false).unwrap();
        let kv = s.export_kv(prompt.len()).unwrap();
        let first = decode(&mut s, &logits);
        assert!(logits.iter().all(|x| x.is_finite()) && logits.iter().any(|&x| x != 0.0));
        let (ref_logits, ref_kv, ref_decode) = reference
            .get_or_insert_with(|| (logits.clone(), kv.clone(), first.clone()))
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
        assert!(first == ref_decode, "{}", kind.name());
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
