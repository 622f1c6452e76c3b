//! llama.cpp's rotary row permutation, forward: the order the GGUF writer
//! puts a Llama q or k projection's rows in.
//!
//! `convert_hf_to_gguf.py`'s `LlamaModel.permute` reshapes each head's `d`
//! rows as `(2, d/2)` and swaps the two axes
//! (`w.reshape(n_head, 2, d // 2, ...).swapaxes(1, 2)`), turning
//! transformers' half-split rotary layout into ggml's interleaved one.
//! [`unpermuted_row`](super::unpermuted_row) is the inverse.

/// The Hugging Face row that GGUF row `row` of one head of `head_rows`
/// rows holds (both counted inside the head): GGUF row `2 * i + j` is
/// Hugging Face row `j * d/2 + i` (half `j`, pair `i`).
pub fn permuted_row(row: u64, head_rows: u64) -> u64 {
    (row % 2) * (head_rows / 2) + row / 2
}

/// Writes the rows of `src` (whole heads of `head_rows` rows of
/// `row_bytes` bytes each, in Hugging Face order) into `dst` in GGUF order.
/// `dst` and `src` have the same length, a multiple of one head's bytes.
pub fn permute_heads(src: &[u8], dst: &mut [u8], head_rows: usize, row_bytes: usize) {
    let head_bytes = head_rows * row_bytes;
    debug_assert!(head_bytes > 0 && src.len() == dst.len() && src.len().is_multiple_of(head_bytes));
    for (s, d) in src
        .chunks_exact(head_bytes)
        .zip(dst.chunks_exact_mut(head_bytes))
    {
        for (g, out) in d.chunks_exact_mut(row_bytes).enumerate() {
            let h = permuted_row(g as u64, head_rows as u64) as usize;
            out.copy_from_slice(&s[h * row_bytes..(h + 1) * row_bytes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::unpermuted_row;
    use super::*;

    /// numpy's `np.arange(rows).reshape(heads, 2, d // 2).swapaxes(1, 2)
    /// .reshape(-1)`, element by element: GGUF row `g` holds row `out[g]`.
    fn numpy_forward(rows: u64, heads: u64) -> Vec<u64> {
        let d = rows / heads;
        let mut out = Vec::new();
        for h in 0..heads {
            for b in 0..d / 2 {
                for a in 0..2 {
                    out.push(h * d + a * (d / 2) + b);
                }
            }
        }
        out
    }

    #[test]
    fn forward_matches_numpy_by_hand() {
        // np.arange(8).reshape(1, 2, 4).swapaxes(1, 2).reshape(8)
        let rows: Vec<u64> = (0..8).map(|g| permuted_row(g, 8)).collect();
        assert_eq!(rows, [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(numpy_forward(8, 1), rows);
        // Heads of 2 rows stay as they are.
        assert_eq!(
            (0..2).map(|g| permuted_row(g, 2)).collect::<Vec<_>>(),
            [0, 1]
        );
    }

    #[test]
    fn forward_matches_numpy_and_the_inverse_undoes_it() {
        for heads in 1..6u64 {
            for half in 1..9u64 {
                let d = 2 * half;
                let numpy = numpy_forward(heads * d, heads);
                for g in 0..heads * d {
                    let (h, r) = (g / d, g % d);
                    assert_eq!(h * d + permuted_row(r, d), numpy[g as usize]);
                    assert_eq!(unpermuted_row(permuted_row(r, d), d), r);
                    assert_eq!(permuted_row(unpermuted_row(r, d), d), r);
                }
            }
        }
    }

    #[test]
    fn rows_move_whole_head_by_head() {
        // Two heads of 4 rows, 3 bytes a row; row r holds bytes [r; 3].
        let src: Vec<u8> = (0..8u8).flat_map(|r| [r; 3]).collect();
        let mut dst = vec![0; src.len()];
        permute_heads(&src, &mut dst, 4, 3);
        let order: Vec<u8> = dst.chunks(3).map(|c| c[0]).collect();
        assert_eq!(order, [0, 2, 1, 3, 4, 6, 5, 7]);
        let want: Vec<u8> = numpy_forward(8, 2)
            .iter()
            .flat_map(|&r| [r as u8; 3])
            .collect();
        assert_eq!(dst, want);
    }
}
