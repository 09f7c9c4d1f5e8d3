//! Philox4x32-10 (Salmon, Moraes, Dror and Shaw, SC11): four 32-bit words from a 128-bit
//! counter and a 64-bit key, ten rounds of multiplications whose high and low halves are
//! mixed with the other words and the key. It keeps no state: the same (counter, key) gives
//! the same words on the host and on the device, so a draw is replayed from its seed, offset
//! and row alone. Pure arithmetic, compiled for the host too.

/// The two round multipliers.
const MULTIPLIERS: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];

/// What the key gains after each round (the golden ratio and √3 − 1, as 32-bit fractions).
const KEY_STEP: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// The four words of `counter` under `key`.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut words = counter;
    let mut key = key;
    for _ in 0..10 {
        let first = u64::from(MULTIPLIERS[0]) * u64::from(words[0]);
        let second = u64::from(MULTIPLIERS[1]) * u64::from(words[2]);
        words = [
            (second >> 32) as u32 ^ words[1] ^ key[0],
            second as u32,
            (first >> 32) as u32 ^ words[3] ^ key[1],
            first as u32,
        ];
        key = [
            key[0].wrapping_add(KEY_STEP[0]),
            key[1].wrapping_add(KEY_STEP[1]),
        ];
    }
    words
}

/// The words for `row` of a call seeded with `seed` at `offset`: the counter is the offset's
/// two halves, the row and `draw` (which of a row's blocks of four words), the key the seed's
/// two halves.
#[inline(always)]
pub fn draw_words(seed: u64, offset: u64, row: u32, draw: u32) -> [u32; 4] {
    philox4x32_10(
        [offset as u32, (offset >> 32) as u32, row, draw],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A uniform number in the open interval (0, 1) from the top 23 bits of `bits`: the middle of
/// one of 2²³ equal steps (exact in f32, from 2⁻²⁴ to 1 − 2⁻²⁴), so neither it nor `1 − u` is
/// 0 and `−ln(−ln u)` (a Gumbel draw) is finite.
#[inline(always)]
pub fn uniform_open(bits: u32) -> f32 {
    ((bits >> 9) as f32 + 0.5) * (1.0 / 8_388_608.0)
}
