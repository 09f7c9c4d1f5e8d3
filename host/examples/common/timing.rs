//! Isolated timing for the examples that benchmark: the L2 evicted by a memset of twice its
//! size before each sample, one call between two events, the median of the samples.

use cust::event::{Event, EventFlags};
use cust::memory::DeviceBuffer;
use softmax::Softmax;

/// The shapes of the command line's first argument (`ROWSxCOLS,...`), else `default`.
pub fn shapes_from_args(default: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    match std::env::args().nth(1) {
        Some(list) => list
            .split(',')
            .map(|s| {
                let (r, c) = s.split_once('x').expect("ROWSxCOLS");
                (r.parse().expect("rows"), c.parse().expect("cols"))
            })
            .collect(),
        None => default,
    }
}

/// Samples per timing.
pub const SAMPLES: usize = 25;

/// A buffer twice the L2's size, for [`time`] to write before each sample.
pub fn l2_flush(softmax: &Softmax) -> Result<DeviceBuffer<u32>, Box<dyn std::error::Error>> {
    let l2 = softmax.device().l2_bytes as usize;
    // SAFETY: u32 accepts any bits; the buffer is only ever written.
    Ok(unsafe { DeviceBuffer::<u32>::uninitialized(2 * l2 / 4) }?)
}

/// The median of [`SAMPLES`] isolated timings of `call` on the instance's stream, in
/// microseconds (after one untimed call).
pub fn time(
    softmax: &mut Softmax,
    flush: &mut DeviceBuffer<u32>,
    mut call: impl FnMut(&mut Softmax) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let (start, stop) = (
        Event::new(EventFlags::DEFAULT)?,
        Event::new(EventFlags::DEFAULT)?,
    );
    call(softmax)?;
    softmax.synchronize()?;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        // SAFETY: a live buffer of words that nothing reads.
        unsafe { flush.set_32_async(0, softmax.stream()) }?;
        start.record(softmax.stream())?;
        call(softmax)?;
        stop.record(softmax.stream())?;
        stop.synchronize()?;
        samples.push(f64::from(stop.elapsed_time_f32(&start)?) * 1e3);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[SAMPLES / 2])
}
