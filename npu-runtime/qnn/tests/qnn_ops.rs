//! Tiny QNN graphs on the HTP emulator versus plain Rust references: the bindings, the
//! op parameter encodings and context-binary round trips.

mod common;
use common::{h, qnn_available, rand_vec, unh};
use npu_qnn::ffi::Scalar;
use npu_qnn::{Context, DType, Param};

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}[{i}]: got {g}, want {w} (tol {tol} x {scale})"
        );
    }
}

#[test]
fn provider_reports_the_expected_api() {
    if !qnn_available() {
        return;
    }
    let rt = npu_qnn::runtime().unwrap();
    let v = rt.api_version();
    assert_eq!((v.core.major, v.core.minor), (2, 40));
    assert!(rt.build_id().starts_with('v'), "{}", rt.build_id());
}

#[test]
fn add_with_broadcast_and_binary_round_trip() {
    if !qnn_available() {
        return;
    }
    let ctx = Context::new().unwrap();
    let mut g = ctx.build("add").unwrap();
    let a = g.input(DType::F16, &[2, 3]).unwrap();
    let b = g.input(DType::F16, &[3]).unwrap();
    let o = g.output(DType::F16, &[2, 3]).unwrap();
    g.node("ElementWiseAdd", &[a, b], &[o], vec![]).unwrap();
    let mut graph = g.finalize().unwrap();
    let av = [1.0, 2.0, 3.0, -4.0, 5.5, 0.25];
    let bv = [0.5, -1.0, 2.0];
    let want: Vec<f32> = av.iter().enumerate().map(|(i, x)| x + bv[i % 3]).collect();
    let mut out = vec![0u8; 12];
    graph.execute(&[&h(&av), &h(&bv)], &mut [&mut out]).unwrap();
    assert_close(&unh(&out), &want, 1e-3, "add");

    // Serialize, load into a fresh context, run again by tensor id.
    let bin = ctx.binary().unwrap();
    assert!(!bin.is_empty());
    let (ins, outs) = (graph.inputs().to_vec(), graph.outputs().to_vec());
    drop(graph);
    drop(ctx);
    let ctx2 = Context::from_binary(&bin).unwrap();
    let mut g2 = ctx2.graph("add", ins, outs).unwrap();
    let mut out2 = vec![0u8; 12];
    g2.execute(&[&h(&av), &h(&bv)], &mut [&mut out2]).unwrap();
    assert_eq!(out, out2);
    // Wrong buffer sizes are an error, not a crash.
    assert!(g2.execute(&[&h(&av)], &mut [&mut out2]).is_err());
    assert!(g2.execute(&[&h(&av), &h(&av)], &mut [&mut out2]).is_err());
}

#[test]
fn fully_connected_matmul_softmax_rmsnorm() {
    if !qnn_available() {
        return;
    }
    let (t, k, n) = (3usize, 16usize, 8usize);
    let x = rand_vec(t * k, 1);
    let w = rand_vec(n * k, 2);
    let bias = rand_vec(n, 3);
    let gamma: Vec<f32> = rand_vec(k, 4).iter().map(|v| 1.0 + 0.5 * v).collect();
    let ctx = Context::new().unwrap();
    let mut g = ctx.build("mix").unwrap();
    let xi = g.input(DType::F16, &[t as u32, k as u32]).unwrap();
    let wt = g
        .constant(DType::F16, &[n as u32, k as u32], h(&w))
        .unwrap();
    let bt = g.constant(DType::F16, &[n as u32], h(&bias)).unwrap();
    let gt = g.constant(DType::F16, &[k as u32], h(&gamma)).unwrap();

    let fc = g.output(DType::F16, &[t as u32, n as u32]).unwrap();
    let mm = g.output(DType::F16, &[t as u32, n as u32]).unwrap();
    let sm = g.output(DType::F16, &[t as u32, k as u32]).unwrap();
    let rn = g.output(DType::F16, &[t as u32, k as u32]).unwrap();
    g.node("FullyConnected", &[xi, wt, bt], &[fc], vec![])
        .unwrap();
    g.node(
        "MatMul",
        &[xi, wt],
        &[mm],
        vec![
            Param::Scalar("transpose_in0", Scalar::bool8(false)),
            Param::Scalar("transpose_in1", Scalar::bool8(true)),
        ],
    )
    .unwrap();
    g.node(
        "Softmax",
        &[xi],
        &[sm],
        vec![Param::Scalar("axis", Scalar::u32(1))],
    )
    .unwrap();
    g.node(
        "RmsNorm",
        &[xi, gt],
        &[rn],
        vec![
            Param::Scalar("epsilon", Scalar::f32(1e-5)),
            Param::u32s("axes", &[1]),
        ],
    )
    .unwrap();
    let mut graph = g.finalize().unwrap();
    let mut outs = [
        vec![0u8; t * n * 2],
        vec![0u8; t * n * 2],
        vec![0u8; t * k * 2],
        vec![0u8; t * k * 2],
    ];
    {
        let [a, b, c, d] = &mut outs;
        graph.execute(&[&h(&x)], &mut [a, b, c, d]).unwrap();
    }
    let mut want_mm = vec![0f32; t * n];
    for i in 0..t {
        for j in 0..n {
            want_mm[i * n + j] = (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum();
        }
    }
    let want_fc: Vec<f32> = want_mm
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % n])
        .collect();
    let mut want_sm = vec![0f32; t * k];
    let mut want_rn = vec![0f32; t * k];
    for i in 0..t {
        let row = &x[i * k..(i + 1) * k];
        let m = row.iter().cloned().fold(f32::MIN, f32::max);
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        let ms = row.iter().map(|v| v * v).sum::<f32>() / k as f32;
        let r = 1.0 / (ms + 1e-5).sqrt();
        for c in 0..k {
            want_sm[i * k + c] = (row[c] - m).exp() / s;
            want_rn[i * k + c] = row[c] * r * gamma[c];
        }
    }
    assert_close(&unh(&outs[0]), &want_fc, 1e-2, "fully connected");
    assert_close(&unh(&outs[1]), &want_mm, 1e-2, "matmul");
    assert_close(&unh(&outs[2]), &want_sm, 1e-2, "softmax");
    assert_close(&unh(&outs[3]), &want_rn, 1e-2, "rmsnorm");
}

#[test]
fn unsupported_node_is_an_error_with_the_op_name() {
    if !qnn_available() {
        return;
    }
    let ctx = Context::new().unwrap();
    let mut g = ctx.build("bad").unwrap();
    let a = g.input(DType::F16, &[2, 3]).unwrap();
    let o = g.output(DType::F16, &[2, 3]).unwrap();
    let err = g.node("NoSuchOp", &[a], &[o], vec![]).unwrap_err();
    assert!(err.to_string().contains("NoSuchOp"), "{err}");
}
