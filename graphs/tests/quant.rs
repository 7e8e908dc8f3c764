//! Dequantization against hand-computed blocks, and quantize -> dequantize round
//! trips within each format's error bound.

mod common;

use common::Rng;
use graphs::quant::*;
use half::f16;

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn deq(ty: GgmlType, b: &[u8]) -> Vec<f32> {
    let mut y = vec![f32::NAN; ty.block_size() * (b.len() / ty.type_size())];
    dequantize_row(ty, b, &mut y).unwrap();
    y
}

#[test]
fn type_ids_sizes_and_names() {
    let expect = [
        (0, GgmlType::F32, 1, 4, "f32"),
        (1, GgmlType::F16, 1, 2, "f16"),
        (2, GgmlType::Q4_0, 32, 18, "q4_0"),
        (3, GgmlType::Q4_1, 32, 20, "q4_1"),
        (6, GgmlType::Q5_0, 32, 22, "q5_0"),
        (7, GgmlType::Q5_1, 32, 24, "q5_1"),
        (8, GgmlType::Q8_0, 32, 34, "q8_0"),
        (9, GgmlType::Q8_1, 32, 36, "q8_1"),
        (10, GgmlType::Q2K, 256, 84, "q2_K"),
        (11, GgmlType::Q3K, 256, 110, "q3_K"),
        (12, GgmlType::Q4K, 256, 144, "q4_K"),
        (13, GgmlType::Q5K, 256, 176, "q5_K"),
        (14, GgmlType::Q6K, 256, 210, "q6_K"),
        (15, GgmlType::Q8K, 256, 292, "q8_K"),
        (30, GgmlType::BF16, 1, 2, "bf16"),
    ];
    for (id, ty, bs, ts, name) in expect {
        assert_eq!(GgmlType::from_u32(id), Some(ty));
        assert_eq!(ty.to_u32(), id);
        assert_eq!((ty.block_size(), ty.type_size(), ty.name()), (bs, ts, name));
    }
    for id in [4, 5, 16, 20, 23, 29, 31, 39, 1000, u32::MAX] {
        assert_eq!(GgmlType::from_u32(id), None, "id {id}");
    }
    assert_eq!(GgmlType::Q4K.row_bytes(512), Some(288));
    assert_eq!(GgmlType::Q4K.row_bytes(100), None);
    assert_eq!(GgmlType::Q8_0.row_bytes(usize::MAX / 32 * 32), None);
}

#[test]
fn size_errors_not_panics() {
    let mut y = vec![0f32; 32];
    assert!(matches!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut y),
        Err(QuantError::SizeMismatch { .. })
    ));
    let mut y = vec![0f32; 31];
    assert!(matches!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut y),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    let mut b = vec![0u8; 84];
    assert_eq!(
        quantize_row_ref(GgmlType::Q2K, &[0.0; 256], &mut b),
        Err(QuantError::NoQuantizer { ty: "q2_K" })
    );
}

#[test]
fn float_types() {
    assert_eq!(deq(GgmlType::F32, &1.5f32.to_le_bytes()), vec![1.5]);
    assert_eq!(deq(GgmlType::F16, &h(-2.25)), vec![-2.25]);
    // bf16 0x3FC0 = 1.5
    assert_eq!(deq(GgmlType::BF16, &[0xC0, 0x3F]), vec![1.5]);
}

#[test]
fn q4_0_hand_block() {
    let mut b = vec![0x88u8; 18];
    b[..2].copy_from_slice(&h(0.5));
    b[2] = 0x9F; // element 0: 15-8=7 -> 3.5; element 16: 9-8=1 -> 0.5
    b[2 + 15] = 0x01; // element 15: 1-8 -> -3.5; element 31: 0-8 -> -4
    let y = deq(GgmlType::Q4_0, &b);
    assert_eq!(
        (y[0], y[16], y[15], y[31], y[7]),
        (3.5, 0.5, -3.5, -4.0, 0.0)
    );
}

#[test]
fn q4_1_hand_block() {
    let mut b = vec![0u8; 20];
    b[..2].copy_from_slice(&h(0.25));
    b[2..4].copy_from_slice(&h(-1.0));
    b[4 + 3] = 0x4A; // element 3: 10*0.25-1 = 1.5; element 19: 4*0.25-1 = 0
    let y = deq(GgmlType::Q4_1, &b);
    assert_eq!((y[3], y[19], y[0]), (1.5, 0.0, -1.0));
}

#[test]
fn q5_0_and_q5_1_hand_blocks() {
    let mut b = vec![0u8; 22];
    b[..2].copy_from_slice(&h(1.0));
    b[2..6].copy_from_slice(&((1u32 << 0) | (1u32 << 17)).to_le_bytes());
    b[6] = 0x53; // element 0: (3|16)-16 = 3; element 16: 5-16 = -11
    let y = deq(GgmlType::Q5_0, &b);
    assert_eq!((y[0], y[16], y[1], y[17]), (3.0, -11.0, -16.0, 0.0));

    let mut b = vec![0u8; 24];
    b[..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(2.0));
    b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    b[8 + 15] = 0xF7; // element 15: 7*0.5+2 = 5.5; element 31: (15|16)*0.5+2 = 17.5
    let y = deq(GgmlType::Q5_1, &b);
    assert_eq!((y[15], y[31], y[0]), (5.5, 17.5, 2.0));
}

#[test]
fn q8_hand_blocks() {
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&h(2.0));
    b[2] = (-3i8) as u8;
    b[33] = 127;
    let y = deq(GgmlType::Q8_0, &b);
    assert_eq!((y[0], y[31], y[5]), (-6.0, 254.0, 0.0));

    let mut b = vec![0u8; 36];
    b[..2].copy_from_slice(&h(0.5));
    b[2..4].copy_from_slice(&h(99.0)); // s is not used by dequantization
    b[4 + 31] = (-128i8) as u8;
    assert_eq!(deq(GgmlType::Q8_1, &b)[31], -64.0);

    let mut b = vec![0u8; 292];
    b[..4].copy_from_slice(&0.125f32.to_le_bytes());
    b[4 + 255] = 8;
    assert_eq!(deq(GgmlType::Q8K, &b)[255], 1.0);
}

#[test]
fn q2_k_hand_block() {
    let mut b = vec![0u8; 84];
    b[0] = 0x21; // sub-block 0: scale 1, min 2
    b[1] = 0x03; // sub-block 1: scale 3, min 0
    b[2] = 0x10; // sub-block 2: scale 0, min 1
    b[16] = 0b0000_0011; // qs[0]: element 0 = 3, element 32 (shift 2) = 0
    b[16 + 16] = 0b10; // qs[16]: element 16 = 2
    b[80..82].copy_from_slice(&h(1.0));
    b[82..84].copy_from_slice(&h(0.5));
    let y = deq(GgmlType::Q2K, &b);
    assert_eq!((y[0], y[16], y[32]), (3.0 - 1.0, 6.0, -0.5));
}

#[test]
fn q3_k_hand_block() {
    let mut b = vec![0u8; 110];
    b[0] = 1; // hmask[0] bit 0: element 0 has its high bit set
    b[16] = 1; // hmask[16] bit 0: element 16
    b[32] = 3; // qs[0]: element 0 low bits = 3
    b[32 + 16] = 1; // qs[16]: element 16 low bits = 1
                    // scale 0 = 33 (low nibble 1 in scales[0], high bits 2 in scales[8]) -> 33-32 = 1
    b[96] = 0x01;
    b[96 + 8] = 0x02;
    b[108..110].copy_from_slice(&h(1.0));
    let y = deq(GgmlType::Q3K, &b);
    assert_eq!(y[0], 3.0); // 1 * 3
    assert_eq!(y[1], -4.0); // 1 * (0 - 4): high bit clear
    assert_eq!(y[16], -32.0); // scale 1 = 0-32 = -32, value 1
    assert_eq!(y[17], 128.0); // -32 * (0 - 4)
}

#[test]
fn q4_k_hand_block() {
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&h(1.0));
    b[2..4].copy_from_slice(&h(0.5));
    let s = &mut b[4..16];
    s[0] = 2; // sub-block 0 scale 2
    s[4] = 4; // sub-block 0 min 4
    s[1] = 0x40; // sub-block 1 scale 0; high bits of sub-block 5's scale = 1
    s[5] = 0x80; // sub-block 1 min 0; high bits of sub-block 5's min = 2
    s[9] = 0x31; // sub-block 5: scale low 1, min low 3 -> scale 17, min 35
    b[16] = 0x05; // element 0 = 5 (sub-block 0); element 32 = 0 (sub-block 1)
    b[16 + 64] = 0x70; // element 128 = 0 (sub-block 4), element 160 = 7 (sub-block 5)
    let y = deq(GgmlType::Q4K, &b);
    assert_eq!(y[0], 2.0 * 5.0 - 0.5 * 4.0);
    assert_eq!(y[1], -2.0);
    assert_eq!(y[32], 0.0);
    assert_eq!(y[128], 0.0);
    assert_eq!(y[160], 17.0 * 7.0 - 0.5 * 35.0);
}

#[test]
fn q5_k_hand_block() {
    let mut b = vec![0u8; 176];
    b[0..2].copy_from_slice(&h(1.0));
    b[2..4].copy_from_slice(&h(1.0));
    b[4] = 1; // sub-block 0 scale 1
    b[5] = 2; // sub-block 1 scale 2
    b[9] = 3; // sub-block 1 min 3
    b[16] = 0b0000_0101; // qh[0]: bit 0 -> element 0 (+16), bit 2 -> element 64 (+16)
    b[48] = 0x0F; // element 0 low = 15, element 32 low = 0
    let y = deq(GgmlType::Q5K, &b);
    assert_eq!(y[0], 31.0);
    assert_eq!(y[32], -3.0);
    // element 64 is sub-block 2 (scale 0, min 0) -> 0 whatever q is
    assert_eq!(y[64], 0.0);
}

#[test]
fn q6_k_hand_block() {
    let mut b = vec![0u8; 210];
    b[0] = 0x21; // ql[0]: element 0 low 1, element 64 low 2
    b[128] = 0b0000_1001; // qh[0]: element 0 high 1, element 32 high 2
    let sc = &mut b[192..208];
    sc[0] = 2;
    sc[2] = (-1i8) as u8;
    sc[4] = 1;
    sc[6] = 3;
    b[208..210].copy_from_slice(&h(0.5));
    let y = deq(GgmlType::Q6K, &b);
    assert_eq!(y[0], 0.5 * 2.0 * (17.0 - 32.0));
    assert_eq!(y[32], 0.0); // scale -1, q 32-32 = 0
    assert_eq!(y[64], 0.5 * 1.0 * (2.0 - 32.0));
    assert_eq!(y[96], 0.5 * 3.0 * -32.0);
    assert_eq!(y[128], 0.0); // second half: all scales 0
}

/// Largest allowed |x - dequant(quant(x))| for one block, from the format.
fn bound(ty: GgmlType, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (lo, hi) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let r = hi - lo.min(0.0); // the k-quants' offset is never negative
    let f16_rel = 1.0 / 1024.0; // relative error of storing scales in f16, with margin
                                // f16 subnormals (< 6.1e-5) have a fixed spacing of 2^-24: scale error times the level
    let sub = |levels: f32| levels * 6.0e-8;
    let levels = match ty {
        GgmlType::Q4K => 63.0 * 16.0,
        GgmlType::Q5K => 63.0 * 32.0,
        GgmlType::Q6K => 128.0 * 32.0,
        _ => 127.0,
    };
    sub(levels)
        + match ty {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => amax * f16_rel,
            GgmlType::BF16 => amax / 128.0,
            // half a step plus the scale's rounding times the largest level
            GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 127.0 * (0.5 + 127.0 * f16_rel),
            GgmlType::Q8K => amax / 127.0 * 0.51,
            // symmetric 4/5-bit: the extreme opposite to the max clamps one full step
            GgmlType::Q4_0 => amax / 8.0 * (1.0 + 8.0 * f16_rel),
            GgmlType::Q5_0 => amax / 16.0 * (1.0 + 16.0 * f16_rel),
            GgmlType::Q4_1 => (hi - lo) / 15.0 * (0.5 + 15.0 * f16_rel) + amax * f16_rel,
            GgmlType::Q5_1 => (hi - lo) / 31.0 * (0.5 + 31.0 * f16_rel) + amax * f16_rel,
            // 6-bit scales and mins relative to the super-block's largest: half a
            // step (step <= R/nmax * (1 + 1/126)), or at a clamp the rounding of the
            // offset and of the step (each <= 1/126 of the largest)
            GgmlType::Q4K => r / 15.0 * 0.51 + (r + amax) / 126.0,
            GgmlType::Q5K => r / 31.0 * 0.51 + (r + amax) / 126.0,
            // clamped extreme opposite the sub-block's max: one step, plus the 8-bit
            // scale rounding (<= 15.5 * d with d = amax / (32 * 128))
            GgmlType::Q6K => amax / 32.0 * 1.13,
            GgmlType::Q2K | GgmlType::Q3K => unreachable!(),
        }
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quantize_row_ref(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    y
}

#[test]
fn round_trip_within_format_bound() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for ty in GgmlType::ALL.into_iter().filter(|t| t.has_ref_quantizer()) {
        let bs = ty.block_size().max(32);
        for case in 0..200 {
            // vary magnitude, offset and sparsity so every code path is hit
            let scale = [1e-3f32, 0.1, 1.0, 30.0][case % 4];
            let offset = if case % 3 == 0 { 0.7 * scale } else { 0.0 };
            let x: Vec<f32> = (0..bs * 2)
                .map(|i| {
                    if case % 7 == 0 && i % 5 == 0 {
                        0.0
                    } else {
                        rng.f32() * scale + offset
                    }
                })
                .collect();
            let y = round_trip(ty, &x);
            let blk = ty.block_size();
            for (bx, by) in x.chunks(blk.max(32)).zip(y.chunks(blk.max(32))) {
                let b = bound(ty, bx) + 1e-7;
                for (i, (a, c)) in bx.iter().zip(by).enumerate() {
                    assert!(
                        (a - c).abs() <= b,
                        "{ty} case {case} elem {i}: {a} -> {c}, bound {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn round_trip_exact_values() {
    // Values on the quantization grid survive unchanged.
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.25).collect();
    assert_eq!(round_trip(GgmlType::Q5_0, &x), x);
    let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.5 - 2.0).collect();
    assert_eq!(round_trip(GgmlType::Q4_1, &x), x);
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let y = round_trip(GgmlType::Q8_0, &x);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() < 0.07, "{a} {b}");
    }
    // All-zero blocks stay zero (no division by zero).
    for ty in GgmlType::ALL.into_iter().filter(|t| t.has_ref_quantizer()) {
        let x = vec![0f32; 256];
        assert!(round_trip(ty, &x).iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn q8_1_sum_and_q8_k_bsums() {
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..256).map(|_| rng.f32()).collect();
    let mut q = vec![0u8; 36];
    quantize_row_ref(GgmlType::Q8_1, &x[..32], &mut q).unwrap();
    let d = f16::from_le_bytes([q[0], q[1]]).to_f32();
    let s = f16::from_le_bytes([q[2], q[3]]).to_f32();
    let sum: i32 = q[4..].iter().map(|&v| v as i8 as i32).sum();
    assert!((s - d * sum as f32).abs() <= (d * sum as f32).abs() / 512.0 + 1e-6);

    let mut q = vec![0u8; 292];
    quantize_row_ref(GgmlType::Q8K, &x, &mut q).unwrap();
    for g in 0..16 {
        let sum: i32 = q[4 + 16 * g..4 + 16 * g + 16]
            .iter()
            .map(|&v| v as i8 as i32)
            .sum();
        let at = 4 + 256 + 2 * g;
        assert_eq!(i16::from_le_bytes([q[at], q[at + 1]]) as i32, sum);
    }
}

#[test]
fn k_scale_packing_round_trips() {
    // Exercise every 6-bit value in every slot of the packed scales through the
    // Q4_K quantizer's layout: dequantizing a block whose q are all 1 and whose
    // d = 1, dmin = 0 yields the scale of each sub-block.
    for v in 0..64u8 {
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&h(1.0));
        let ls = [v, 63 - v, v / 2, v ^ 21, 63 - v / 3, v, (v * 5) % 64, v / 7];
        // pack like ggml: see BlockQ4K docs
        let s = &mut b[4..16];
        for j in 0..8 {
            if j < 4 {
                s[j] = ls[j];
            } else {
                s[j + 4] = ls[j] & 0xF;
                s[j - 4] |= (ls[j] >> 4) << 6;
            }
        }
        for q in &mut b[16..144] {
            *q = 0x11;
        }
        let y = deq(GgmlType::Q4K, &b);
        for j in 0..8 {
            assert_eq!(y[j * 32], ls[j] as f32, "v {v} sub-block {j}");
        }
    }
}
