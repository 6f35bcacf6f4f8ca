//! Tests of the attention sums: every tier against one sum at a time, bit for bit.
use super::*;
use crate::ops::dot_f64;

/// Values with a wide exponent range, some zeros of either sign, so that the order of the
/// additions shows in the last bits.
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let k = u32::try_from(i).unwrap_or(0).wrapping_mul(2_654_435_761) ^ seed;
            match k % 17 {
                0 => 0.0,
                1 => -0.0,
                _ => {
                    let e = f32::from(u16::try_from(k % 23).unwrap_or(0)) - 11.0;
                    let s = f32::from(u16::try_from(k % 1000).unwrap_or(0)) / 1000.0 - 0.5;
                    s * e.exp2()
                }
            }
        })
        .collect()
}

/// The weighted sums one at a time: row `r`, column `a` of `[p.len(), width]` is
/// `Σ_i p[r][i] · m[i · stride + a]` in f64 from `+0.0` in increasing `i`, rounded to f32.
fn one_sum_at_a_time(p: &[&[f32]], m: &[f32], stride: usize, width: usize) -> Vec<f32> {
    let mut want = vec![0.0f32; p.len() * width];
    for (r, pr) in p.iter().enumerate() {
        for a in 0..width {
            let mut acc = 0.0f64;
            for (i, &x) in pr.iter().enumerate() {
                acc += f64::from(x) * f64::from(m[i * stride + a]);
            }
            #[allow(clippy::cast_possible_truncation)]
            {
                want[r * width + a] = acc as f32;
            }
        }
    }
    want
}

#[test]
fn weighted_rows_match_one_sum_at_a_time_on_every_tier() {
    for (rows, width, n) in [
        (1, 16, 1),
        (3, 37, 5),
        (4, 512, 9),
        (9, 33, 17),
        (6, 64, 3),
        (13, 128, 20),
        (17, 48, 9),
        (33, 16, 5),
    ] {
        let lens: Vec<usize> = (0..rows).map(|r| (n + r) % (n + 1)).collect();
        weighted_rows_match_on_every_tier(&lens, (width, width), n, (7, 100));
    }
}

/// Rows of `lens` weights over `n` positions `stride` apart, `width` columns: every tier
/// gives [`one_sum_at_a_time`]'s bits.
fn weighted_rows_match_on_every_tier(
    lens: &[usize],
    (width, stride): (usize, usize),
    n: usize,
    (seed, row_seed): (u32, u32),
) {
    let m = values(n * stride, seed);
    let pv: Vec<Vec<f32>> = lens.iter().zip(row_seed..).map(|(&l, r)| values(l, r)).collect();
    let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
    let want = one_sum_at_a_time(&p, &m, stride, width);
    for isa in Isa::available() {
        let mut got = vec![f32::NAN; p.len() * width];
        weighted_rows_on(isa, &p, &m, stride, width, &mut got);
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{isa} {}x{width}x{n} at {j}", p.len());
        }
    }
}

#[test]
fn avx2_prefill_sums_read_every_position_once_a_row_group_from_two_l1_sets_now_blocks_same_bits() {
    // A prefill part's shape: several sets of eight causal rows of one KV head, its 128
    // values in cache rows of 512 (2 KiB apart), over positions that cross several of the
    // AVX2 tier's blocks; odd row counts, rows shorter than their pair's partner, a width
    // with a partial last tile, and rows shorter than a block.
    for (rows, width, stride, n) in [
        (32, 128, 512, 100),
        (9, 128, 512, 70),
        (16, 40, 48, 65),
        (11, 16, 16, 33),
        (24, 128, 512, 20),
    ] {
        let lens: Vec<usize> = (0..rows).map(|r| n - (r * 5) % 9).collect();
        weighted_rows_match_on_every_tier(&lens, (width, stride), n, (11, 300));
    }
}

#[test]
fn a_decode_steps_sums_read_from_memory_now_name_blocks_ahead_same_bits() {
    // A decode step's shape (one vector of rows, rows of equal length, a head's values in
    // a wider row): the sums name their rows to the prefetcher a block of 32 positions
    // ahead, so lengths around and across blocks; every sum is the one-at-a-time sum.
    let (width, stride) = (48, 80);
    for (rows, n) in [(8, 31), (8, 32), (8, 33), (8, 97), (5, 70), (1, 65)] {
        let m = values(n * stride, 21);
        let pv: Vec<Vec<f32>> = (0..rows).zip(400u32..).map(|(_, s)| values(n, s)).collect();
        let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
        let q: Vec<[f32; LANES]> =
            (0..width).map(|a| std::array::from_fn(|l| pv[l % rows][a % n])).collect();
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; rows * width];
            weighted_rows_on(isa, &p, &m, stride, width, &mut got);
            let mut dots = vec![[f64::NAN; LANES]; n];
            dot_sets_on(isa, &q, 1, &m, stride, n, &mut dots);
            let want = one_sum_at_a_time(&p, &m, stride, width);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{isa} {rows}x{n} at {j}");
            }
            for (pos, d) in dots.iter().enumerate() {
                for (l, &dl) in d.iter().enumerate() {
                    let col: Vec<f32> = q.iter().map(|v| v[l]).collect();
                    let want = dot_f64(&col, &m[pos * stride..][..width]);
                    assert_eq!(dl.to_bits(), want.to_bits(), "{isa} score {pos} lane {l}");
                }
            }
        }
    }
}

#[test]
fn dot_lanes_match_dot_f64_on_every_tier() {
    for (w, npos) in [(1, 1), (64, 3), (512, 9), (37, 4), (33, 17)] {
        let m = values(npos * w, 3);
        let cols: Vec<Vec<f32>> = (50u32..).take(LANES).map(|seed| values(w, seed)).collect();
        let q: Vec<[f32; LANES]> = (0..w).map(|a| std::array::from_fn(|l| cols[l][a])).collect();
        for isa in Isa::available() {
            let mut got = vec![[f64::NAN; LANES]; npos];
            dot_lanes_with(isa, &q, &m, npos, &mut got);
            for (pos, g) in got.iter().enumerate() {
                for (l, col) in cols.iter().enumerate() {
                    let want = dot_f64(col, &m[pos * w..(pos + 1) * w]);
                    assert_eq!(g[l].to_bits(), want.to_bits(), "{isa} w {w} pos {pos} lane {l}");
                }
            }
        }
    }
}

#[test]
fn grouped_heads_read_their_shared_keys_once_per_head_now_once_per_set_of_heads() {
    // Sets of query lanes against the same strided rows: each set's sums are its own
    // `dot_lanes` sums, whatever the tier's tile of sets and positions (and the widened
    // blocks of a row: widths around a block's 32 values).
    for (sets, w, stride, npos) in
        [(1, 31, 31, 3), (4, 32, 40, 9), (5, 33, 33, 5), (8, 128, 512, 13), (9, 64, 96, 2)]
    {
        let m = values(npos * stride, 11);
        let cols: Vec<Vec<f32>> =
            (300u32..).take(LANES * sets).map(|seed| values(w, seed)).collect();
        let cols = &cols;
        let q: Vec<[f32; LANES]> = (0..sets)
            .flat_map(|s| (0..w).map(move |a| std::array::from_fn(|l| cols[s * LANES + l][a])))
            .collect::<Vec<_>>();
        for isa in Isa::available() {
            let mut got = vec![[f64::NAN; LANES]; sets * npos];
            dot_sets_on(isa, &q, sets, &m, stride, npos, &mut got);
            for s in 0..sets {
                for pos in 0..npos {
                    for l in 0..LANES {
                        let want = dot_f64(&cols[s * LANES + l], &m[pos * stride..][..w]);
                        let g = got[s * npos + pos][l];
                        assert_eq!(g.to_bits(), want.to_bits(), "{isa} {sets}x{w} {s} {pos} {l}");
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_query_attention_summed_one_f64_at_a_time_now_a_head_in_strided_lanes() {
    // One head's keys and values inside a cache row of every KV head (Qwen3's layout):
    // rows `stride` apart from the head's offset, each sum still the one-at-a-time one.
    for (w, stride, off, npos) in [(64, 256, 128, 9), (37, 40, 3, 5), (128, 512, 0, 17)] {
        let m = values(npos * stride, 9);
        let head = &m[off..];
        let cols: Vec<Vec<f32>> = (70u32..).take(LANES).map(|seed| values(w, seed)).collect();
        let q: Vec<[f32; LANES]> = (0..w).map(|a| std::array::from_fn(|l| cols[l][a])).collect();
        let pv: Vec<Vec<f32>> = (1..=npos).zip(200u32..).map(|(l, s)| values(l, s)).collect();
        let p: Vec<&[f32]> = pv.iter().map(Vec::as_slice).collect();
        for isa in Isa::available() {
            let mut got = vec![[f64::NAN; LANES]; npos];
            dot_lanes_on(isa, &q, head, stride, npos, &mut got);
            for (pos, g) in got.iter().enumerate() {
                for (l, col) in cols.iter().enumerate() {
                    let want = dot_f64(col, &head[pos * stride..][..w]);
                    assert_eq!(g[l].to_bits(), want.to_bits(), "{isa} dot {w}/{stride} {pos}");
                }
            }
            let mut out = vec![f32::NAN; npos * w];
            weighted_rows_on(isa, &p, head, stride, w, &mut out);
            let want = one_sum_at_a_time(&p, head, stride, w);
            for (j, (o, v)) in out.iter().zip(&want).enumerate() {
                assert_eq!(o.to_bits(), v.to_bits(), "{isa} sum at {j}");
            }
        }
    }
}

#[test]
fn latent_heads_read_the_cache_once_per_head_now_once_per_set_and_each_row_keeps_its_bits() {
    absorbed_heads_match_one_head_at_a_time(70, 5, 5);
}

#[test]
fn a_decode_step_scored_each_head_in_one_lane_of_eight_now_eight_heads_fill_the_lanes() {
    // Decode's single rows (eight heads a lane set; 33 heads: five lane sets, one nearly
    // empty) and a verification's 3 rows of 4 heads (pairs straddle lane sets).
    for (first, g, heads) in [(70, 1, 9), (130, 1, 33), (3, 3, 4), (9, 2, 8)] {
        absorbed_heads_match_one_head_at_a_time(first, g, heads);
    }
}

fn absorbed_heads_match_one_head_at_a_time(first: usize, g: usize, heads: usize) {
    let d = Absorbed { nope: 40, rope: 8, kl: 48, scale: 0.3 };
    let npos = first + g;
    let (lat, pe) = (values(npos * d.kl, 21), values(npos * d.rope, 22));
    let w_uk: Vec<Vec<f32>> =
        (30u32..).take(heads).map(|seed| values(d.nope * d.kl, seed)).collect();
    let q: Vec<Vec<f32>> =
        (60u32..).take(heads * g).map(|seed| values(d.nope + d.rope, seed)).collect();
    let rows: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
    let mut want = vec![0.0f32; heads * g * d.kl];
    for (h, (w, out)) in w_uk.iter().zip(want.chunks_mut(g * d.kl)).enumerate() {
        attend(&d, &rows[h * g..(h + 1) * g], w, &lat, &pe, first, out);
    }
    let w: Vec<&[f32]> = w_uk.iter().map(Vec::as_slice).collect();
    let mut got = vec![f32::NAN; heads * g * d.kl];
    attend_heads(&d, &rows, &w, &lat, &pe, first, &mut got);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{heads} heads of {g} rows: head {} row {} col {}",
            i / (g * d.kl),
            i / d.kl % g,
            i % d.kl
        );
    }
}

#[test]
fn negative_zero_sums_keep_their_sign() {
    // `Iterator::sum` starts from -0.0: a dot product of negative-zero products is -0.0.
    let q = vec![[-0.0f32; LANES]; 5];
    let m = vec![1.0f32; 5];
    for isa in Isa::available() {
        let mut got = vec![[0.0f64; LANES]; 1];
        dot_lanes_with(isa, &q, &m, 1, &mut got);
        assert!(got[0].iter().all(|v| v.to_bits() == (-0.0f64).to_bits()), "{isa}");
        let mut out = [f32::NAN; 16];
        weighted_rows_with(isa, &[&[-0.0f32][..]], &m[..16.min(m.len())], 5, &mut out[..5]);
        assert!(out[..5].iter().all(|v| v.to_bits() == 0), "{isa}: columns start at +0.0");
    }
}
