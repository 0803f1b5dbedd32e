//! Measures where copying a batch's same-node rows on several threads
//! (spawned for the batch, as the store does) beats one thread, to set
//! `store::PARALLEL_COPY_BYTES`.
//!
//!     cargo run --release -p ddstore-core --example copy_threshold
//!
//! Prints, per batch size in bytes (128 rows), the best-of-N time of a
//! serial copy and of a parallel one, and their ratio.

use std::time::Instant;

fn main() {
    let rows = 128;
    println!(
        "{:>12} {:>12} {:>12} {:>8}",
        "batch bytes", "serial us", "parallel us", "speedup"
    );
    for row_bytes in [2048usize, 8192, 32 << 10, 128 << 10, 512 << 10, 1 << 20] {
        let src = vec![7u8; rows * row_bytes * 4];
        let mut dst = vec![0u8; rows * row_bytes];
        // Scattered rows, as a random batch reads them.
        let offsets: Vec<usize> = (0..rows)
            .map(|i| ((i * 2654435761) % (rows * 4)) * row_bytes)
            .collect();
        let best = |f: &mut dyn FnMut()| {
            (0..15)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let serial = best(&mut || {
            for (chunk, &off) in dst.chunks_mut(row_bytes).zip(&offsets) {
                chunk.copy_from_slice(&src[off..off + row_bytes]);
            }
        });
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let parallel = best(&mut || {
            let per = rows.div_ceil(threads);
            std::thread::scope(|s| {
                for (part, offs) in dst.chunks_mut(per * row_bytes).zip(offsets.chunks(per)) {
                    let src = &src;
                    s.spawn(move || {
                        for (chunk, &off) in part.chunks_mut(row_bytes).zip(offs) {
                            chunk.copy_from_slice(&src[off..off + row_bytes]);
                        }
                    });
                }
            });
        });
        println!(
            "{:>12} {:>12.1} {:>12.1} {:>8.2}",
            rows * row_bytes,
            serial * 1e6,
            parallel * 1e6,
            serial / parallel
        );
    }
}
