//! The CPU reference in `f64`: the test oracle, and a fallback users can compare with.

/// Softmax of each row of a row-major `rows × cols` matrix, computed in `f64`.
///
/// Special values follow `torch.softmax`: a row with a NaN or a `+inf` is all NaN (the
/// maximum and the sum propagate them), a row that is entirely `-inf` is all NaN
/// (`-inf - (-inf)` is NaN), and a `-inf` entry in any other row gives 0.
///
/// # Panics
/// If `input.len() != rows * cols`.
pub fn softmax_f64(input: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    assert_eq!(input.len(), rows * cols, "input length must be rows × cols");
    let mut output = Vec::with_capacity(input.len());
    for row in input.chunks_exact(cols.max(1)).take(rows) {
        let max = row
            .iter()
            .map(|&x| f64::from(x))
            .fold(f64::NEG_INFINITY, nan_propagating_max);
        let exps: Vec<f64> = row.iter().map(|&x| (f64::from(x) - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        output.extend(exps.iter().map(|e| e / sum));
    }
    output
}

/// `max` that returns NaN when either side is NaN, as `torch.max` does.
fn nan_propagating_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// How far a result is from the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deviation {
    /// `‖actual − expected‖₂ / ‖expected‖₂` over the elements where the reference is finite.
    pub relative_l2: f64,
    /// The largest `|Σ row − 1|` over rows whose reference is finite.
    pub worst_row_sum: f64,
    /// Elements whose NaN-ness differs from the reference (includes never-written outputs
    /// when the output was poisoned with NaN).
    pub nan_mismatches: usize,
}

impl Deviation {
    /// Whether the result passes at tolerance `tolerance` for both error measures.
    pub fn within(&self, tolerance: f64) -> bool {
        self.nan_mismatches == 0 && self.relative_l2 < tolerance && self.worst_row_sum < tolerance
    }
}

/// Compares a `rows × cols` result with the reference.
pub fn deviation(actual: &[f32], expected: &[f64], cols: usize) -> Deviation {
    assert_eq!(
        actual.len(),
        expected.len(),
        "result and reference must have the same length"
    );
    let (mut diff, mut norm, mut nan_mismatches, mut worst_row_sum) = (0.0, 0.0, 0, 0.0_f64);
    for (row_actual, row_expected) in actual.chunks(cols.max(1)).zip(expected.chunks(cols.max(1))) {
        let mut row_sum = 0.0;
        let mut row_finite = true;
        for (&a, &e) in row_actual.iter().zip(row_expected) {
            let a = f64::from(a);
            if a.is_nan() != e.is_nan() {
                nan_mismatches += 1;
            }
            if e.is_finite() {
                diff += (a - e) * (a - e);
                norm += e * e;
                row_sum += a;
            } else {
                row_finite = false;
            }
        }
        if row_finite {
            worst_row_sum = worst_row_sum.max((row_sum - 1.0).abs());
        }
    }
    let relative_l2 = if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    };
    Deviation {
        relative_l2,
        worst_row_sum,
        nan_mismatches,
    }
}
