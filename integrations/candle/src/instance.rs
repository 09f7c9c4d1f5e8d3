//! One [`Softmax`] per CUDA device and thread, made on first use and kept for the thread's
//! life: its loaded kernels, plans and workspaces serve every later call on that device.

use std::cell::RefCell;

use candle_core::Result;
use softmax::Softmax;

thread_local! {
    static INSTANCES: RefCell<Vec<(usize, Softmax)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `call` with this thread's instance for device `ordinal`.
pub(crate) fn with_softmax<R>(
    ordinal: usize,
    call: impl FnOnce(&mut Softmax) -> softmax::Result<R>,
) -> Result<R> {
    INSTANCES.with(|instances| {
        let mut instances = instances.borrow_mut();
        let at = match instances.iter().position(|(o, _)| *o == ordinal) {
            Some(at) => at,
            None => {
                let device = u32::try_from(ordinal).map_err(candle_core::Error::wrap)?;
                let made = Softmax::on_device(device).map_err(candle_core::Error::wrap)?;
                instances.push((ordinal, made));
                instances.len() - 1
            }
        };
        call(&mut instances[at].1).map_err(candle_core::Error::wrap)
    })
}
