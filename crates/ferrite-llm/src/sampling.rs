//! Choosing the next token from logits on the host: greedy, or sampling
//! with temperature, top-k and top-p from a seeded generator (the same
//! seed gives the same tokens on every platform).

/// How the next token is chosen.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// 0 (or below): greedy (argmax, the lowest id on ties).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability
    /// reaches p (1: all).
    pub top_p: f32,
    /// Seed of the generator.
    pub seed: u64,
}

impl Sampling {
    /// Whether these options always choose the most likely token (what
    /// [`sample`] does then is [`argmax`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// splitmix64: small, fast and the same everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The index of the largest logit (the first on ties; NaN never wins; 0
/// when none is above negative infinity).
///
/// Greedy decoding runs this over the whole vocabulary at every step on
/// the host, between two device calls: the largest value is found first
/// with LANES independent running maxima (which the compiler keeps in
/// vector registers: a single running maximum with its index is a serial
/// dependency chain, about 8x slower over 49,152 logits), then its first
/// index.
pub fn argmax(logits: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // Not `f32::max`: a NaN must never replace the maximum.
            *m = if v > *m { v } else { *m };
        }
    }
    let mut best_v = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        if v > best_v {
            best_v = v;
        }
    }
    if best_v == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == best_v).unwrap_or(0)
}

/// Chooses a token from `logits`.
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    if s.is_greedy() {
        return argmax(logits);
    }
    let mut idx: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    if idx.is_empty() {
        return argmax(logits);
    }
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.top_k > 0 && s.top_k < idx.len() {
        idx.truncate(s.top_k);
    }
    let t = f64::from(s.temperature);
    let max = f64::from(logits[idx[0]]);
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| ((f64::from(logits[i]) - max) / t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (n, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= f64::from(s.top_p) {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
        idx.truncate(keep);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let mut r = rng.next_f64();
    for (n, p) in probs.iter().enumerate() {
        if r < *p {
            return idx[n];
        }
        r -= p;
    }
    idx[idx.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-maximum scan `argmax` replaces.
    fn argmax_serial(logits: &[f32]) -> usize {
        let mut best = 0;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &v) in logits.iter().enumerate() {
            if v > best_v {
                best = i;
                best_v = v;
            }
        }
        best
    }

    #[test]
    fn argmax_equals_the_serial_scan_with_ties_nans_and_infinities() {
        let mut rng = Rng::new(7);
        for n in [0, 1, 5, 15, 16, 17, 33, 1000, 49152] {
            for case in 0..6 {
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = rng.next_f64();
                        match case {
                            // Few distinct values: many ties.
                            0 => (r * 4.0).floor() as f32,
                            1 if r < 0.3 => f32::NAN,
                            2 if r < 0.5 => f32::NEG_INFINITY,
                            3 => f32::NEG_INFINITY,
                            4 if r < 0.1 => f32::INFINITY,
                            _ => (r * 20.0 - 10.0) as f32,
                        }
                    })
                    .collect();
                assert_eq!(argmax(&v), argmax_serial(&v), "n {n}, case {case}");
            }
        }
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 1.0]), 1);
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
    }

    #[test]
    fn greedy_picks_the_largest_first_on_ties() {
        assert_eq!(argmax(&[0.0, 3.0, 1.0, 3.0]), 1);
        assert_eq!(
            sample(&[0.0, 3.0, 1.0], &Sampling::default(), &mut Rng::new(1)),
            1
        );
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_small_keeps_the_best() {
        let l = [1.0, 5.0, 4.9, 0.0];
        let s = Sampling {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
            seed: 0,
        };
        assert_eq!(sample(&l, &s, &mut Rng::new(3)), 1);
        let s = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
            seed: 0,
        };
        for seed in 0..20 {
            assert_eq!(sample(&l, &s, &mut Rng::new(seed)), 1);
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let l = [0.0f32, (3.0f32).ln()]; // probabilities 1/4, 3/4
        let s = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        };
        let mut rng = Rng::new(7);
        let n = 20000;
        let ones = (0..n).filter(|_| sample(&l, &s, &mut rng) == 1).count();
        let f = ones as f64 / n as f64;
        assert!((f - 0.75).abs() < 0.02, "{f}");
        let a: Vec<usize> = {
            let mut r = Rng::new(9);
            (0..50).map(|_| sample(&l, &s, &mut r)).collect()
        };
        let b: Vec<usize> = {
            let mut r = Rng::new(9);
            (0..50).map(|_| sample(&l, &s, &mut r)).collect()
        };
        assert_eq!(a, b);
    }
}
