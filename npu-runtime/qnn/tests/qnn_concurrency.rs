//! May QNN load and free one context while another executes? The API headers say nothing
//! about threads, so this asks the library: one thread executes graph A back to back,
//! another repeatedly loads graph B's context binary (`contextCreateFromBinary` +
//! `graphRetrieve`), executes it once and frees it (`contextFree`). Every result must equal
//! the same graph's result computed alone, and no call may fail. With the default shared
//! call lock QNN calls must have overlapped for real (the runtime counts the calls holding
//! its lock at once); with `set_serial_calls(true)` (one process-wide lock for every call) they
//! never do.

mod common;
use common::{h, qnn_available, rand_vec};
use npu_qnn::{Context, DType, IoTensor};
use std::time::Instant;

struct Binary {
    bytes: Vec<u8>,
    inputs: Vec<IoTensor>,
    outputs: Vec<IoTensor>,
}

/// `x [rows, k]` through `layers` fp16 FullyConnected layers of `k x k` (scaled to keep the
/// values in range), serialized.
fn fc_chain(name: &str, rows: u32, k: u32, layers: u32, seed: u64) -> Binary {
    let ctx = Context::new().unwrap();
    let mut g = ctx.build(name).unwrap();
    let mut x = g.input(DType::F16, &[rows, k]).unwrap();
    for l in 0..layers {
        let w: Vec<f32> = rand_vec((k * k) as usize, seed + u64::from(l))
            .iter()
            .map(|v| v / (k as f32).sqrt())
            .collect();
        let w = g.constant(DType::F16, &[k, k], h(&w)).unwrap();
        let y = if l + 1 == layers {
            g.output(DType::F16, &[rows, k]).unwrap()
        } else {
            g.native(DType::F16, &[rows, k]).unwrap()
        };
        g.node("FullyConnected", &[x, w], &[y], vec![]).unwrap();
        x = y;
    }
    let graph = g.finalize().unwrap();
    let (inputs, outputs) = (graph.inputs().to_vec(), graph.outputs().to_vec());
    drop(graph);
    Binary {
        bytes: ctx.binary().unwrap(),
        inputs,
        outputs,
    }
}

fn run(ctx: &Context, name: &str, b: &Binary, input: &[u8]) -> Vec<u8> {
    let mut g = ctx
        .graph(name, b.inputs.clone(), b.outputs.clone())
        .unwrap();
    let mut out = vec![0u8; b.outputs[0].bytes()];
    g.execute(&[input], &mut [&mut out]).unwrap();
    out
}

/// Runs the two threads; returns the most QNN calls that ran at once and the wall time.
fn overlap_round(
    a: &Binary,
    b: &Binary,
    xa: &[u8],
    xb: &[u8],
    ya: &[u8],
    yb: &[u8],
) -> (usize, f64) {
    let t0 = Instant::now();
    let rt = npu_qnn::runtime().unwrap();
    rt.take_max_concurrent_calls();
    std::thread::scope(|s| {
        s.spawn(|| {
            let ctx = Context::from_binary(&a.bytes).unwrap();
            let mut g = ctx.graph("a", a.inputs.clone(), a.outputs.clone()).unwrap();
            let mut out = vec![0u8; a.outputs[0].bytes()];
            for _ in 0..4 {
                g.execute(&[xa], &mut [&mut out]).unwrap();
                assert!(out == ya, "A's result changed while B was loaded and freed");
            }
        });
        s.spawn(|| {
            for _ in 0..6 {
                let ctx = Context::from_binary(&b.bytes).unwrap();
                assert!(run(&ctx, "b", b, xb) == yb, "B's result changed");
                drop(ctx);
            }
        });
    });
    (rt.take_max_concurrent_calls(), t0.elapsed().as_secs_f64())
}

#[test]
fn contexts_load_and_free_while_another_executes() {
    if !qnn_available() {
        return;
    }
    // A: ~0.2 GFLOP per execution; B: 4 MB of weights to load.
    let a = fc_chain("a", 64, 512, 6, 1);
    let b = fc_chain("b", 1, 1024, 2, 100);
    let xa = h(&rand_vec(64 * 512, 7));
    let xb = h(&rand_vec(1024, 8));
    // Each alone, with the lock as it is.
    let ya = run(&Context::from_binary(&a.bytes).unwrap(), "a", &a, &xa);
    let yb = run(&Context::from_binary(&b.bytes).unwrap(), "b", &b, &xb);
    assert!(ya.iter().any(|&v| v != 0) && yb.iter().any(|&v| v != 0));

    let rt = npu_qnn::runtime().unwrap();
    let default_serial = rt.serial_calls();
    rt.set_serial_calls(true);
    let serial = overlap_round(&a, &b, &xa, &xb, &ya, &yb);
    rt.set_serial_calls(false);
    let shared = overlap_round(&a, &b, &xa, &xb, &ya, &yb);
    rt.set_serial_calls(default_serial);
    eprintln!("most QNN calls at once (wall s): serial lock {serial:?}, shared lock {shared:?}");
    assert_eq!(serial.0, 1, "the serial lock let two calls overlap");
    assert!(
        shared.0 > 1,
        "no two calls overlapped under the shared lock"
    );
}
