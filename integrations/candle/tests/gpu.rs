//! The candle operations against candle's own, on the GPU: values (f32, bf16, f16, odd and
//! strided shapes), options (scale, temperature, masks, causal), gradients through candle's
//! autograd on a small graph, in place, on both kinds of candle stream, and the layouts that
//! are refused. Skips visibly without a GPU (the library's harness).

#[path = "../../../host/tests/common/mod.rs"]
mod common;

use std::process::ExitCode;

use candle_core::{D, DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use softmax_candle::{Mask, MaskedRows, SoftmaxOptions};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    ("candle_values_match_candles_own_ops", values),
    ("candle_options_match_candle_composed", options),
    ("candle_gradients_match_candles_autograd", gradients),
    ("candle_in_place_matches_the_out_of_place_call", in_place),
    (
        "candle_both_kinds_of_stream_and_the_cpu_agree",
        streams_and_cpu,
    ),
    ("candle_layouts_it_cannot_take_are_refused", refused),
    (
        "candle_cross_entropy_matches_candles_composed_loss",
        cross_entropy,
    ),
    ("candle_sampling_matches_the_cpu_draw", sampling),
];

fn main() -> ExitCode {
    common::run_harness(TESTS)
}

fn text<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn device() -> Result<Device, String> {
    Device::new_cuda(0).map_err(text)
}

/// Random scores of `dims` on `device`, in `dtype` (drawn in f32, seeded).
fn scores(
    rng: &mut StdRng,
    dims: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<Tensor, String> {
    let len = dims.iter().product();
    let shape = softmax::Shape::new(1, len).map_err(text)?;
    let values = common::random_matrix(rng, shape, 8.0);
    Tensor::from_vec(values, dims, device)
        .and_then(|t| t.to_dtype(dtype))
        .map_err(text)
}

/// The largest `|a − b| / max(|b|, floor)` over the two tensors (as f32), `b` the reference;
/// NaN where they disagree on NaN or infinity.
fn worst(a: &Tensor, b: &Tensor, floor: f32) -> Result<f32, String> {
    let flat = |t: &Tensor| -> Result<Vec<f32>, String> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(text)
    };
    let (a, b) = (flat(a)?, flat(b)?);
    if a.len() != b.len() {
        return Err(format!("{} values against {}", a.len(), b.len()));
    }
    Ok(a.iter().zip(&b).fold(0.0, |w, (&a, &b)| {
        let error = if a.is_finite() && b.is_finite() {
            (a - b).abs() / b.abs().max(floor)
        } else if a == b || (a.is_nan() && b.is_nan()) {
            0.0
        } else {
            f32::NAN
        };
        if error.is_nan() {
            f32::NAN
        } else {
            w.max(error)
        }
    }))
}

/// Fails unless `a` is within `tolerance` of the reference `b`.
fn close(what: &str, a: &Tensor, b: &Tensor, floor: f32, tolerance: f32) -> Result<f32, String> {
    let error = worst(a, b, floor)?;
    if error.is_nan() || error > tolerance {
        return Err(format!("{what}: worst error {error:e} > {tolerance:e}"));
    }
    Ok(error)
}

/// Below this, an output of `dtype` is compared absolutely (its spacing there is absolute: f16
/// subnormals are 6e-8 apart, and a probability of 1e-9 is written as 0).
fn smallest_normal(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 6.1e-5,
        _ => 1e-30,
    }
}

/// The tolerance of an output of `dtype` against an f32 reference.
fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 1.0 / 64.0,
        DType::F16 => 1.0 / 512.0,
        _ => 2e-5,
    }
}

const SHAPES: [&[usize]; 5] = [
    &[3, 7, 1001],
    &[5, 32000],
    &[1, 128_256],
    &[2, 3, 50257],
    &[4096, 100],
];

/// Softmax, log-softmax and log-sum-exp of f32, bf16 and f16 tensors against candle's fused
/// softmax, its composed log-softmax and its log-sum-exp computed in f32 on the same values;
/// also on strided rows (the last dimension narrowed), with no copy.
fn values(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let device = device()?;
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for dims in SHAPES {
            let x = scores(rng, dims, dtype, &device)?;
            let x32 = x.to_dtype(DType::F32).map_err(text)?;
            let what = |op: &str| format!("{op} {dtype:?} {dims:?}");
            let ours = softmax_candle::softmax_last_dim(&x).map_err(text)?;
            let theirs = candle_nn::ops::softmax_last_dim(&x32).map_err(text)?;
            close(
                &what("softmax"),
                &ours,
                &theirs,
                smallest_normal(dtype),
                tolerance(dtype),
            )?;
            let ours = softmax_candle::log_softmax_last_dim(&x).map_err(text)?;
            let theirs = candle_nn::ops::log_softmax(&x32, D::Minus1).map_err(text)?;
            close(&what("log-softmax"), &ours, &theirs, 1.0, tolerance(dtype))?;
            let ours = softmax_candle::log_sum_exp(&x).map_err(text)?;
            let theirs = x32.log_sum_exp(D::Minus1).map_err(text)?;
            close(&what("log-sum-exp"), &ours, &theirs, 1.0, 2e-5)?;
            checked += 3;
        }
        // Rows 1010 apart, 1001 wide: a narrowed view.
        let wide = scores(rng, &[6, 1010], dtype, &device)?;
        let narrow = wide.narrow(D::Minus1, 4, 1001).map_err(text)?;
        let ours = softmax_candle::softmax_last_dim(&narrow).map_err(text)?;
        let theirs = candle_nn::ops::softmax_last_dim(
            &narrow
                .to_dtype(DType::F32)
                .and_then(|t| t.contiguous())
                .map_err(text)?,
        )
        .map_err(text)?;
        close(
            &format!("strided softmax {dtype:?}"),
            &ours,
            &theirs,
            smallest_normal(dtype),
            tolerance(dtype),
        )?;
        checked += 1;
    }
    Ok(format!(
        "{checked} results match candle's own ops (f32, bf16, f16; strided rows)"
    ))
}

/// The scores `options` describe, composed from candle ops in f32: scale, then an additive
/// mask or the -inf of an allowed mask's zeros, or the causal triangle.
fn composed_scores(
    x: &Tensor,
    scale: f64,
    mask: Option<&Tensor>,
    causal: bool,
) -> Result<Tensor, String> {
    let mut s = (x.to_dtype(DType::F32).map_err(text)? * scale).map_err(text)?;
    if let Some(mask) = mask {
        s = s.broadcast_add(mask).map_err(text)?;
    }
    if causal {
        let cols = *x.dims().last().expect("a last dimension");
        let triangle: Vec<f32> = (0..cols * cols)
            .map(|i| {
                if i % cols > i / cols {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let triangle = Tensor::from_vec(triangle, (cols, cols), x.device()).map_err(text)?;
        s = s.broadcast_add(&triangle).map_err(text)?;
    }
    Ok(s)
}

/// Temperature and scale, additive and boolean masks, causal blocks, and rows masked
/// everywhere asked to give zeros, against the same scores composed from candle ops.
fn options(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let device = device()?;
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16] {
        let x = scores(rng, &[2, 4, 64, 64], dtype, &device)?;
        let additive = scores(rng, &[64, 64], DType::F32, &device)?;
        let allowed_values: Vec<u8> = (0..64 * 64).map(|i| u8::from(i % 3 != 0)).collect();
        let as_additive: Vec<f32> = allowed_values
            .iter()
            .map(|&a| if a == 0 { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        let allowed = Tensor::from_vec(allowed_values, (64, 64), &device).map_err(text)?;
        let allowed_as_additive = Tensor::from_vec(as_additive, (64, 64), &device).map_err(text)?;
        let cases: [(SoftmaxOptions, f64, Option<&Tensor>, bool); 5] = [
            (
                SoftmaxOptions::softmax().temperature(0.7),
                1.0 / 0.7,
                None,
                false,
            ),
            (
                SoftmaxOptions::log_softmax().scale(0.125),
                0.125,
                None,
                false,
            ),
            (
                SoftmaxOptions::softmax().mask(Mask::Additive(additive.clone())),
                1.0,
                Some(&additive),
                false,
            ),
            (
                SoftmaxOptions::softmax()
                    .scale(0.5)
                    .mask(Mask::Allowed(allowed.clone())),
                0.5,
                Some(&allowed_as_additive),
                false,
            ),
            (
                SoftmaxOptions::log_softmax().scale(0.125).causal(),
                0.125,
                None,
                true,
            ),
        ];
        for (i, (options, scale, mask, causal)) in cases.into_iter().enumerate() {
            let s = composed_scores(&x, scale, mask, causal)?;
            let log = i == 1 || i == 4;
            let theirs = if log {
                candle_nn::ops::log_softmax(&s, D::Minus1)
            } else {
                candle_nn::ops::softmax(&s, D::Minus1)
            }
            .map_err(text)?;
            let ours = softmax_candle::softmax(&x, &options).map_err(text)?;
            let floor = if log { 1.0 } else { smallest_normal(dtype) };
            close(
                &format!("options case {i} {dtype:?}"),
                &ours,
                &theirs,
                floor,
                tolerance(dtype),
            )?;
            let lse = softmax_candle::log_sum_exp_with(&x, &options).map_err(text)?;
            close(
                &format!("log-sum-exp, options case {i} {dtype:?}"),
                &lse,
                &s.log_sum_exp(D::Minus1).map_err(text)?,
                1.0,
                2e-5,
            )?;
            checked += 2;
        }
        // A row masked everywhere gives zeros when asked.
        let none = Tensor::zeros((64, 64), DType::U8, &device).map_err(text)?;
        let zero = SoftmaxOptions::softmax()
            .mask(Mask::Allowed(none))
            .masked_rows(MaskedRows::Zero);
        let y = softmax_candle::softmax(&x, &zero).map_err(text)?;
        let total = y
            .to_dtype(DType::F32)
            .and_then(|y| y.abs()?.sum_all()?.to_scalar::<f32>());
        if total.map_err(text)? != 0.0 {
            return Err(format!(
                "{dtype:?}: rows masked everywhere are not all zeros"
            ));
        }
        checked += 1;
    }
    Ok(format!(
        "{checked} results with options match candle's composed scores"
    ))
}

/// `loss = Σ (op(x · a) ⊙ w)` through a small graph (a matrix product before the operation),
/// its gradients with respect to `x` and `a` against the same graph with candle's composed
/// softmax, log-softmax and log-sum-exp; f32 and bf16, with and without options.
fn gradients(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let device = device()?;
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16] {
        for (rows, inner, cols) in [(37, 16, 1001), (8, 32, 32000), (64, 64, 64)] {
            let x =
                Var::from_tensor(&scores(rng, &[rows, inner], dtype, &device)?).map_err(text)?;
            let a = Var::from_tensor(
                &(scores(rng, &[inner, cols], dtype, &device)? * 0.1).map_err(text)?,
            )
            .map_err(text)?;
            let w = scores(rng, &[rows, cols], DType::F32, &device)?;
            for case in 0..4 {
                let loss = |ours: bool| -> Result<Tensor, String> {
                    let h = x.as_tensor().matmul(a.as_tensor()).map_err(text)?;
                    let h32 = h.to_dtype(DType::F32).map_err(text)?;
                    let y = match (case, ours) {
                        (0, true) => softmax_candle::softmax_last_dim(&h),
                        (0, false) => candle_nn::ops::softmax(&h32, D::Minus1),
                        (1, true) => softmax_candle::log_softmax_last_dim(&h),
                        (1, false) => candle_nn::ops::log_softmax(&h32, D::Minus1),
                        (2, true) => {
                            softmax_candle::softmax(&h, &SoftmaxOptions::softmax().temperature(0.5))
                        }
                        (2, false) => {
                            candle_nn::ops::softmax(&(&h32 * 2.0).map_err(text)?, D::Minus1)
                        }
                        (_, true) => softmax_candle::log_sum_exp(&h).and_then(|l| l.unsqueeze(1)),
                        (_, false) => h32.log_sum_exp(D::Minus1).and_then(|l| l.unsqueeze(1)),
                    }
                    .map_err(text)?;
                    y.to_dtype(DType::F32)
                        .and_then(|y| y.broadcast_mul(&w))
                        .and_then(|y| y.sum_all())
                        .map_err(text)
                };
                let (ours, theirs) = (loss(true)?, loss(false)?);
                let (ours, theirs) = (
                    ours.backward().map_err(text)?,
                    theirs.backward().map_err(text)?,
                );
                for (name, var) in [("x", &x), ("a", &a)] {
                    let (g_ours, g_theirs) =
                        (ours.get(var.as_tensor()), theirs.get(var.as_tensor()));
                    let (Some(g_ours), Some(g_theirs)) = (g_ours, g_theirs) else {
                        return Err(format!("case {case}: no gradient for {name}"));
                    };
                    let scale = g_theirs
                        .to_dtype(DType::F32)
                        .and_then(|g| {
                            g.abs()?
                                .max_keepdim(0)?
                                .max_keepdim(1)?
                                .flatten_all()?
                                .to_vec1::<f32>()
                        })
                        .map_err(text)?[0];
                    let what =
                        format!("gradient of {name}, case {case}, {dtype:?} {rows}x{inner}x{cols}");
                    let tol = if dtype == DType::BF16 { 5e-2 } else { 1e-3 };
                    close(&what, g_ours, g_theirs, scale.max(1e-30), tol)?;
                    checked += 1;
                }
            }
        }
    }
    Ok(format!(
        "{checked} gradients through a matrix product and the operation match candle's autograd"
    ))
}

/// The in-place forms leave in the tensor what the out-of-place calls return (within rounding:
/// an in-place call may run other kernels than the out-of-place one).
fn in_place(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let device = device()?;
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for options in [
            SoftmaxOptions::softmax(),
            SoftmaxOptions::log_softmax().temperature(0.7),
        ] {
            let x = scores(rng, &[3, 50257], dtype, &device)?;
            let expected = softmax_candle::softmax(&x, &options).map_err(text)?;
            softmax_candle::softmax_in_place(&x, &options).map_err(text)?;
            let tolerance = tolerance(dtype);
            close(
                &format!("in place {dtype:?}"),
                &x,
                &expected,
                1.0,
                tolerance,
            )?;
            checked += 1;
        }
    }
    Ok(format!(
        "{checked} in-place calls equal the out-of-place ones"
    ))
}

/// Calls on a device with its own stream (`new_cuda_with_stream`) and on the per-thread
/// default stream (`new_cuda`) give the same results, and CPU tensors (the f64 reference)
/// agree with them.
fn streams_and_cpu(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let per_thread = device()?;
    let own = Device::new_cuda_with_stream(0).map_err(text)?;
    let x = scores(rng, &[16, 32000], DType::F32, &Device::Cpu)?;
    let cpu = softmax_candle::log_softmax_last_dim(&x).map_err(text)?;
    for (name, device) in [("per-thread stream", &per_thread), ("own stream", &own)] {
        let y = softmax_candle::log_softmax_last_dim(&x.to_device(device).map_err(text)?)
            .map_err(text)?;
        close(
            name,
            &y.to_device(&Device::Cpu).map_err(text)?,
            &cpu,
            1.0,
            2e-5,
        )?;
    }
    Ok("the per-thread stream, a device's own stream and the CPU reference agree".into())
}

/// A transposed tensor (last dimension not contiguous), leading dimensions that do not
/// collapse, and integer tensors are errors that say what to do, not wrong numbers.
fn refused(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    let device = device()?;
    let x = scores(rng, &[64, 48], DType::F32, &device)?;
    let cases = [
        ("transposed", x.t().map_err(text)?, "contiguous"),
        (
            "a narrowed middle dimension",
            scores(rng, &[2, 8, 16], DType::F32, &device)?
                .narrow(1, 0, 5)
                .map_err(text)?,
            "collapse",
        ),
        (
            "u32",
            x.to_dtype(DType::U32).map_err(text)?,
            "f32, bf16 or f16",
        ),
    ];
    for (what, tensor, says) in cases {
        match softmax_candle::softmax_last_dim(&tensor) {
            Err(e) if e.to_string().contains(says) => {}
            other => return Err(format!("{what}: {other:?}")),
        }
    }
    Ok("transposed, uncollapsible and integer tensors are refused with a clear error".into())
}

/// `cross_entropy(x · a, targets)` and its gradients with respect to `x` and `a` against
/// candle's composed `candle_nn::loss::cross_entropy` (log-softmax, then the mean negative
/// log-likelihood), f32 and bf16, u32 and i64 targets; and the library's own options (ignore
/// index, label smoothing) against the same loss written out with candle's ops.
fn cross_entropy(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    use rand::Rng;
    let device = device()?;
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16] {
        for (rows, inner, cols) in [(37, 16, 1001), (64, 32, 32000)] {
            let x =
                Var::from_tensor(&scores(rng, &[rows, inner], dtype, &device)?).map_err(text)?;
            let a = Var::from_tensor(
                &(scores(rng, &[inner, cols], dtype, &device)? * 0.1).map_err(text)?,
            )
            .map_err(text)?;
            let labels: Vec<u32> = (0..rows)
                .map(|_| rng.random_range(0..cols as u32))
                .collect();
            let targets = Tensor::from_vec(labels.clone(), rows, &device).map_err(text)?;
            let wide: Vec<i64> = labels.iter().map(|&t| i64::from(t)).collect();
            let wide = Tensor::from_vec(wide, rows, &device).map_err(text)?;
            for (case, ours_targets) in [(0, &targets), (1, &wide)] {
                let h = x.as_tensor().matmul(a.as_tensor()).map_err(text)?;
                let ours = softmax_candle::cross_entropy(
                    &h,
                    ours_targets,
                    &softmax_candle::CrossEntropyOptions::new().ignore_index(None),
                )
                .map_err(text)?;
                let h32 = h.to_dtype(DType::F32).map_err(text)?;
                let theirs = candle_nn::loss::cross_entropy(&h32, &targets).map_err(text)?;
                let what = format!("loss, case {case}, {dtype:?} {rows}x{inner}x{cols}");
                let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-5 };
                close(&what, &ours.reshape(()).map_err(text)?, &theirs, 1.0, tol)?;
                let (g_ours, g_theirs) = (
                    ours.backward().map_err(text)?,
                    theirs.backward().map_err(text)?,
                );
                for (name, var) in [("x", &x), ("a", &a)] {
                    let (Some(go), Some(gt)) =
                        (g_ours.get(var.as_tensor()), g_theirs.get(var.as_tensor()))
                    else {
                        return Err(format!("{what}: no gradient for {name}"));
                    };
                    let scale = gt
                        .to_dtype(DType::F32)
                        .and_then(|g| g.abs()?.flatten_all()?.max(0)?.to_vec0::<f32>())
                        .map_err(text)?;
                    let tol = if dtype == DType::BF16 { 5e-2 } else { 1e-3 };
                    close(
                        &format!("gradient of {name}, {what}"),
                        go,
                        gt,
                        scale.max(1e-30),
                        tol,
                    )?;
                    checked += 1;
                }
            }
        }
    }
    // Ignore index and label smoothing, against the loss written out with candle's ops.
    let (rows, cols) = (24, 777);
    let logits = scores(rng, &[rows, cols], DType::F32, &device)?;
    let labels: Vec<i64> = (0..rows)
        .map(|r| {
            if r % 4 == 3 {
                -100
            } else {
                rng.random_range(0..cols as i64)
            }
        })
        .collect();
    let targets = Tensor::from_vec(labels.clone(), rows, &device).map_err(text)?;
    let eps = 0.1f64;
    let ours = softmax_candle::cross_entropy(
        &logits,
        &targets,
        &softmax_candle::CrossEntropyOptions::new().label_smoothing(eps as f32),
    )
    .map_err(text)?;
    let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1).map_err(text)?;
    let host_log_p: Vec<Vec<f32>> = log_p.to_vec2().map_err(text)?;
    let kept: Vec<usize> = (0..rows).filter(|r| labels[*r] != -100).collect();
    let total: f64 = kept
        .iter()
        .map(|&r| {
            let row = &host_log_p[r];
            let nll = -f64::from(row[labels[r] as usize]);
            let smooth = -row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            (1.0 - eps) * nll + eps * smooth
        })
        .sum();
    let expected = total / kept.len() as f64;
    let got = f64::from(ours.to_vec0::<f32>().map_err(text)?);
    if (got - expected).abs() > 1e-5 * expected.abs().max(1.0) {
        return Err(format!(
            "ignore index and label smoothing: {got} where {expected}"
        ));
    }
    checked += 1;
    Ok(format!(
        "{checked} losses and gradients of cross-entropy through a matrix product match candle's composed loss, and the options its written-out form"
    ))
}

fn sampling(_: &mut softmax::Softmax, rng: &mut StdRng) -> Outcome {
    use softmax_candle::{Sampler, SamplingParams};
    let device = device()?;
    let params = SamplingParams {
        temperature: 0.8,
        top_k: Some(40),
        top_p: Some(0.9),
        seed: 7,
        offset: 3,
        ..SamplingParams::default()
    };
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16] {
        let logits = scores(rng, &[3, 5, 32000], dtype, &device)?;
        let gpu = softmax_candle::sample(&logits, &params).map_err(text)?;
        if gpu.dims() != [3, 5] || gpu.dtype() != DType::U32 {
            return Err(format!("tokens of {:?} {:?}", gpu.dims(), gpu.dtype()));
        }
        let cpu = softmax_candle::sample(&logits.to_device(&Device::Cpu).map_err(text)?, &params)
            .map_err(text)?;
        let (g, c) = (
            gpu.flatten_all()
                .and_then(|t| t.to_vec1::<u32>())
                .map_err(text)?,
            cpu.flatten_all()
                .and_then(|t| t.to_vec1::<u32>())
                .map_err(text)?,
        );
        if g != c {
            return Err(format!("{dtype:?}: the GPU drew {g:?}, the CPU {c:?}"));
        }
        // A temperature alone draws over chunks of four columns, on both.
        let plain = SamplingParams {
            top_k: None,
            top_p: None,
            ..params
        };
        let tokens = |logits: &Tensor| {
            softmax_candle::sample(logits, &plain)
                .and_then(|t| t.flatten_all()?.to_vec1::<u32>())
                .map_err(text)
        };
        let (g_plain, c_plain) = (
            tokens(&logits)?,
            tokens(&logits.to_device(&Device::Cpu).map_err(text)?)?,
        );
        if g_plain != c_plain {
            return Err(format!(
                "{dtype:?}, a temperature alone: the GPU drew {g_plain:?}, the CPU {c_plain:?}"
            ));
        }
        // A sampler from the same offset draws the same first, then moves on.
        let mut sampler = Sampler::new(params, &device).map_err(text)?;
        let first = sampler
            .sample(&logits)
            .and_then(|t| t.flatten_all()?.to_vec1::<u32>())
            .map_err(text)?;
        let second = sampler
            .sample(&logits)
            .and_then(|t| t.flatten_all()?.to_vec1::<u32>())
            .map_err(text)?;
        if first != g || second == g {
            return Err(format!(
                "{dtype:?}: the sampler drew {first:?} then {second:?}"
            ));
        }
        // Greedy is the argmax.
        let greedy = SamplingParams {
            temperature: 0.0,
            ..params
        };
        let tokens = softmax_candle::sample(&logits, &greedy)
            .and_then(|t| t.flatten_all()?.to_vec1::<u32>())
            .map_err(text)?;
        // The first maximum of each row (candle's own argmax may pick a later one among the
        // ties that bf16 rows are full of).
        let host = logits
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_to(1)?.to_vec2::<f32>())
            .map_err(text)?;
        let first: Vec<u32> = host
            .iter()
            .map(|row| {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter().position(|&v| v == max).unwrap() as u32
            })
            .collect();
        if tokens != first {
            return Err(format!(
                "{dtype:?}: greedy {tokens:?}, the first maxima {first:?}"
            ));
        }
        checked += 1;
    }
    Ok(format!(
        "{checked} types: the GPU's tokens are the CPU reference draw's (with top-k and top-p, and with a temperature alone), a sampler advances, greedy is the first argmax"
    ))
}
