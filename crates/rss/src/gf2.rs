//! Linear algebra over GF(2) on bit vectors packed in `u64`s.
//!
//! The Toeplitz hash is linear in its input bits: `hash(a ^ b) = hash(a) ^ hash(b)`. Rank tells
//! how many output bits a key can produce; the XOR basis below solves "which combination of free
//! input bits yields this hash pattern" exactly, which is how the picker places flows on queues.

/// Rank over GF(2) of a set of row vectors.
pub fn rank(rows: &[u64]) -> u32 {
    let mut basis = XorBasis::default();
    for &r in rows {
        basis.insert(r, 0);
    }
    basis.rank()
}

/// An XOR basis that remembers, for each basis vector, which inputs were combined to make it.
///
/// Vectors are reduced by their highest set bit (one basis vector per leading bit), so insertion
/// and reduction cost at most 64 steps. Inputs that reduce to zero are kept as kernel vectors: a
/// combination of inputs whose images cancel out.
#[derive(Debug, Default, Clone)]
pub struct XorBasis {
    /// `by_lead[b]` = (vector with leading bit `b`, combination of inputs), if any.
    by_lead: Vec<Option<(u64, u64)>>,
    kernel: Vec<u64>,
}

impl XorBasis {
    /// Adds the vector `v`, the image of the input combination `combo`.
    pub fn insert(&mut self, v: u64, combo: u64) {
        if self.by_lead.is_empty() {
            self.by_lead = vec![None; 64];
        }
        let (rest, combo) = self.reduce(v, combo);
        if rest == 0 {
            self.kernel.push(combo);
        } else {
            let lead = 63 - rest.leading_zeros() as usize;
            self.by_lead[lead] = Some((rest, combo));
        }
    }

    /// Reduces `v` (with its combination) by the basis; returns what is left and the combination.
    fn reduce(&self, mut v: u64, mut combo: u64) -> (u64, u64) {
        while v != 0 {
            let lead = 63 - v.leading_zeros() as usize;
            match self.by_lead.get(lead).copied().flatten() {
                Some((bv, bc)) => {
                    v ^= bv;
                    combo ^= bc;
                }
                None => break,
            }
        }
        (v, combo)
    }

    /// Number of independent vectors inserted.
    pub fn rank(&self) -> u32 {
        self.by_lead.iter().filter(|e| e.is_some()).count() as u32
    }

    /// A combination of inputs whose image is `target`, or `None` when `target` is outside the
    /// span. Every other solution is this one XOR any combination of [`XorBasis::kernel`].
    pub fn solve(&self, target: u64) -> Option<u64> {
        let (rest, combo) = self.reduce(target, 0);
        (rest == 0).then_some(combo)
    }

    /// Input combinations with image zero (a basis of the solution space of `image = 0`).
    pub fn kernel(&self) -> &[u64] {
        &self.kernel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_of_dependent_rows() {
        assert_eq!(rank(&[]), 0);
        assert_eq!(rank(&[0b1, 0b10, 0b11]), 2);
        assert_eq!(rank(&[0, 0]), 0);
        assert_eq!(rank(&(0..64).map(|i| 1u64 << i).collect::<Vec<_>>()), 64);
    }

    #[test]
    fn solve_and_kernel() {
        // Inputs x0..x2 map to 0b01, 0b10, 0b11: x2 = x0 ^ x1, so the kernel is {x0^x1^x2}.
        let mut b = XorBasis::default();
        for (i, v) in [0b01u64, 0b10, 0b11].into_iter().enumerate() {
            b.insert(v, 1 << i);
        }
        assert_eq!(b.rank(), 2);
        assert_eq!(b.kernel(), &[0b111]);
        let x = b.solve(0b11).expect("0b11 is in the span");
        let image = (0..3)
            .filter(|i| x >> i & 1 == 1)
            .fold(0, |acc, i| acc ^ [1, 2, 3][i]);
        assert_eq!(image, 0b11);
        assert_eq!(b.solve(0b100), None);
    }
}
