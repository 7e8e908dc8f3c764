//! Row-parallel execution on the runtime's thread pool: each task owns a contiguous range of
//! output rows (and one scratch slot), so no synchronisation is needed inside an operation.

use npu_runtime::kernels::ThreadPool;
use std::sync::Mutex;

/// Calls `f(first_row, rows, scratch)` for contiguous chunks of `out` (`row_len` floats per
/// row), at most one chunk per scratch slot, on `pool`. Chunk sizes are multiples of `align`
/// rows (except the last) so register tiles are not split.
pub(crate) fn for_row_chunks<S, F>(
    pool: &ThreadPool,
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
    let align = align.max(1);
    let tasks = scratch.len().min(rows.div_ceil(align));
    let per = rows.div_ceil(tasks).div_ceil(align) * align;
    let n_chunks = rows.div_ceil(per);
    // Tasks take the next chunk from a shared iterator: safe hand-out of disjoint `&mut`s
    // without allocating.
    let chunks = Mutex::new(
        out.chunks_mut(per * row_len)
            .zip(scratch.iter_mut())
            .enumerate(),
    );
    pool.parallel_for(n_chunks, &|_| {
        let next = chunks.lock().unwrap_or_else(|e| e.into_inner()).next();
        if let Some((i, (chunk, sc))) = next {
            f(i * per, chunk, sc);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_row_once() {
        for threads in 1..5 {
            let pool = ThreadPool::new(threads);
            for rows in 0..23 {
                let mut out = vec![0.0f32; rows * 3];
                let mut scratch = vec![0usize; threads];
                for_row_chunks(
                    &pool,
                    &mut out,
                    3,
                    4,
                    &mut scratch,
                    |first, chunk, calls| {
                        *calls += 1;
                        for (i, row) in chunk.chunks_exact_mut(3).enumerate() {
                            row.iter_mut().for_each(|v| *v += (first + i) as f32 + 1.0);
                        }
                    },
                );
                let want: Vec<f32> = (0..rows).flat_map(|r| [r as f32 + 1.0; 3]).collect();
                assert_eq!(out, want, "threads {threads} rows {rows}");
                assert!(scratch.iter().all(|&c| c <= 1));
            }
        }
    }
}
