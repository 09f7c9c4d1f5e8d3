//! Criterion benches over the public API: each variant on a few representative shapes.
//! Without a GPU they print that they were skipped.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use softmax::cust::memory::DeviceBuffer;
use softmax::{Error, Shape, Softmax, Variant};

const SHAPES: [(usize, usize); 4] = [(65536, 1024), (4096, 16384), (8, 128256), (4096, 1000)];

fn softmax_benches(c: &mut Criterion) {
    let mut softmax = match Softmax::new() {
        Ok(softmax) => softmax,
        Err(Error::NoDevice { reason }) => {
            println!("softmax benches skipped: no CUDA device ({reason})");
            return;
        }
        Err(error) => panic!("opening the GPU failed: {error}"),
    };
    let mut group = c.benchmark_group("softmax");
    for (rows, cols) in SHAPES {
        let shape = Shape::new(rows, cols).expect("valid shape");
        let values: Vec<f32> = (0..shape.len())
            .map(|i| (i % 977) as f32 * 0.01 - 4.0)
            .collect();
        let input = DeviceBuffer::from_slice(&values).expect("device input");
        let mut output = DeviceBuffer::from_slice(&values).expect("device output");
        group.throughput(Throughput::Bytes(shape.min_traffic_bytes()));
        for variant in Variant::all() {
            if softmax.run(variant, &input, &mut output, shape).is_err() {
                continue; // The variant does not run this shape (e.g. rows too wide for registers).
            }
            let id = BenchmarkId::new(variant.name(), format!("f32/{shape}"));
            group.bench_function(id, |b| {
                b.iter_custom(|iterations| {
                    softmax.synchronize().expect("idle stream");
                    let start = Instant::now();
                    for _ in 0..iterations {
                        softmax
                            .run(variant, &input, &mut output, shape)
                            .expect("launch");
                    }
                    softmax.synchronize().expect("kernels finish");
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = softmax_benches
}
criterion_main!(benches);
