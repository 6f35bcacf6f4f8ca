//! Tests of the combination order and the layer batch: batched == per-expert bit for bit,
//! over rows, pools, formats and batch caps.

use super::batch::Batch;
use super::*;
use sluice_kernels::matmul;
use sluice_store::{AllExperts, ExpertStore, ExpertView};

#[test]
fn an_expert_activation_run_whole_on_the_engine_thread_left_the_helpers_idle() {
    // gate, up and the activation in one pool call, in place: bit for bit the two
    // projections and an activation over the whole, on any pool.
    let (n, d_in, inter) = (3, 200, 300);
    let vals = |k: usize, s: f32| -> Vec<f32> {
        (0..k).map(|i| (i as f32 * s).sin() * 3.0).collect::<Vec<f32>>()
    };
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (gw, uw) = (bytes(&vals(inter * d_in, 0.37)), bytes(&vals(inter * d_in, 0.11)));
    let g = Matrix::f32(inter, d_in, &gw).expect("gate");
    let u = Matrix::f32(inter, d_in, &uw).expect("up");
    let x = vals(n * d_in, 0.23);
    let glu = |g: &[f32], u: &[f32], o: &mut [f32]| {
        sluice_kernels::ops::situ_glu(g, u, 4.0, Some(8.0), o);
    };
    let (mut gate, mut up) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
    matmul(&g, &x, n, &mut gate);
    matmul(&u, &x, n, &mut up);
    let mut whole = vec![0.0f32; n * inter];
    glu(&gate, &up, &mut whole);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for threads in [1, 2, 3, 16] {
        let pool = sluice_kernels::Pool::new(threads).expect("pool");
        for rows in 1..=n {
            let (mut a, mut b) = (vec![f32::NAN; rows * inter], vec![f32::NAN; rows * inter]);
            pool.install(|| gate_up_act(&g, &u, &glu, &x[..rows * d_in], rows, &mut a, &mut b));
            assert_eq!(bits(&a), bits(&whole[..rows * inter]), "{threads} threads, {rows} rows");
        }
    }
}

/// Experts held in memory: a store that hands them all at once when `all`, else one by one.
struct Held<'a> {
    experts: &'a [Vec<Vec<u8>>],
    all: bool,
}

impl Held<'_> {
    fn view(&self, id: u32) -> ExpertView<'_> {
        let parts: Vec<&[u8]> = self.experts[id as usize].iter().map(Vec::as_slice).collect();
        ExpertView::new(&parts).expect("at most MAX_PARTS parts")
    }
}

impl ExpertStore for Held<'_> {
    fn for_each(
        &self,
        _layer: usize,
        ids: &[u32],
        f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut order = ids.to_vec();
        order.sort_unstable();
        order.into_iter().try_for_each(|id| f(id, self.view(id)))
    }

    fn with_all(
        &self,
        _layer: usize,
        ids: &[u32],
        f: &mut AllExperts<'_>,
    ) -> Result<bool, StoreError> {
        if !self.all {
            return Ok(false);
        }
        let mut order = ids.to_vec();
        order.sort_unstable();
        let all: Vec<_> = order.into_iter().map(|id| (id, self.view(id))).collect();
        f(&all)?;
        Ok(true)
    }

    fn stats(&self) -> sluice_store::StoreStats {
        sluice_store::StoreStats::default()
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f32 {
        // 24 random bits, in [-1, 1).
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn bytes(&mut self, n: usize, f: impl Fn(u8) -> u8) -> Vec<u8> {
        (0..n).map(|_| f(self.next().to_le_bytes()[3])).collect()
    }
}

/// Hidden width, expert width, experts, experts a row.
const D: usize = 256;
const INTER: usize = 64;
const E: usize = 12;
const K: usize = 8;

/// `E` experts' parts in `mxfp4` or bf16: gate, up, down (MXFP4: each packed, then scales).
fn experts(mxfp4: bool, rng: &mut Rng) -> Vec<Vec<Vec<u8>>> {
    let matrix = |rng: &mut Rng, rows: usize, cols: usize| -> Vec<Vec<u8>> {
        if mxfp4 {
            // Scales near 2^0, so sums stay finite.
            vec![rng.bytes(rows * cols / 2, |b| b), rng.bytes(rows * cols / 32, |b| 122 + b % 8)]
        } else {
            let v: Vec<u8> = (0..rows * cols)
                .flat_map(|_| {
                    let hi = (rng.unit() * 0.2).to_bits() >> 16;
                    u16::try_from(hi).expect("16 bits").to_le_bytes()
                })
                .collect();
            vec![v]
        }
    };
    (0..E)
        .map(|_| {
            let mut parts = matrix(rng, INTER, D);
            parts.extend(matrix(rng, INTER, D));
            parts.extend(matrix(rng, D, INTER));
            parts
        })
        .collect()
}

/// An expert's gate, up and down matrices from its view.
fn matrices<'v>(mxfp4: bool, v: &ExpertView<'v>) -> Result<[Matrix<'v>; 3], StoreError> {
    let m = if mxfp4 {
        [
            Matrix::mxfp4(INTER, D, v.part(0), v.part(1)),
            Matrix::mxfp4(INTER, D, v.part(2), v.part(3)),
            Matrix::mxfp4(D, INTER, v.part(4), v.part(5)),
        ]
    } else {
        [
            Matrix::bf16(INTER, D, v.part(0)),
            Matrix::bf16(INTER, D, v.part(1)),
            Matrix::bf16(D, INTER, v.part(2)),
        ]
    };
    let [Ok(g), Ok(u), Ok(d)] = m else {
        return Err(StoreError::Consumer("expert shape".into()));
    };
    Ok([g, u, d])
}

/// `t` rows' routes: each row's `K` distinct experts, with weights.
struct Routes {
    users: Vec<Vec<(usize, usize)>>,
    ids: Vec<u32>,
    weights: Vec<[f32; K]>,
}

fn routes(t: usize, rng: &mut Rng) -> Routes {
    let mut users = vec![Vec::new(); E];
    let mut weights = Vec::new();
    for row in 0..t {
        let mut ids: Vec<usize> = (0..E).collect();
        for i in 0..K {
            let j = i + usize::try_from(rng.next() % (E - i) as u64).expect("small");
            ids.swap(i, j);
            users[ids[i]].push((row, i));
        }
        weights.push(std::array::from_fn(|_| rng.unit().abs() + 0.01));
    }
    let ids =
        (0..E).filter(|&i| !users[i].is_empty()).map(|i| u32::try_from(i).expect("few")).collect();
    Routes { users, ids, weights }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_layers_small_experts_made_two_pool_calls_each_now_three_for_the_layer() {
    // The whole layer handed at once: three pool calls (gate/up/activation, down, the
    // weighted sums; the last on the engine thread when small) and a fourth for the gather of
    // the rows' inputs when it is large, bit for bit the per-expert
    // path's sums, at every T up to 40 and on pools of 1 to 16 threads, bf16 and MXFP4.
    let pools: Vec<_> = [1, 2, 3, 16].map(|n| sluice_kernels::Pool::new(n).expect("pool")).into();
    let mut rng = Rng(0x5EED_0020);
    for mxfp4 in [false, true] {
        let held = experts(mxfp4, &mut rng);
        for t in 1..=40 {
            let r = routes(t, &mut rng);
            let x: Vec<f32> = (0..t * D).map(|_| rng.unit()).collect();
            for pool in &pools {
                let layer = |all: bool| {
                    let store = Held { experts: &held, all };
                    let mut out = vec![0.0f32; t * D];
                    let before = pool.counters();
                    pool.install(|| {
                        GluExpert::default().run_layer(
                            &store,
                            0,
                            &r.ids,
                            None,
                            |_, v| matrices(mxfp4, v),
                            sluice_kernels::ops::silu_glu,
                            &r.users,
                            crate::ROW_BLOCK,
                            &x,
                            |row, slot| r.weights[row][slot],
                            &mut out,
                        )
                    })
                    .expect("layer");
                    (out, pool.counters().since(&before).calls)
                };
                let ((each, each_calls), (all, all_calls)) = (layer(false), layer(true));
                let at = format!("mxfp4 {mxfp4}, {t} rows, {} threads", pool.threads());
                assert_eq!(bits(&all), bits(&each), "{at}");
                assert!(all_calls <= 4, "{at}: {all_calls} pool calls");
                // Experts of 4 rows or more are worth splitting: two calls each, one by one.
                if pool.threads() > 1 && r.users.iter().all(|u| u.is_empty() || u.len() >= 4) {
                    assert!(each_calls >= 2 * r.ids.len() as u64, "{at}: {each_calls}");
                    assert!(all_calls >= 2, "{at}: {all_calls} pool calls");
                }
            }
        }
    }
}

#[test]
fn a_layer_over_the_batch_cap_runs_in_batches_with_the_same_bits() {
    // Batches of a few experts, and experts too large for any batch (cap 0) on the
    // per-expert path: the same sums as every expert one by one.
    let mut rng = Rng(0xCA9_0020);
    let held = experts(true, &mut rng);
    let pool = sluice_kernels::Pool::new(3).expect("pool");
    let t = 29;
    let r = routes(t, &mut rng);
    let x: Vec<f32> = (0..t * D).map(|_| rng.unit()).collect();
    let store = Held { experts: &held, all: true };
    let ms: Vec<_> =
        r.ids.iter().map(|&id| (id, matrices(true, &store.view(id)).expect("matrices"))).collect();
    let weight = |row: usize, slot: usize| r.weights[row][slot];
    let mut each = vec![0.0f32; t * D];
    let mut batch = GluExpert::default();
    pool.install(|| {
        for (id, [g, u, d]) in &ms {
            let users = &r.users[*id as usize];
            batch.run([g, u, d], sluice_kernels::ops::silu_glu, users, 7, &x, weight, &mut each);
        }
    });
    let one = t * K / E * ((2 * INTER + D + 1) * 4 + size_of::<usize>());
    for cap in [0, one, 3 * one, LAYER_BATCH_BYTES] {
        let mut out = vec![0.0f32; t * D];
        let glu = sluice_kernels::ops::silu_glu;
        let mut b = Batch::default();
        pool.install(|| {
            batch.run_batches(&mut b, &ms, cap, &glu, &r.users, 7, &x, &weight, &mut out);
        });
        assert!(b.held() <= cap, "cap {cap}: {} bytes held", b.held());
        assert_eq!(bits(&out), bits(&each), "cap {cap}");
    }
}

#[test]
fn an_expert_out_of_id_order_is_an_error_naming_both() {
    let mut o = IdOrder::new(3);
    o.next(1).expect("first");
    o.next(5).expect("ascending");
    let e = o.next(4).expect_err("descending").to_string();
    assert!(e.contains("expert 4 of layer 3 after expert 5"), "{e}");
    assert!(o.next(5).is_err(), "a repeated id is out of order too");
}
