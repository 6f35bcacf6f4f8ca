//! Shared helpers for the streaming-store tests: the committed tiny Kimi K3 checkpoints, the
//! K3 expert naming (as `sluice-models` defines it; that crate depends on this one, so the
//! few lines are repeated here), and byte-for-byte comparison against `MappedExperts`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use sluice_core::MemoryBudget;
use sluice_store::{
    ExpertLayout, ExpertPart, ExpertStore, ExpertView, MappedExperts, ReadAt, StreamingConfig,
    StreamingExperts,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The fixture directory of `name` (`tiny-a`, `tiny-b`).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3").join(name)
}

/// Names of one K3 expert's six tensors (w1 gate, w2 down, w3 up; packed + scale).
pub fn k3_names(prefix: &str, layer: usize, e: usize) -> [String; 6] {
    let p = format!("{prefix}model.layers.{layer}.block_sparse_moe.experts.{e}");
    [
        format!("{p}.w1.weight_packed"),
        format!("{p}.w1.weight_scale"),
        format!("{p}.w2.weight_packed"),
        format!("{p}.w2.weight_scale"),
        format!("{p}.w3.weight_packed"),
        format!("{p}.w3.weight_scale"),
    ]
}

/// The layout of one K3 expert: six MXFP4 tensors (w1 gate, w2 down, w3 up; packed + scale).
#[derive(Debug, Clone)]
pub struct K3Layout {
    /// Expert FFN width.
    pub inter: u64,
    /// Expert input width.
    pub hidden: u64,
}

impl ExpertLayout for K3Layout {
    fn parts(&self, layer: usize, e: usize) -> Vec<ExpertPart> {
        let (i, h) = (self.inter, self.hidden);
        let shapes = [[i, h / 2], [i, h / 32], [h, i / 2], [h, i / 32], [i, h / 2], [i, h / 32]];
        k3_names("", layer, e)
            .into_iter()
            .zip(shapes)
            .map(|(n, s)| ExpertPart::whole(n, DType::U8, &s))
            .collect()
    }
}

/// An opened fixture and its MoE layout, read from `config.json`.
pub struct Fixture {
    pub ckpt: Arc<Checkpoint>,
    pub num_layers: usize,
    pub moe_layers: Vec<usize>,
    pub experts: usize,
    pub names: K3Layout,
}

impl Fixture {
    /// Opens fixture `name` from the repository.
    pub fn open(name: &str) -> Self {
        Self::open_dir(&fixture(name))
    }

    /// Opens a fixture directory (e.g. a copy on another file system).
    pub fn open_dir(dir: &Path) -> Self {
        let ckpt = Arc::new(Checkpoint::open(dir).expect("fixture opens"));
        let c = ckpt.config().text_config().clone();
        let u = |k: &str| {
            usize::try_from(c[k].as_u64().unwrap_or_else(|| panic!("config {k}"))).unwrap()
        };
        let num_layers = u("num_hidden_layers");
        let (first, freq, experts) =
            (u("first_k_dense_replace"), u("moe_layer_freq"), u("num_experts"));
        let moe_layers = (0..num_layers).filter(|&i| i >= first && i % freq == 0).collect();
        let width =
            c["routed_expert_hidden_size"].as_u64().unwrap_or(c["hidden_size"].as_u64().unwrap());
        let names = K3Layout { inter: c["moe_intermediate_size"].as_u64().unwrap(), hidden: width };
        Self { ckpt, num_layers, moe_layers, experts, names }
    }

    pub fn mapped(&self) -> MappedExperts {
        MappedExperts::open(
            self.ckpt.clone(),
            self.num_layers,
            &self.moe_layers,
            self.experts,
            &self.names,
        )
        .expect("mapped store opens")
    }

    pub fn streaming(&self, cfg: &StreamingConfig) -> StreamingExperts {
        self.try_streaming(cfg, &MemoryBudget::unlimited()).expect("streaming store opens")
    }

    pub fn try_streaming(
        &self,
        cfg: &StreamingConfig,
        budget: &MemoryBudget,
    ) -> Result<StreamingExperts, sluice_store::StoreError> {
        StreamingExperts::open(
            &self.ckpt,
            self.num_layers,
            &self.moe_layers,
            self.experts,
            &self.names,
            cfg,
            budget,
        )
    }

    /// A streaming store reading through `reader` (e.g. a fault injector).
    pub fn streaming_with(
        &self,
        reader: Arc<dyn ReadAt>,
        cfg: &StreamingConfig,
    ) -> StreamingExperts {
        let index = sluice_store::ExpertIndex::build(
            &self.ckpt,
            self.num_layers,
            &self.moe_layers,
            self.experts,
            &self.names,
        )
        .expect("index builds");
        StreamingExperts::new(index, reader, cfg, &MemoryBudget::unlimited()).expect("store opens")
    }

    pub fn all_ids(&self) -> Vec<u32> {
        (0..n32(self.experts)).collect()
    }
}

/// `x` as a `u32` (fixture sizes are small).
pub fn n32(x: usize) -> u32 {
    u32::try_from(x).expect("small")
}

/// The parts of a view, concatenated.
pub fn flat(v: &ExpertView<'_>) -> Vec<u8> {
    v.parts().concat()
}

/// Every expert of `ids` from `store`, as flat bytes, checking each id is served once.
pub fn collect(
    store: &dyn ExpertStore,
    layer: usize,
    ids: &[u32],
) -> Result<BTreeMap<u32, Vec<u8>>, sluice_store::StoreError> {
    let mut out = BTreeMap::new();
    store.for_each(layer, ids, &mut |id, v| {
        assert!(out.insert(id, flat(&v)).is_none(), "expert {id} served twice");
        Ok(())
    })?;
    assert_eq!(out.len(), ids.len(), "every id served");
    Ok(out)
}

/// Reference bytes of every expert of every MoE layer, from the mapped store.
pub fn reference(fx: &Fixture) -> BTreeMap<(usize, u32), Vec<u8>> {
    let mapped = fx.mapped();
    let mut out = BTreeMap::new();
    for &l in &fx.moe_layers {
        for (id, b) in collect(&mapped, l, &fx.all_ids()).expect("mapped serves") {
            out.insert((l, id), b);
        }
    }
    out
}

/// Asserts that `got` equals the reference for `layer`.
pub fn assert_same(
    reference: &BTreeMap<(usize, u32), Vec<u8>>,
    layer: usize,
    got: &BTreeMap<u32, Vec<u8>>,
    what: &str,
) {
    for (id, bytes) in got {
        let want = &reference[&(layer, *id)];
        assert!(
            bytes == want,
            "{what}: expert {id} of layer {layer} differs from the mapped bytes"
        );
    }
}
