//! Row-parallel execution over scoped threads: each thread owns a contiguous range of output
//! rows (and one scratch slot), so no synchronisation is needed inside an operation.

/// Calls `f(first_row, rows, scratch)` for contiguous chunks of `out` (`row_len` floats per
/// row), one chunk per scratch slot at most, the last on the calling thread. Chunk sizes are
/// multiples of `align` rows (except the last) so register tiles are not split.
pub(crate) fn for_row_chunks<S, F>(
    out: &mut [f32],
    row_len: usize,
    align: usize,
    scratch: &mut [S],
    f: F,
) where
    S: Send,
    F: Fn(usize, &mut [f32], &mut S) + Sync,
{
    let rows = out.len() / row_len.max(1);
    if rows == 0 || scratch.is_empty() {
        return;
    }
    let threads = scratch.len().min(rows.div_ceil(align)).max(1);
    let per = rows.div_ceil(threads).div_ceil(align) * align;
    if threads == 1 {
        f(0, out, &mut scratch[0]);
        return;
    }
    std::thread::scope(|s| {
        let f = &f;
        let mut chunks = out
            .chunks_mut(per * row_len)
            .zip(scratch.iter_mut())
            .enumerate();
        let first = chunks.next();
        for (i, (chunk, sc)) in chunks {
            s.spawn(move || f(i * per, chunk, sc));
        }
        if let Some((_, (chunk, sc))) = first {
            f(0, chunk, sc);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_row_once() {
        for threads in 1..5 {
            for rows in 0..23 {
                let mut out = vec![0.0f32; rows * 3];
                let mut scratch = vec![0usize; threads];
                for_row_chunks(&mut out, 3, 4, &mut scratch, |first, chunk, calls| {
                    *calls += 1;
                    for (i, row) in chunk.chunks_exact_mut(3).enumerate() {
                        row.iter_mut().for_each(|v| *v += (first + i) as f32 + 1.0);
                    }
                });
                let want: Vec<f32> = (0..rows).flat_map(|r| [r as f32 + 1.0; 3]).collect();
                assert_eq!(out, want, "threads {threads} rows {rows}");
            }
        }
    }
}
