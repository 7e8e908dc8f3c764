//! Our scalar dequantization against an independent implementation (gguf-py's
//! numpy reference), on random blocks. Fixture: fixtures/dequant_golden.json,
//! made by fixtures/make_dequant_golden.py.

use graphs::quant::{dequantize_row, GgmlType};

#[test]
fn matches_gguf_py_on_random_blocks() {
    let text = include_str!("fixtures/dequant_golden.json");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let cases = v["cases"].as_array().unwrap();
    let mut seen = Vec::new();
    for c in cases {
        let ty = GgmlType::from_u32(c["type_id"].as_u64().unwrap() as u32).unwrap();
        let hex = c["bytes_hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = c["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &bytes, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // same formula, possibly a different f32 evaluation order
            let tol = 1e-6 * w.abs().max(1e-3);
            assert!(
                (g - w).abs() <= tol,
                "{ty} element {i}: got {g}, gguf-py {w}"
            );
        }
        seen.push(ty);
    }
    assert_eq!(seen.len(), 12, "fixture covers 12 types: {seen:?}");
}
