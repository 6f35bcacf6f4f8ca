//! Kimi K3 pass time on the committed fixtures: one row (plain decode) against eight rows
//! (a verification pass), both after 16 committed positions. Run with
//! `cargo bench -p sluice-models --bench k3_pass`.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_checkpoint::Checkpoint;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn load(name: &str) -> KimiK3 {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3").join(name);
    KimiK3::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
}

fn passes(c: &mut Criterion) {
    let mut g = c.benchmark_group("k3_pass");
    g.measurement_time(Duration::from_secs(3)).sample_size(20);
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name);
        let mut base = m.new_state();
        let prefix: Vec<u32> = (1..=16).collect();
        m.forward(&mut base, &prefix, LogitRows::Last, None).unwrap();
        base.commit(16);
        for t in [1usize, 8] {
            let rows: Vec<u32> = (100..100 + t as u32).collect();
            g.bench_function(format!("{name}/T={t}"), |b| {
                let mut st = base.clone();
                b.iter(|| {
                    let l = m.forward(&mut st, &rows, LogitRows::All, None).unwrap();
                    st.rollback();
                    l
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);
