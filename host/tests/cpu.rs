//! Tests that need no GPU: the reference, the online statistics, shapes and variant names,
//! and the GPU tests' own harness and checks.

mod common;

use std::process::{Command, ExitCode};

use common::{RowValues, Span, check_gradient, check_rows, overlapped, softmax_gradient_reference};
use kernels_gpu::primitives::barrier_word;
use kernels_gpu::primitives::draw::{exponential_of, ln_precise, order_key, rank, value_of_rank};
use kernels_gpu::primitives::online::{CompensatedSum, Exp2, OnlineStats};
use kernels_gpu::primitives::philox::{draw_words, philox4x32_10, uniform_open};
use proptest::prelude::*;
use softmax::half::{bf16, f16};
use softmax::reference::{
    CrossEntropyReference, Reduction, Scores, backward_f64, cross_entropy_f64, deviation,
    floored_value_deviation, softmax_f64, value_deviation,
};
use softmax::{DType, Error, RowState, Shape, Variant, merge_row_states};

enum HostExp2 {}

impl Exp2 for HostExp2 {
    fn exp2(x: f32) -> f32 {
        x.exp2()
    }
}

/// Random123's published known answers for Philox4x32-10 (zeros, all ones, and the digits of
/// pi), then what a row's draw depends on.
#[test]
fn philox_gives_the_known_answers_and_draws_depend_on_seed_offset_and_row_only() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0]
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
    let base = draw_words(42, 7, 3, 0);
    assert_eq!(base, draw_words(42, 7, 3, 0));
    for other in [
        draw_words(43, 7, 3, 0),
        draw_words(42, 8, 3, 0),
        draw_words(42, 7, 4, 0),
        draw_words(42, 7, 3, 1),
        draw_words(42 << 32, 7, 3, 0),
        draw_words(42, 7 << 32, 3, 0),
    ] {
        assert_ne!(base, other);
    }
    assert_eq!(uniform_open(0), 1.0 / 16_777_216.0);
    assert_eq!(uniform_open(u32::MAX), 1.0 - 1.0 / 16_777_216.0);
}

/// The sampler's draw as the f64 reference models it (`gumbel_draw_f64`: over chunks of four
/// columns for a temperature alone, over the kept columns with a filter) gives the filtered
/// distribution: a chi-square test of 200,000 draws at significance 0.001, for each filter
/// alone and combined, on 13 columns (the last chunk partial) at global offsets 0 and 4.
#[test]
fn the_sampler_s_draw_follows_the_filtered_distribution() {
    use softmax::reference::{SamplingReference, filtered_distribution_f64, gumbel_draw_f64};
    let logits: Vec<f32> = (0..13).map(|c| ((c * 7) % 13) as f32 * 0.4 - 2.0).collect();
    let plain = SamplingReference {
        temperature: 0.8,
        top_k: None,
        top_p: None,
        min_p: None,
    };
    let cases = [
        (plain, 0),
        (plain, 4),
        (
            SamplingReference {
                top_k: Some(5),
                ..plain
            },
            0,
        ),
        (
            SamplingReference {
                top_p: Some(0.6),
                ..plain
            },
            0,
        ),
        (
            SamplingReference {
                min_p: Some(0.1),
                ..plain
            },
            0,
        ),
        (
            SamplingReference {
                top_k: Some(8),
                top_p: Some(0.8),
                min_p: Some(0.05),
                ..plain
            },
            4,
        ),
    ];
    let draws = 200_000u32;
    for (case, (filters, column_offset)) in cases.iter().enumerate() {
        let expected = filtered_distribution_f64(&logits, filters);
        let mut counts = vec![0u32; logits.len()];
        for draw in 0..draws {
            let token = gumbel_draw_f64(
                &expected,
                filters,
                7,
                u64::from(draw),
                case as u32,
                *column_offset,
            );
            counts[token as usize] += 1;
        }
        let kept: Vec<usize> = (0..logits.len()).filter(|&c| expected[c] > 0.0).collect();
        let chi2: f64 = kept
            .iter()
            .map(|&c| {
                let e = expected[c] * f64::from(draws);
                (f64::from(counts[c]) - e).powi(2) / e
            })
            .sum();
        // The 0.999 quantiles of chi-square with 1..=12 degrees of freedom.
        let critical = [
            10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91,
        ];
        let degrees = kept.len() - 1;
        assert!(
            degrees == 0 || chi2 < critical[degrees - 1],
            "case {case}: chi-square {chi2:.1} over {degrees} degrees of freedom"
        );
        assert!(
            counts
                .iter()
                .zip(&expected)
                .all(|(&n, &p)| p > 0.0 || n == 0)
        );
    }
}

#[test]
fn the_draws_order_and_logarithm_are_exact_enough() {
    // The order key preserves the order of floats, zeros of either sign are one rank, and a
    // rank gives back its logit.
    let values = [
        f32::NEG_INFINITY,
        -3.4e38,
        -1.0,
        -1e-40,
        -0.0,
        0.0,
        1e-40,
        2.5,
        f32::INFINITY,
    ];
    for pair in values.windows(2) {
        assert!(order_key(pair[0]) <= order_key(pair[1]), "{pair:?}");
    }
    assert_eq!(rank(-0.0, 3), rank(0.0, 3));
    assert!(
        rank(1.0, 5) > rank(1.0, 6),
        "the lower column first among equals"
    );
    assert!(rank(1.5, 9) > rank(1.0, 0));
    for &v in &[-7.25f32, 0.0, 3.0e-5, 1234.5] {
        assert_eq!(value_of_rank(rank(v, 11)), v + 0.0);
    }
    // ln to a few ulp, relative, over (0, 1], near 1 included.
    let mut worst: f64 = 0.0;
    for bits in (0x0080_0000u32..=0x3F80_0000).step_by(997) {
        let x = f32::from_bits(bits);
        let exact = f64::from(x).ln();
        if exact == 0.0 {
            assert_eq!(ln_precise(x), 0.0);
            continue;
        }
        worst = worst.max(((f64::from(ln_precise(x)) - exact) / exact).abs());
    }
    assert!(
        worst < 4.0 * f64::from(f32::EPSILON),
        "relative error {worst:e}"
    );
    // The exponential variate stays positive and finite at both ends of the uniform.
    for bits in [0u32, 511, 1 << 31, u32::MAX - 511, u32::MAX] {
        let e = exponential_of(bits);
        assert!(e > 0.0 && e < 17.0, "{bits:#x}: {e}");
    }
}

#[test]
fn reference_matches_hand_computed_rows() {
    let y = softmax_f64(&[1.0, 2.0, 3.0, 0.0, 0.0, 0.0], 2, 3);
    let e = std::f64::consts::E;
    let z = 1.0 + e + e * e;
    let expected = [1.0 / z, e / z, e * e / z, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
    for (a, b) in y.iter().zip(expected) {
        assert!((a - b).abs() < 1e-15, "{a} vs {b}");
    }
}

#[test]
fn reference_is_shift_invariant_and_stable_for_large_inputs() {
    let y = softmax_f64(&[10000.0, 10001.0, -10000.0], 1, 3);
    let e = std::f64::consts::E;
    assert!((y[0] - 1.0 / (1.0 + e)).abs() < 1e-15);
    assert!((y[1] - e / (1.0 + e)).abs() < 1e-15);
    assert_eq!(y[2], 0.0);
}

#[test]
fn reference_special_values_follow_pytorch() {
    let inf = f32::INFINITY;
    let y = softmax_f64(&[f32::NEG_INFINITY, 0.0, 0.0], 1, 3);
    assert_eq!(y, vec![0.0, 0.5, 0.5]);
    for row in [[-inf, -inf, -inf], [1.0, f32::NAN, 2.0], [1.0, inf, 2.0]] {
        assert!(
            softmax_f64(&row, 1, 3).iter().all(|v| v.is_nan()),
            "{row:?} must give all NaN"
        );
    }
}

#[test]
fn deviation_flags_unwritten_and_wrong_outputs() {
    let expected = softmax_f64(&[0.0, 1.0], 1, 2);
    let exact: Vec<f32> = expected.iter().map(|&v| v as f32).collect();
    assert!(deviation(&exact, &expected, 2).within(1e-6));
    assert!(!deviation(&[exact[0], f32::NAN], &expected, 2).within(1e-6));
    assert!(!deviation(&[0.5, 0.5], &expected, 2).within(1e-6));
}

/// One pass of `push` over a row.
fn one_pass(row: &[f32]) -> OnlineStats {
    let mut stats = OnlineStats::EMPTY;
    for &x in row {
        stats.push::<HostExp2>(x);
    }
    stats
}

fn assert_same_stats(a: OnlineStats, b: OnlineStats) {
    assert_eq!(a.max, b.max);
    assert!(
        (a.sum() - b.sum()).abs() <= 1e-5 * b.sum().abs().max(1.0),
        "{a:?} vs {b:?}"
    );
}

proptest! {
    /// Merging the states of two column slices gives the state of the whole row, in either
    /// order, and the empty state changes nothing.
    #[test]
    fn merged_slice_states_equal_the_whole_row(
        row in prop::collection::vec(-80f32..80.0, 2..400),
        cut in any::<prop::sample::Index>(),
    ) {
        let cut = 1 + cut.index(row.len() - 1);
        let (left, right) = (state_of(&row[..cut]), state_of(&row[cut..]));
        let merged = merge_row_states(left, right);
        prop_assert_eq!(merged, merge_row_states(right, left));
        let whole = state_of(&row);
        let scaled = f64::from(merged.sum) * (f64::from(merged.max) - f64::from(whole.max)).exp();
        prop_assert!((scaled / f64::from(whole.sum) - 1.0).abs() < 1e-5, "{merged:?} vs {whole:?}");
        let empty = RowState { max: f32::NEG_INFINITY, sum: 0.0 };
        prop_assert_eq!(merge_row_states(left, empty), left);
    }

    /// Pushing a row in batches of four packs of four (the last padded with `-inf`, as the
    /// row-slices kernel does) gives the statistics of pushing it element by element.
    #[test]
    fn batched_push_equals_one_pass(row in prop::collection::vec(-80.0f32..80.0, 1..200)) {
        let mut batched = OnlineStats::EMPTY;
        for chunk in row.chunks(16) {
            let mut batch = [[f32::NEG_INFINITY; 4]; 4];
            for (slot, &x) in batch.iter_mut().flatten().zip(chunk) {
                *slot = x;
            }
            let flat = batch.as_flattened();
            let batch_max = flat.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            batched.push_batch::<HostExp2>(batch_max, flat.len(), |i| flat[i]);
        }
        assert_same_stats(batched, one_pass(&row));
    }

    /// Any split of a row into parts, merged in any order, gives the one-pass statistics.
    #[test]
    fn merge_of_any_split_in_any_order_equals_one_pass(
        row in prop::collection::vec(-80.0f32..80.0, 1..200),
        cuts in prop::collection::vec(0usize..200, 0..8),
        order_seed in any::<u64>(),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (row.len() + 1)).collect();
        cuts.extend([0, row.len()]);
        cuts.sort_unstable();
        let mut parts: Vec<OnlineStats> = cuts.windows(2).map(|w| one_pass(&row[w[0]..w[1]])).collect();
        // A deterministic shuffle driven by the seed.
        let mut state = order_seed | 1;
        for i in (1..parts.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            parts.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let merged = parts.into_iter().fold(OnlineStats::EMPTY, |a, b| a.merge::<HostExp2>(b));
        assert_same_stats(merged, one_pass(&row));
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&x| (f64::from(x) - f64::from(max)).exp()).sum();
        prop_assert_eq!(merged.max, max);
        prop_assert!((f64::from(merged.sum()) - sum).abs() <= 1e-5 * sum);
    }
}

#[test]
fn online_stats_handle_infinities_like_pytorch() {
    let inf = f32::INFINITY;
    let with_neg_inf = one_pass(&[f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY]);
    assert_eq!((with_neg_inf.max, with_neg_inf.sum()), (1.0, 1.0));
    assert_eq!(one_pass(&[f32::NEG_INFINITY; 3]), OnlineStats::EMPTY);
    assert!(one_pass(&[1.0, inf, 2.0]).sum().is_nan());
    assert!(one_pass(&[1.0, f32::NAN]).sum().is_nan());
    let batched = |values: [f32; 2]| {
        let mut stats = OnlineStats::EMPTY;
        stats.push_batch::<HostExp2>(values[0].max(values[1]), 2, |i| values[i]);
        stats
    };
    assert_eq!(batched([f32::NEG_INFINITY; 2]), OnlineStats::EMPTY);
    assert_eq!(
        (
            batched([f32::NEG_INFINITY, 1.0]).max,
            batched([f32::NEG_INFINITY, 1.0]).sum()
        ),
        (1.0, 1.0)
    );
    assert!(batched([1.0, inf]).sum().is_nan());
    assert!(batched([f32::NAN, 1.0]).sum().is_nan());
    // An empty part merged with a part of only -inf stays empty, not NaN.
    let merged = OnlineStats::EMPTY.merge::<HostExp2>(one_pass(&[f32::NEG_INFINITY]));
    assert_eq!(merged, OnlineStats::EMPTY);
}

#[test]
fn compensated_sum_of_many_small_terms_stays_accurate() {
    // 2^20 terms of 0.1: a plain f32 running sum drifts by about 1e-3 relative.
    let mut sum = CompensatedSum::ZERO;
    let mut naive = 0.0f32;
    for _ in 0..1 << 20 {
        sum.add(0.1);
        naive += 0.1;
    }
    let exact = 0.1f64 * f64::from(1 << 20);
    assert!((f64::from(sum.value()) - exact).abs() / exact < 1e-6);
    assert!(
        (f64::from(naive) - exact).abs() / exact > 1e-4,
        "the test must be able to tell"
    );
}

#[test]
fn shapes_refuse_overflow_and_accept_empty() {
    assert!(matches!(
        Shape::new(usize::MAX, 2),
        Err(Error::ShapeTooLarge { .. })
    ));
    assert!(matches!(
        Shape::new(usize::MAX / 2, 2),
        Err(Error::ShapeTooLarge { .. })
    ));
    assert!(matches!(
        Shape::new(1 << 31, 1),
        Err(Error::ShapeTooLarge { .. })
    ));
    assert!(Shape::new(0, 5).unwrap().is_empty());
    assert!(Shape::new(5, 0).unwrap().is_empty());
    assert_eq!(Shape::new(3, 4).unwrap().min_traffic_bytes(), 96);
}

#[test]
fn shapes_parse_from_text() {
    assert_eq!(
        "3x100003".parse::<Shape>().unwrap(),
        Shape::new(3, 100003).unwrap()
    );
    for bad in ["0x10", "10x", "abc", "10x0", "x5", "-1x4", ""] {
        assert!(bad.parse::<Shape>().is_err(), "{bad} must be refused");
    }
}

#[test]
fn variant_names_round_trip() {
    for variant in Variant::all() {
        assert_eq!(variant.name().parse::<Variant>().unwrap(), variant);
    }
    assert_eq!(
        "block-smem:512".parse::<Variant>().unwrap(),
        Variant::BlockPerRowSmem {
            threads_per_block: 512
        }
    );
    assert!(matches!(
        "nope".parse::<Variant>(),
        Err(Error::UnknownVariant(..))
    ));
}

#[test]
fn threads_per_block_must_be_a_power_of_two_in_range() {
    for bad in [0, 16, 100, 2048, 96] {
        let variant = Variant::BlockPerRowSmem {
            threads_per_block: bad,
        };
        assert!(matches!(variant.validate(), Err(Error::ThreadsPerBlock(t)) if t == bad));
        assert!(format!("block-smem:{bad}").parse::<Variant>().is_err());
    }
    for good in [32, 64, 128, 256, 512, 1024] {
        assert!(
            Variant::BlockPerRowSmem {
                threads_per_block: good
            }
            .validate()
            .is_ok()
        );
    }
}

/// The statistics of a row, as the kernels store them (f32), computed in f64.
fn state_of(row: &[f32]) -> RowState {
    let (max, sum) = Scores::default().states(row, 1, row.len())[0];
    RowState {
        max: max as f32,
        sum: sum as f32,
    }
}

proptest! {
    /// `Shape::new` accepts exactly the shapes whose bytes fit in `usize` and whose dimensions
    /// fit the kernels' 32-bit indices, and the length check accepts exactly `rows × cols`.
    #[test]
    fn shape_checks_accept_exactly_the_addressable_shapes(rows in any::<usize>(), cols in any::<usize>()) {
        let addressable = rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).is_some()
            && rows < 1 << 31
            && cols < 1 << 31;
        prop_assert_eq!(Shape::new(rows, cols).is_ok(), addressable);
    }

    #[test]
    fn shapes_round_trip_through_text(rows in 1usize..1 << 20, cols in 1usize..1 << 20) {
        let shape = Shape::new(rows, cols).unwrap();
        prop_assert_eq!(shape.to_string().parse::<Shape>().unwrap(), shape);
    }

    /// The reference's rows are probability distributions whenever the row is finite.
    #[test]
    fn reference_rows_sum_to_one(row in prop::collection::vec(-1e4f32..1e4, 1..300)) {
        let y = softmax_f64(&row, 1, row.len());
        prop_assert!((y.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        prop_assert!(y.iter().all(|&v| (0.0..=1.0).contains(&v)));
    }
}

proptest! {
    /// The cooperative kernels' per-row barrier word, over several launches with different
    /// numbers of blocks per row and the leader arriving at any point: no block's addition
    /// but the last one's flips the word (nobody is released early), the last one's does (the
    /// waiting blocks are released, and the last block knows it is last), and the word is
    /// left ready for the next launch.
    #[test]
    fn barrier_word_flips_exactly_at_the_last_arrival(
        launches in prop::collection::vec((1u32..=2048, any::<prop::sample::Index>()), 1..8)
    ) {
        let mut word = 0u32;
        for (participants, leader_index) in launches {
            let leader_rank = leader_index.index(participants as usize) as u32;
            let entered = word;
            for rank in 0..participants {
                let arrival = barrier_word::arrival(participants, rank == leader_rank);
                let before = word;
                word = word.wrapping_add(arrival);
                let last = rank + 1 == participants;
                prop_assert!(!barrier_word::has_flipped(entered, before));
                prop_assert_eq!(barrier_word::has_flipped(before, word), last);
            }
            prop_assert!(barrier_word::has_flipped(entered, word));
            prop_assert_eq!(word & !barrier_word::GENERATION_BIT, 0);
        }
    }
}

/// One block in the model of the barrier protocol with leavers.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Waiter {
    NotArrived,
    /// Arrived; its addition found `before`; it last read `seen`.
    Waiting {
        before: u32,
        seen: u32,
    },
    Released,
    Left,
    Last,
}

/// Runs one launch of `participants` blocks under the protocol with leavers, in the order
/// `choices` picks (arrive, poll, leave, or apply the last block's pending reset), checking
/// every step. Returns the word after the launch.
fn leaver_protocol_launch(
    mut word: u32,
    participants: u32,
    choices: &mut impl Iterator<Item = u32>,
) -> Result<u32, TestCaseError> {
    let entered = word;
    let mut blocks = vec![Waiter::NotArrived; participants as usize];
    let (mut pending_reset, mut left, mut last_saw_leavers) = (None, 0, None);
    // Once the choices run out, a counter visits every block in turn with every action.
    let mut fallback = 0u32;
    loop {
        let active: Vec<usize> = (0..blocks.len())
            .filter(|&b| matches!(blocks[b], Waiter::NotArrived | Waiter::Waiting { .. }))
            .collect();
        if active.is_empty() && pending_reset.is_none() {
            break;
        }
        let pick = choices.next().unwrap_or_else(|| {
            fallback = fallback.wrapping_add(1);
            fallback
        });
        if let Some(reset) = pending_reset
            && (active.is_empty() || pick % 4 == 0)
        {
            word = word.wrapping_add(reset);
            pending_reset = None;
            continue;
        }
        let b = active[pick as usize / 4 % active.len()];
        let arrived = blocks
            .iter()
            .filter(|w| !matches!(w, Waiter::NotArrived))
            .count() as u32;
        match blocks[b] {
            Waiter::NotArrived => {
                let before = word;
                word = word.wrapping_add(barrier_word::ARRIVAL);
                if barrier_word::is_last_arrival(before, participants) {
                    prop_assert_eq!(arrived + 1, participants, "last before everyone arrived");
                    last_saw_leavers = Some(barrier_word::leavers(before));
                    pending_reset = Some(barrier_word::reset_after_last(before, participants));
                    blocks[b] = Waiter::Last;
                } else {
                    blocks[b] = Waiter::Waiting {
                        before,
                        seen: before,
                    };
                }
            }
            Waiter::Waiting { before, seen } => {
                if pick % 2 == 0 {
                    // Poll.
                    if barrier_word::has_released(before, word, participants) {
                        prop_assert_eq!(arrived, participants, "released before everyone arrived");
                        blocks[b] = Waiter::Released;
                    } else {
                        blocks[b] = Waiter::Waiting { before, seen: word };
                    }
                } else if !barrier_word::has_released(before, seen, participants) {
                    // Leave: swap what it last saw, if the word still holds it.
                    if word == seen {
                        prop_assert!(last_saw_leavers.is_none(), "left after the last arrival");
                        word = seen + barrier_word::LEAVER;
                        left += 1;
                        blocks[b] = Waiter::Left;
                    } else {
                        blocks[b] = Waiter::Waiting { before, seen: word };
                    }
                }
            }
            _ => unreachable!("only active blocks are picked"),
        }
    }
    prop_assert_eq!(blocks.iter().filter(|w| **w == Waiter::Last).count(), 1);
    prop_assert_eq!(
        last_saw_leavers,
        Some(left),
        "the last block miscounted the leavers"
    );
    prop_assert!(barrier_word::has_flipped(entered, word));
    prop_assert_eq!(word & !barrier_word::GENERATION_BIT, 0, "word not at rest");
    Ok(word)
}

proptest! {
    /// The protocol with leavers, over launches of either protocol on one word (they share
    /// the workspace), blocks arriving, polling, leaving and the last block's reset landing in
    /// any order: nobody is released before every block arrived, exactly one block is last
    /// and learns exactly how many left, no block leaves once the row is complete, everyone
    /// is released or left, and the word is left at rest for either protocol.
    #[test]
    fn leaver_barrier_counts_exactly_the_blocks_that_left(
        launches in prop::collection::vec((1u32..=300, any::<bool>()), 1..6),
        choices in prop::collection::vec(any::<u32>(), 0..4000),
    ) {
        let mut choices = choices.into_iter();
        let mut word = 0u32;
        for (participants, may_leave) in launches {
            if may_leave {
                word = leaver_protocol_launch(word, participants, &mut choices)?;
            } else {
                let entered = word;
                for rank in 0..participants {
                    word = word.wrapping_add(barrier_word::arrival(participants, rank == 0));
                }
                prop_assert!(barrier_word::has_flipped(entered, word));
                prop_assert_eq!(word & !barrier_word::GENERATION_BIT, 0);
            }
        }
    }
}

#[test]
fn reference_handles_denormals_single_columns_and_dominant_values() {
    // A single column is always 1, whatever its value (NaN and +inf excepted).
    assert_eq!(softmax_f64(&[-3e38, 0.0, 3e38, 1e-40], 4, 1), vec![1.0; 4]);
    // Denormal inputs behave like zeros next to each other.
    let y = softmax_f64(&[1e-40, -1e-40, 0.0], 1, 3);
    assert!(y.iter().all(|v| (v - 1.0 / 3.0).abs() < 1e-15));
    // One value 100 above the rest takes all the mass to within e^-100.
    let y = softmax_f64(&[100.0, 0.0, 0.0], 1, 3);
    assert_eq!(y[0], 1.0);
    assert!((y[1] / (-100f64).exp() - 1.0).abs() < 1e-12, "{}", y[1]);
}

proptest! {
    /// The operations' reference agrees with itself: log-softmax is the log of softmax, the
    /// log-sum-exp is what both are normalized by, and the gradients of both sum to zero
    /// along a row (the outputs' sum is fixed).
    #[test]
    fn operation_references_are_consistent(
        row in prop::collection::vec(-30f32..30.0, 1..200),
        dy_seed in prop::collection::vec(-1f32..1.0, 200),
        temperature in 0.25f32..4.0,
    ) {
        let cols = row.len();
        let scores = Scores { scale: 1.0 / temperature, ..Scores::default() };
        let p = scores.forward(false, &row, 1, cols);
        let log_p = scores.forward(true, &row, 1, cols);
        let lse = scores.log_sum_exp(&row, 1, cols)[0];
        for ((&p, &log_p), &x) in p.iter().zip(&log_p).zip(&row) {
            prop_assert!((p.ln() - log_p).abs() < 1e-9);
            prop_assert!((f64::from(x) / f64::from(temperature) - lse - log_p).abs() < 1e-3);
        }
        let dy = &dy_seed[..cols];
        for (log, y) in [(false, &p), (true, &log_p)] {
            let y: Vec<f32> = y.iter().map(|&v| v as f32).collect();
            let dx = backward_f64(log, &y, dy, cols, &[1.0]);
            let scale: f64 = dy.iter().map(|d| f64::from(d.abs())).sum::<f64>() + 1.0;
            prop_assert!(dx.iter().sum::<f64>().abs() < 1e-5 * scale, "log {log}: {}", dx.iter().sum::<f64>());
        }
    }
}

#[test]
fn reference_masks_causal_and_fully_masked_rows() {
    // Two heads of 3×3 causal blocks: row r keeps columns 0..=r % 3.
    let x = vec![1.0f32; 18];
    let causal = Scores {
        causal: true,
        ..Scores::default()
    };
    let y = causal.forward(false, &x, 6, 3);
    for r in 0..6 {
        for c in 0..3 {
            let expected = if c <= r % 3 {
                1.0 / (r % 3 + 1) as f64
            } else {
                0.0
            };
            assert!((y[r * 3 + c] - expected).abs() < 1e-12, "row {r} col {c}");
        }
    }
    // One boolean mask row for all rows; the second data row is then masked everywhere only
    // by its own -inf input.
    let allowed = [1u8, 0, 1];
    let x = [0.0f32, 5.0, 0.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY];
    let nan = Scores {
        allowed_mask: Some(&allowed),
        ..Scores::default()
    };
    let y = nan.forward(false, &x, 2, 3);
    assert_eq!(&y[..3], &[0.5, 0.0, 0.5]);
    assert!(y[3..].iter().all(|v| v.is_nan()));
    let zero = Scores {
        zero_masked_rows: true,
        ..nan
    };
    assert_eq!(&zero.forward(false, &x, 2, 3)[3..], &[0.0; 3]);
    assert_eq!(&zero.forward(true, &x, 2, 3)[3..], &[f64::NEG_INFINITY; 3]);
    assert_eq!(nan.log_sum_exp(&x, 2, 3)[1], f64::NEG_INFINITY);
    // An additive mask of k rows applies mask row r % k (k = 2 here, over 4 rows).
    let additive = [0.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0];
    let scores = Scores {
        additive_mask: Some(&additive),
        ..Scores::default()
    };
    let y = scores.forward(false, &[3.0; 8], 4, 2);
    assert_eq!(y, vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
}

/// Where a peeled row's head and tail go.
#[derive(Clone, Copy, PartialEq)]
enum Ends {
    /// Aligned rows and single elements: none.
    None,
    /// A group's first two slots (`RowPart::piece`).
    InSlots,
    /// A block's extra slot, apart from the body's (`RowPart::body_pack`, `RowPart::end_piece`).
    Apart,
}

/// Every column of a row covered exactly once by the pieces of its parts, packs aligned,
/// runs shorter than a pack, within the slots the planner gives each part: `slice_packs`, plus
/// `END_SLOTS` when a group holds a peeled row's ends in its slots. The row starts `row_start`
/// elements past a 16-byte boundary and is cut into `slices` parts as the planner sizes them.
fn row_parts_cover<const PACK: usize>(
    cols: usize,
    row_start: usize,
    slices: usize,
    ends: Ends,
) -> Result<(), TestCaseError> {
    use kernels_gpu::launch::ops::END_SLOTS;
    use kernels_gpu::primitives::row_part::{Piece, RowPart, unaligned_head};

    let bytes = 16 / PACK;
    let head = unaligned_head(row_start * bytes, bytes, PACK);
    let slice_packs = (cols / PACK).div_ceil(slices).max(1);
    let end_slots = END_SLOTS as usize;
    let mut covered = vec![0u8; cols];
    for slice in 0..slices {
        let part = RowPart::new::<PACK>(cols, head, slice, slice_packs);
        let pieces: Vec<(Piece, bool)> = match ends {
            Ends::InSlots => (0..slice_packs + end_slots)
                .map(|j| {
                    let piece = part.piece::<PACK>(j);
                    // Slots that cannot be ends read the same either way.
                    if j >= end_slots {
                        assert_eq!(piece, part.body_piece::<PACK>(j));
                    }
                    (piece, j < end_slots)
                })
                .collect(),
            Ends::None | Ends::Apart => (0..slice_packs)
                .map(|j| (part.body_pack::<PACK>(j), false))
                .chain(
                    (0..end_slots)
                        .filter(|_| ends == Ends::Apart)
                        .map(|end| (part.end_piece(end), true)),
                )
                .collect(),
        };
        for (piece, end_slot) in pieces {
            let (start, count) = match piece {
                Piece::Pack(col) => {
                    prop_assert!(!end_slot || ends == Ends::InSlots, "pack in an end slot");
                    prop_assert_eq!((row_start + col) % PACK, 0, "pack at {} not aligned", col);
                    (col, PACK)
                }
                Piece::Run { start, count } => {
                    prop_assert!(slice == 0 && end_slot, "run in part {} off its ends", slice);
                    prop_assert!(0 < count && count < PACK);
                    (start, count)
                }
                Piece::Nothing => continue,
            };
            prop_assert!(start + count <= cols, "columns {}.. past the row", start);
            for times in &mut covered[start..start + count] {
                *times += 1;
            }
        }
    }
    prop_assert!(covered.iter().all(|&n| n == 1), "coverage {:?}", covered);
    Ok(())
}

proptest! {
    #[test]
    fn row_parts_cover_every_column_once(
        cols in 1usize..3000,
        row_start in 0usize..8,
        slices in 1usize..6,
    ) {
        // Unaligned rows: the ends in a group's slots, or apart as a block holds them.
        for ends in [Ends::InSlots, Ends::Apart] {
            row_parts_cover::<8>(cols, row_start, slices, ends)?;
            row_parts_cover::<4>(cols, row_start % 4, slices, ends)?;
        }
        // Aligned rows (whole packs from an aligned start) and single elements: no ends.
        row_parts_cover::<8>(cols.next_multiple_of(8), 0, slices, Ends::None)?;
        row_parts_cover::<4>(cols.next_multiple_of(4), 0, slices, Ends::None)?;
        row_parts_cover::<1>(cols, 0, slices, Ends::None)?;
    }
}

/// This test's name: the harness runs the tests whose name contains its first argument, and
/// the child below gets this name as that argument.
const HARNESS_TEST: &str = "a_missing_gpu_fails_the_gpu_tests_when_one_is_required";

/// Set in the environment of the child that [`a_missing_gpu_fails_the_gpu_tests_when_one_is_required`]
/// starts.
const HARNESS_CHILD: &str = "SOFTMAX_HARNESS_CHILD";

/// The value of [`HARNESS_CHILD`] that gives the child's harness no test its filter matches.
const NOTHING_MATCHES: &str = "nothing-matches";

/// The GPU test binaries' harness on a machine without a device (`CUDA_VISIBLE_DEVICES`
/// empty hides any GPU): with `SOFTMAX_REQUIRE_GPU=1` every test fails, with a message, and
/// the binary exits non-zero; without it every test is skipped and the binary exits zero; a
/// filter that matches no test fails the run, so a mistyped filter cannot pass.
/// The harness runs in a child (this test binary again), as it runs in a GPU test binary.
#[test]
fn a_missing_gpu_fails_the_gpu_tests_when_one_is_required() {
    if let Some(mode) = std::env::var_os(HARNESS_CHILD) {
        let name = if mode == NOTHING_MATCHES {
            "a_test_the_filter_does_not_name"
        } else {
            HARNESS_TEST
        };
        let code = common::run_harness(&[(name, |_, _| Ok("ran".into()))]);
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
    let harness = |required: Option<&str>, mode: &str| {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"));
        child
            .args(["--exact", HARNESS_TEST, "--nocapture", "--test-threads=1"])
            .env(HARNESS_CHILD, mode)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env_remove(common::REQUIRE_GPU);
        if let Some(value) = required {
            child.env(common::REQUIRE_GPU, value);
        }
        let out = child.output().expect("the child runs");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (out.status, text(&out.stdout), text(&out.stderr))
    };
    let (status, stdout, stderr) = harness(Some("1"), "1");
    assert!(
        !status.success(),
        "a missing GPU passed with SOFTMAX_REQUIRE_GPU=1:\n{stdout}{stderr}"
    );
    assert!(
        stdout.contains(&format!("test {HARNESS_TEST} ... FAILED: no CUDA device")),
        "{stdout}"
    );
    assert!(
        stderr.contains("SOFTMAX_REQUIRE_GPU is set but there is no CUDA device"),
        "{stderr}"
    );
    let (status, stdout, stderr) = harness(None, "1");
    assert!(status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("test {HARNESS_TEST} ... skipped: no CUDA device")),
        "{stdout}"
    );
    let (status, stdout, stderr) = harness(None, NOTHING_MATCHES);
    assert!(
        !status.success(),
        "a filter matching no test passed:\n{stdout}{stderr}"
    );
    assert!(stdout.contains("no test matches the filter"), "{stdout}");
}

/// A bf16 softmax output as an exact kernel writes it, then with one row corrupted: its two
/// extreme values swapped (the row still sums to 1), or every value 10% high. A relative L2
/// norm over the whole tensor (with every row's sum) accepts both; the per-row check does not.
#[test]
fn the_per_row_check_rejects_one_bad_row_that_a_whole_tensor_norm_accepts() {
    const TOLERANCE: f64 = 1.5e-2;
    let (rows, cols) = (4096, 64);
    let input: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.008 - 4.0)
        .collect();
    let expected = softmax_f64(&input, rows, cols);
    let written = common::as_written::<bf16>(&expected);
    let exact: Vec<f32> = written.iter().map(|&v| v as f32).collect();
    let check = |actual: &[f32]| {
        check_rows(
            actual,
            &written,
            cols,
            RowValues::Probabilities,
            DType::Bf16,
            TOLERANCE,
        )
    };
    assert!(check(&exact).is_ok());

    let mut swapped = exact.clone();
    let row = &mut swapped[1000 * cols..1001 * cols];
    let position = |best: fn(f32, f32) -> bool| {
        (0..cols).fold(0, |at, i| if best(row[i], row[at]) { i } else { at })
    };
    let (largest, smallest) = (position(|a, b| a > b), position(|a, b| a < b));
    row.swap(largest, smallest);
    assert!(deviation(&swapped, &expected, cols).within(TOLERANCE));
    let why = check(&swapped).expect_err("a row with two values swapped passed");
    assert!(why.starts_with("row 1000, column "), "{why}");

    let mut scaled = exact.clone();
    scaled[2000 * cols..2001 * cols]
        .iter_mut()
        .for_each(|v| *v *= 1.1);
    assert!(value_deviation(&scaled, &expected).within(TOLERANCE));
    let why = check(&scaled).expect_err("a row 10% high passed");
    assert!(why.starts_with("row 2000, "), "{why}");
}

/// f16 probabilities below the smallest normal number are judged by the type's absolute
/// spacing: a wide row of subnormals one step off (up and down in turn) passes, three steps
/// off does not, and one step high everywhere passes element by element but not as a sum
/// (1.2% over the reference's).
#[test]
fn the_per_row_check_judges_subnormal_16_bit_values_by_their_spacing() {
    const TOLERANCE: f64 = 2e-3;
    let cols = 200_003;
    let written = common::as_written::<f16>(&vec![1.0 / cols as f64; cols]);
    let step = f16::from_bits(1).to_f32();
    let off_by = |steps: fn(usize) -> f32| -> Vec<f32> {
        let shifted = written.iter().enumerate();
        shifted.map(|(i, &v)| v as f32 + steps(i) * step).collect()
    };
    let check = |actual: &[f32]| {
        check_rows(
            actual,
            &written,
            cols,
            RowValues::Probabilities,
            DType::F16,
            TOLERANCE,
        )
    };
    check(&off_by(|i| if i % 2 == 0 { 1.0 } else { -1.0 })).expect("one step off in turn");
    let why = check(&off_by(|_| 3.0)).expect_err("three steps off passed");
    assert!(why.starts_with("row 0, column 0:"), "{why}");
    let why = check(&off_by(|_| 1.0)).expect_err("a row summing 1.2% high passed");
    assert!(why.starts_with("row 0 sums to "), "{why}");
}

/// Log-probabilities near 0 are judged absolutely (what is left there is the rounding of the
/// scores), the others relative to themselves; NaN and -inf must match exactly.
#[test]
fn the_per_row_check_of_log_probabilities() {
    let written = [-1e-7, -0.69, -20.0, f64::NEG_INFINITY, -3.0];
    let close = [-1.2e-7_f32, -0.6901, -20.01, f32::NEG_INFINITY, -3.0];
    let check = |actual: &[f32]| {
        check_rows(
            actual,
            &written,
            5,
            RowValues::LogProbabilities,
            DType::Bf16,
            1.5e-2,
        )
    };
    check(&close).expect("close log-probabilities");
    for (col, wrong) in [(2, -21.0), (3, -1e30), (4, f32::NAN)] {
        let mut actual = close;
        actual[col] = wrong;
        let why = check(&actual).expect_err("a wrong log-probability passed");
        assert!(why.starts_with(&format!("row 0, column {col}:")), "{why}");
    }
}

/// The concurrency tests' verdict from event times: two streams of 1 ms each that ran one
/// after the other, or took turns launch by launch, did not overlap; two that ran side by side
/// did.
#[test]
fn overlap_is_read_from_the_streams_event_times() {
    let alone = [1.0, 1.0];
    let span = |first, last| Span { first, last };
    let one_after_the_other = [span(0.02, 1.0), span(1.02, 2.0)];
    let why = overlapped(&alone, &one_after_the_other, 0.9).expect_err("serial passed");
    assert!(why.contains("ran one after the other"), "{why}");
    let in_turns = [span(0.02, 1.96), span(0.04, 2.0)];
    let why = overlapped(&alone, &in_turns, 0.9).expect_err("launches in turns passed");
    assert!(why.contains("did not overlap"), "{why}");
    let side_by_side = [span(0.02, 1.1), span(0.03, 1.15)];
    overlapped(&alone, &side_by_side, 0.9).expect("streams side by side");
}

/// The soak's check of gradient values: an f32 computation from probabilities 2e-5 off the
/// reference passes, rows whose gradient cancels to near zero included; a value 0.1% off its
/// terms does not, nor a NaN where the reference has a number.
#[test]
fn the_gradient_check_holds_each_value_to_its_terms() {
    let cols = 50;
    let mut x: Vec<f32> = (0..4 * cols)
        .map(|i| ((i * 37) % 23) as f32 * 0.5)
        .collect();
    x[2 * cols + 7] = 80.0; // one value takes almost all of row 2: its gradient cancels
    x[3 * cols + 9] = 12.0; // row 3: one value takes 99.9%
    let y = softmax_f64(&x, 4, cols);
    let dy: Vec<f32> = (0..4 * cols)
        .map(|i| ((i * 53) % 19) as f32 / 9.0 - 1.0)
        .collect();
    let (expected, terms) = softmax_gradient_reference(&y, &dy, cols);
    let kernel_y: Vec<f32> = y
        .iter()
        .enumerate()
        .map(|(i, &v)| (v * if i % 2 == 0 { 1.0 + 2e-5 } else { 1.0 - 2e-5 }) as f32)
        .collect();
    let kernel_dx: Vec<f32> = kernel_y
        .chunks(cols)
        .zip(dy.chunks(cols))
        .flat_map(|(y, dy)| {
            let sum: f32 = y.iter().zip(dy).map(|(y, dy)| y * dy).sum();
            y.iter().zip(dy).map(move |(y, dy)| y * (dy - sum))
        })
        .collect();
    check_gradient(&kernel_dx, &expected, &terms, 1e-4).expect("an f32 gradient");
    let mut off = kernel_dx.clone();
    let at = cols + 3;
    off[at] += (1e-3 * terms[at]) as f32;
    let why = check_gradient(&off, &expected, &terms, 1e-4).expect_err("0.1% off passed");
    assert!(why.starts_with(&format!("element {at}:")), "{why}");
    let mut nan = kernel_dx;
    nan[5] = f32::NAN;
    assert!(check_gradient(&nan, &expected, &terms, 1e-4).is_err());
}

/// The kernels flush results below f32's smallest normal to zero: the per-row check accepts a
/// zero where the reference is at most that small (also once rounded up to it), and nothing
/// larger.
#[test]
fn the_per_row_check_accepts_flushed_results_and_nothing_larger() {
    let tiny = f64::from(f32::MIN_POSITIVE);
    let check = |expected: f64| {
        check_rows(
            &[0.0, 1.0],
            &[expected, 1.0],
            2,
            RowValues::Probabilities,
            DType::Bf16,
            1e-2,
        )
    };
    assert!(check(3.6e-42).is_ok());
    assert!(check(tiny).is_ok());
    assert!(check(1e-30).is_err());
}

/// The public reference never panics: rows of no columns, masks and per-row scales shorter
/// than their shape asks, and results of the wrong length give values or failing
/// comparisons, not a panic.
#[test]
fn the_reference_handles_empty_rows_short_masks_and_wrong_lengths() {
    assert!(backward_f64(false, &[], &[], 0, &[1.0; 3]).is_empty());
    assert!(backward_f64(true, &[0.5; 4], &[1.0; 3], 2, &[1.0; 2]).len() <= 4);
    let short = [0.0f32; 2];
    let allowed = [1u8; 2];
    let one_scale = [1.0f32];
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let masked = Scores {
        additive_mask: Some(&short),
        allowed_mask: Some(&allowed),
        row_scale: Some(&one_scale),
        ..Scores::default()
    };
    let y = masked.forward(false, &x, 2, 3);
    assert_eq!(y, Scores::default().forward(false, &x, 2, 3));
    assert_eq!(masked.forward(false, &x[..4], 2, 3).len(), 3);
    assert_eq!(softmax_f64(&x[..5], 2, 3).len(), 3);
    assert!(!deviation(&[0.5, 0.5], &[0.5, 0.5, 0.0], 2).within(1e-3));
    assert!(!value_deviation(&[0.5], &[0.5, 0.5]).within(1e-3));
}

/// A floored deviation judges values smaller than the floor against the floor, and larger
/// ones as the plain deviation does.
#[test]
fn floored_deviation_judges_small_values_against_the_floor() {
    let (actual, expected) = ([0.01001_f32], [0.01]);
    assert!(!value_deviation(&actual, &expected).within(1e-5));
    assert!(floored_value_deviation(&actual, &expected, 1.0).within(1e-4));
    let (actual, expected) = ([100.001_f32, f32::NEG_INFINITY], [100.0, f64::NEG_INFINITY]);
    assert_eq!(
        floored_value_deviation(&actual, &expected, 1.0),
        value_deviation(&actual, &expected)
    );
}

/// The order-preserving key of a float: larger floats, larger keys (`-inf` lowest).
fn ordered_key(x: f32) -> u32 {
    let bits = x.to_bits();
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
}

/// The key of the `k`-th largest of `keys` (1-based), found as the planned kernel finds it:
/// four passes over the row, each a histogram of one byte of the keys that match the bytes
/// found so far, walked from the top.
fn kth_largest_key_by_radix(keys: &[u32], k: usize) -> u32 {
    let (mut prefix, mut mask, mut remaining) = (0u32, 0u32, k);
    for shift in [24, 16, 8, 0] {
        let mut histogram = [0usize; 256];
        for &key in keys.iter().filter(|&&key| key & mask == prefix) {
            histogram[((key >> shift) & 0xff) as usize] += 1;
        }
        let mut digit = 255;
        while histogram[digit] < remaining {
            remaining -= histogram[digit];
            digit -= 1;
        }
        prefix |= (digit as u32) << shift;
        mask |= 0xff << shift;
    }
    prefix
}

/// Top-k through the radix threshold keeps what the reference keeps: the columns above the
/// k-th largest logit, then the lowest columns equal to it (rows with many ties included).
#[test]
fn the_radix_threshold_keeps_the_references_top_k() {
    use softmax::reference::{SamplingReference, filtered_distribution_f64};
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for trial in 0..300 {
        let cols = 1 + (next() % 300) as usize;
        // Few distinct values in half the rows, so ties straddle the threshold.
        let levels = if trial % 2 == 0 { 5 } else { 1000 };
        let logits: Vec<f32> = (0..cols)
            .map(|_| (next() % levels) as f32 * 0.37 - 20.0)
            .collect();
        let k = 1 + (next() as usize % cols);
        let filters = SamplingReference {
            temperature: 1.0,
            top_k: Some(k),
            top_p: None,
            min_p: None,
        };
        let expected: Vec<bool> = filtered_distribution_f64(&logits, &filters)
            .iter()
            .map(|&p| p > 0.0)
            .collect();
        let keys: Vec<u32> = logits.iter().map(|&x| ordered_key(x)).collect();
        let threshold = kth_largest_key_by_radix(&keys, k);
        let above = keys.iter().filter(|&&key| key > threshold).count();
        let mut ties_left = k - above;
        let kept: Vec<bool> = keys
            .iter()
            .map(|&key| {
                if key > threshold {
                    true
                } else if key == threshold && ties_left > 0 {
                    ties_left -= 1;
                    true
                } else {
                    false
                }
            })
            .collect();
        assert_eq!(kept, expected, "trial {trial}: {cols} columns, k = {k}");
    }
}

/// The reference spreads large matrices' rows over threads: every row of a matrix past that
/// size gets exactly the values it gets alone, for the softmax, the scores' forward passes,
/// the backward pass and cross-entropy with every option on.
#[test]
fn reference_rows_are_the_same_alone_and_in_a_large_matrix() {
    let (rows, cols) = (67, 20_011);
    let value = |i: usize| ((i * 2_654_435_761) % 20_000) as f32 / 1000.0 - 10.0;
    let x: Vec<f32> = (0..rows * cols).map(value).collect();
    let dy: Vec<f32> = (0..rows * cols).map(|i| value(i + 7) / 10.0).collect();
    let scale: Vec<f64> = (0..rows).map(|r| 1.0 + r as f64 / 8.0).collect();
    let additive: Vec<f32> = (0..cols).map(|c| value(c + 3) / 5.0).collect();
    let scores = Scores {
        additive_mask: Some(&additive),
        ..Scores::default()
    };
    let weight: Vec<f32> = (0..cols).map(|c| 0.5 + (c % 3) as f32).collect();
    let targets: Vec<i64> = (0..rows as i64).map(|r| (r * 997) % cols as i64).collect();
    let options = CrossEntropyReference {
        label_smoothing: 0.1,
        z_loss: 1e-4,
        softcap: 30.0,
        weight: Some(&weight),
        reduction: Reduction::Sum,
        ..CrossEntropyReference::default()
    };
    let whole_softmax = softmax_f64(&x, rows, cols);
    let whole_log = scores.forward(true, &x, rows, cols);
    let whole_states = scores.states(&x, rows, cols);
    let whole_backward = backward_f64(false, &x, &dy, cols, &scale);
    let whole_entropy = cross_entropy_f64(&x, rows, cols, &targets, &options);
    for r in 0..rows {
        let span = r * cols..(r + 1) * cols;
        let row = &x[span.clone()];
        assert_eq!(softmax_f64(row, 1, cols), whole_softmax[span.clone()]);
        // The row's scores see mask row 0, as every row of the whole matrix does.
        assert_eq!(scores.forward(true, row, 1, cols), whole_log[span.clone()]);
        assert_eq!(scores.states(row, 1, cols), [whole_states[r]]);
        let alone = backward_f64(false, row, &dy[span.clone()], cols, &scale[r..=r]);
        assert_eq!(alone, whole_backward[span.clone()]);
        let alone = cross_entropy_f64(row, 1, cols, &targets[r..=r], &options);
        assert_eq!(alone.losses, [whole_entropy.losses[r]]);
        assert_eq!(alone.lse, [whole_entropy.lse[r]]);
        assert_eq!(alone.gradient, whole_entropy.gradient[span]);
    }
    assert_eq!(
        whole_entropy.reduced,
        whole_entropy.losses.iter().sum::<f64>()
    );
}
