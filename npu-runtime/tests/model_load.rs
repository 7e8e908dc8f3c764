//! Loading on several threads builds the same model: the logits of a real model loaded
//! with 1 and with 3 loader threads agree bit for bit (every matrix of every layer and
//! both vocabulary matrices take part in them).

use npu_runtime::session::{LoadOptions, Model, Session, SessionOptions};

fn logits_after(model: std::sync::Arc<Model>, tokens: &[u32]) -> Vec<u32> {
    let mut s = Session::new(
        model,
        SessionOptions {
            kv_capacity: 64,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let mut bits: Vec<u32> = s
        .prefill(&tokens[..20], 0)
        .unwrap()
        .logits
        .iter()
        .map(|v| v.to_bits())
        .collect();
    bits.extend(
        s.decode_step(tokens[20])
            .unwrap()
            .iter()
            .map(|v| v.to_bits()),
    );
    bits
}

#[test]
fn loader_thread_count_does_not_change_the_model() {
    let path = match npu_runtime::model_path::resolve("smollm2-135m") {
        Ok(p) => p,
        Err(e) if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => {
            panic!("{e}: run scripts/fetch-model.sh smollm2-135m (or set RAG_SKIP_MODEL_TESTS=1)")
        }
    };
    let tokens: Vec<u32> = (0..21u32).map(|i| 100 + (i * 7919) % 20000).collect();
    // The session's compute threads equal the loader's; the kernels are thread-count
    // invariant (tested elsewhere), so a difference here can only come from loading.
    let one = logits_after(
        Model::load(
            &path,
            &LoadOptions {
                threads: 1,
                ..Default::default()
            },
        )
        .unwrap(),
        &tokens,
    );
    let three = logits_after(
        Model::load(
            &path,
            &LoadOptions {
                threads: 3,
                ..Default::default()
            },
        )
        .unwrap(),
        &tokens,
    );
    assert_eq!(one.len(), three.len());
    assert!(one == three, "logits differ between 1 and 3 loader threads");
}
