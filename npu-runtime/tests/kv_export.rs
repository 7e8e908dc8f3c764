//! A session restored from another session's exported KV rows continues exactly as the
//! session that computed them: the prompt-head cache of `rag ask` relies on it.

mod common;

use npu_runtime::session::{argmax, Session, SessionOptions};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn imported_kv_continues_bit_for_bit() {
    let Some(model) = common::smollm2() else {
        return;
    };
    let opts = || SessionOptions {
        kv_capacity: 256,
        ..SessionOptions::default()
    };
    let prompt: Vec<u32> = (0..150u32).map(|i| 200 + (i * 7919) % 30000).collect();
    let mut a = Session::new(model.clone(), opts()).unwrap();
    let logits = a.prefill(&prompt, 0).unwrap().logits.to_vec();
    let (want, next) = (bits(&logits), argmax(&logits));
    let want_step = bits(a.decode_step(next).unwrap());
    for head in [1usize, 37, 128, 149] {
        let rows = a.export_kv(head).unwrap();
        let mut b = Session::new(model.clone(), opts()).unwrap();
        // A session with other state is replaced, not appended to.
        b.prefill(&prompt[..5], 0).unwrap();
        b.import_kv(head, &rows).unwrap();
        assert_eq!(b.n_past(), head);
        assert_eq!(
            bits(b.prefill(&prompt[head..], 0).unwrap().logits),
            want,
            "head {head}"
        );
        assert_eq!(bits(b.decode_step(next).unwrap()), want_step, "head {head}");
    }
    // Wrong sizes are errors, and leave the session usable.
    let rows = a.export_kv(10).unwrap();
    let mut c = Session::new(model, opts()).unwrap();
    assert!(c.import_kv(11, &rows).is_err());
    assert!(c.import_kv(10, &rows[1..]).is_err());
    assert!(a.export_kv(a.n_past() + 1).is_err());
    assert!(a.export_kv(0).unwrap().is_empty());
    c.import_kv(10, &rows).unwrap();
    assert_eq!(c.n_past(), 10);
}
