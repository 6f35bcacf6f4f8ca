//! The Kimi K3 tensor roster (K3.md §3.2): every spine tensor of every layer resolved once at
//! load into typed handles, with dtype and shape checked against the config. A checkpoint that
//! contradicts its config fails here with the shard file and tensor named; nothing on the hot
//! path formats a name or looks one up.

use super::config::{AttnKind, K3Config};
use crate::ModelError;
use sluice_checkpoint::{Checkpoint, TensorEntry};
use sluice_core::{bf16_to_f32, DType};
use sluice_kernels::WeightFormat;

/// A resolved weight matrix `[rows, cols]` in the checkpoint: the weight handle every family
/// shares ([`crate::linear::Linear`]), under the name K3's code has always used.
pub use crate::linear::Linear as Mat;

/// KDA layer weights.
#[derive(Debug)]
pub struct KdaWeights {
    pub(crate) q_proj: Mat,
    pub(crate) k_proj: Mat,
    pub(crate) v_proj: Mat,
    /// Conv taps `[P, kernel]` for q, k, v.
    pub(crate) conv: [Vec<f32>; 3],
    pub(crate) f_a: Mat,
    pub(crate) f_b: Mat,
    pub(crate) b_proj: Mat,
    /// `exp(A_log[h])` for the real heads (padding past `num_heads` ignored, K3.md §0.1).
    pub(crate) a_exp: Vec<f32>,
    pub(crate) dt_bias: Vec<f32>,
    pub(crate) o_norm: Vec<f32>,
    pub(crate) g_proj: Mat,
    pub(crate) o_proj: Mat,
}

/// MLA layer weights.
#[derive(Debug)]
pub struct MlaWeights {
    pub(crate) q_a: Mat,
    pub(crate) q_a_norm: Vec<f32>,
    pub(crate) q_b: Mat,
    pub(crate) kv_a: Mat,
    pub(crate) kv_a_norm: Vec<f32>,
    pub(crate) kv_b: Mat,
    pub(crate) g_proj: Option<Mat>,
    pub(crate) o_proj: Mat,
}

/// Dense SiTU-GLU MLP weights (layer 0 and the fused shared experts).
#[derive(Debug)]
pub struct MlpWeights {
    pub(crate) gate: Mat,
    pub(crate) up: Mat,
    pub(crate) down: Mat,
}

/// Latent MoE weights (routed experts come from the expert store).
#[derive(Debug)]
pub struct MoeWeights {
    pub(crate) router: Mat,
    pub(crate) bias: Vec<f32>,
    pub(crate) down: Option<Mat>,
    pub(crate) norm: Option<Vec<f32>>,
    pub(crate) up: Option<Mat>,
    pub(crate) shared: Option<MlpWeights>,
}

/// Attention of one layer.
#[derive(Debug)]
pub enum Attn {
    /// Kimi Delta Attention.
    Kda(Box<KdaWeights>),
    /// Gated NoPE MLA.
    Mla(Box<MlaWeights>),
}

/// Feed-forward of one layer.
#[derive(Debug)]
pub enum Ffn {
    /// Dense MLP.
    Dense(Box<MlpWeights>),
    /// Latent MoE.
    Moe(Box<MoeWeights>),
}

/// One decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    /// AttnRes folded weights `norm_w ⊙ proj_w` (mlx-lm `_attn_res_w_eff`), if AttnRes is on.
    pub(crate) attn_res: Option<Vec<f32>>,
    pub(crate) mlp_res: Option<Vec<f32>>,
    pub(crate) attn: Attn,
    pub(crate) ffn: Ffn,
}

impl LayerWeights {
    /// Every matrix of the layer (attention, dense MLP or the MoE's router, latent projections
    /// and shared experts), for naming the one that holds a bad value.
    pub(crate) fn mats(&self) -> Vec<&Mat> {
        let mut out: Vec<&Mat> = match &self.attn {
            Attn::Kda(w) => vec![
                &w.q_proj, &w.k_proj, &w.v_proj, &w.f_a, &w.f_b, &w.b_proj, &w.g_proj, &w.o_proj,
            ],
            Attn::Mla(w) => {
                let mut v = vec![&w.q_a, &w.q_b, &w.kv_a, &w.kv_b, &w.o_proj];
                v.extend(&w.g_proj);
                v
            }
        };
        match &self.ffn {
            Ffn::Dense(m) => out.extend([&m.gate, &m.up, &m.down]),
            Ffn::Moe(m) => {
                out.push(&m.router);
                out.extend(m.down.iter().chain(&m.up));
                if let Some(s) = &m.shared {
                    out.extend([&s.gate, &s.up, &s.down]);
                }
            }
        }
        out
    }
}

/// Every spine tensor of the model.
#[derive(Debug)]
pub struct K3Weights {
    pub(crate) embed: Mat,
    pub(crate) lm_head: Mat,
    pub(crate) norm: Vec<f32>,
    pub(crate) output_res: Option<Vec<f32>>,
    pub(crate) layers: Vec<LayerWeights>,
}

struct Roster<'a> {
    ckpt: &'a Checkpoint,
    prefix: String,
}

impl Roster<'_> {
    fn entry(&self, name: &str) -> Result<&TensorEntry, ModelError> {
        Ok(self.ckpt.tensor(&format!("{}{name}", self.prefix))?)
    }

    fn shape_err(&self, name: &str, e: &TensorEntry, expected: Vec<u64>) -> ModelError {
        ModelError::Checkpoint(sluice_checkpoint::CheckpointError::ShapeMismatch {
            file: self.ckpt.shard_file(e).to_path_buf(),
            tensor: format!("{}{name}", self.prefix),
            expected,
            got: e.shape.clone(),
        })
    }

    /// A BF16, F32 or row-int8 (I8 with its `NAME_scale` F16 `[rows]`) matrix of exactly
    /// `[rows, cols]`.
    fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat, ModelError> {
        let e = self.entry(name)?;
        let format = match e.dtype {
            DType::BF16 => WeightFormat::Bf16,
            DType::F32 => WeightFormat::F32,
            DType::I8 => WeightFormat::Int8Row,
            _ => return Err(self.dtype_err(name, e, DType::BF16)),
        };
        let want = vec![rows as u64, cols as u64];
        if e.shape != want {
            return Err(self.shape_err(name, e, want));
        }
        let scale = if format == WeightFormat::Int8Row {
            let scale =
                format!("{}{name}{}", self.prefix, sluice_checkpoint::convert::SCALE_SUFFIX);
            Some(self.ckpt.expect(&scale, DType::F16, &[rows as u64])?.clone())
        } else {
            None
        };
        Ok(Mat::new(e.clone(), scale, rows, cols, format))
    }

    fn dtype_err(&self, name: &str, e: &TensorEntry, expected: DType) -> ModelError {
        ModelError::Checkpoint(sluice_checkpoint::CheckpointError::DTypeMismatch {
            file: self.ckpt.shard_file(e).to_path_buf(),
            tensor: format!("{}{name}", self.prefix),
            expected,
            got: e.dtype,
        })
    }

    /// A small BF16/F32 tensor of `shape` widened to f32, every value finite.
    fn vec(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let v = self.vec_any(name, shape)?;
        crate::finite::checked(self.ckpt, self.entry(name)?, v)
    }

    /// A small BF16/F32 tensor of `shape` widened to f32, values unchecked.
    fn vec_any(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let e = self.entry(name)?;
        if e.shape != shape {
            return Err(self.shape_err(name, e, shape.to_vec()));
        }
        let b = self.ckpt.bytes(e);
        match e.dtype {
            DType::BF16 => Ok(b
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect()),
            DType::F32 => Ok(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            _ => Err(self.dtype_err(name, e, DType::F32)),
        }
    }

    fn mlp(&self, p: &str, d: usize, inter: usize) -> Result<MlpWeights, ModelError> {
        Ok(MlpWeights {
            gate: self.mat(&format!("{p}.gate_proj.weight"), inter, d)?,
            up: self.mat(&format!("{p}.up_proj.weight"), inter, d)?,
            down: self.mat(&format!("{p}.down_proj.weight"), d, inter)?,
        })
    }

    /// AttnRes folded weight `norm ⊙ proj` (f32 product, as mlx-lm folds it).
    fn res(&self, norm: &str, proj: &str, d: usize) -> Result<Vec<f32>, ModelError> {
        let n = self.vec(norm, &[d as u64])?;
        let p = self.vec(proj, &[1, d as u64])?;
        Ok(n.iter().zip(&p).map(|(a, b)| a * b).collect())
    }

    fn kda(&self, p: &str, c: &K3Config) -> Result<KdaWeights, ModelError> {
        let d = c.hidden_size;
        let la = &c.linear_attn_config;
        let (h, hd, kk) = (la.num_heads, la.head_dim, la.short_conv_kernel_size);
        let pw = c.kda_proj();
        let conv =
            |n: &str| self.vec(&format!("{p}.{n}_conv1d.weight"), &[pw as u64, 1, kk as u64]);
        // A_log is stored padded (K3: [128] for 96 heads); only the first num_heads are real.
        let a_name = format!("{p}.A_log");
        let ae = self.entry(&a_name)?;
        let n_a = ae.shape.iter().product::<u64>();
        if ae.shape.len() != 1 || n_a < h as u64 {
            return Err(self.shape_err(&a_name, ae, vec![h as u64]));
        }
        // Only the real heads must be finite: the padding is never read.
        let mut a_log = self.vec_any(&a_name, &ae.shape.clone())?;
        a_log.truncate(h);
        let a_log = crate::finite::checked(self.ckpt, ae, a_log)?;
        if !la.use_full_rank_gate {
            return Err(ModelError::Config(
                "use_full_rank_gate = false (g_a/g_b gate) is not supported".into(),
            ));
        }
        Ok(KdaWeights {
            q_proj: self.mat(&format!("{p}.q_proj.weight"), pw, d)?,
            k_proj: self.mat(&format!("{p}.k_proj.weight"), pw, d)?,
            v_proj: self.mat(&format!("{p}.v_proj.weight"), pw, d)?,
            conv: [conv("q")?, conv("k")?, conv("v")?],
            f_a: self.mat(&format!("{p}.f_a_proj.weight"), hd, d)?,
            f_b: self.mat(&format!("{p}.f_b_proj.weight"), pw, hd)?,
            b_proj: self.mat(&format!("{p}.b_proj.weight"), h, d)?,
            a_exp: a_log[..h].iter().map(|a| a.exp()).collect(),
            dt_bias: self.vec(&format!("{p}.dt_bias"), &[pw as u64])?,
            o_norm: self.vec(&format!("{p}.o_norm.weight"), &[hd as u64])?,
            g_proj: self.mat(&format!("{p}.g_proj.weight"), pw, d)?,
            o_proj: self.mat(&format!("{p}.o_proj.weight"), d, pw)?,
        })
    }

    fn mla(&self, p: &str, c: &K3Config) -> Result<MlaWeights, ModelError> {
        let d = c.hidden_size;
        let h = c.num_attention_heads;
        let (ql, kl, r) = (c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim);
        Ok(MlaWeights {
            q_a: self.mat(&format!("{p}.q_a_proj.weight"), ql, d)?,
            q_a_norm: self.vec(&format!("{p}.q_a_layernorm.weight"), &[ql as u64])?,
            q_b: self.mat(&format!("{p}.q_b_proj.weight"), h * c.mla_qk_dim(), ql)?,
            kv_a: self.mat(&format!("{p}.kv_a_proj_with_mqa.weight"), kl + r, d)?,
            kv_a_norm: self.vec(&format!("{p}.kv_a_layernorm.weight"), &[kl as u64])?,
            kv_b: self.mat(
                &format!("{p}.kv_b_proj.weight"),
                h * (c.qk_nope_head_dim + c.v_head_dim),
                kl,
            )?,
            g_proj: if c.mla_use_output_gate {
                Some(self.mat(&format!("{p}.g_proj.weight"), h * c.v_head_dim, d)?)
            } else {
                None
            },
            o_proj: self.mat(&format!("{p}.o_proj.weight"), d, h * c.v_head_dim)?,
        })
    }

    fn moe(&self, p: &str, c: &K3Config) -> Result<MoeWeights, ModelError> {
        let d = c.hidden_size;
        let e = c.num_experts;
        let latent = c.routed_expert_hidden_size;
        Ok(MoeWeights {
            router: self.mat(&format!("{p}.gate.weight"), e, d)?,
            bias: self.vec(&format!("{p}.gate.e_score_correction_bias"), &[e as u64])?,
            down: latent
                .map(|l| self.mat(&format!("{p}.routed_expert_down_proj.weight"), l, d))
                .transpose()?,
            norm: match latent {
                Some(l) if c.latent_moe_use_norm => {
                    Some(self.vec(&format!("{p}.routed_expert_norm.weight"), &[l as u64])?)
                }
                _ => None,
            },
            up: latent
                .map(|l| self.mat(&format!("{p}.routed_expert_up_proj.weight"), d, l))
                .transpose()?,
            shared: if c.num_shared_experts > 0 {
                Some(self.mlp(
                    &format!("{p}.shared_experts"),
                    d,
                    c.moe_intermediate_size * c.num_shared_experts,
                )?)
            } else {
                None
            },
        })
    }
}

impl K3Weights {
    /// Resolves and checks every spine tensor named by the config.
    pub fn load(ckpt: &Checkpoint, c: &K3Config) -> Result<Self, ModelError> {
        let r = Roster { ckpt, prefix: ckpt.name_prefix().to_string() };
        let d = c.hidden_size;
        let du = d as u64;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let (attn_res, mlp_res) = if c.attn_res_block_size.is_some() {
                (
                    Some(r.res(
                        &format!("{p}.self_attention_res_norm.weight"),
                        &format!("{p}.self_attention_res_proj.weight"),
                        d,
                    )?),
                    Some(r.res(
                        &format!("{p}.mlp_res_norm.weight"),
                        &format!("{p}.mlp_res_proj.weight"),
                        d,
                    )?),
                )
            } else {
                (None, None)
            };
            let attn = match c.attn_kind(i) {
                AttnKind::Kda => Attn::Kda(Box::new(r.kda(&format!("{p}.self_attn"), c)?)),
                AttnKind::Mla => Attn::Mla(Box::new(r.mla(&format!("{p}.self_attn"), c)?)),
            };
            let ffn = if c.is_moe(i) {
                Ffn::Moe(Box::new(r.moe(&format!("{p}.block_sparse_moe"), c)?))
            } else {
                Ffn::Dense(Box::new(r.mlp(&format!("{p}.mlp"), d, c.intermediate_size)?))
            };
            layers.push(LayerWeights {
                input_norm: r.vec(&format!("{p}.input_layernorm.weight"), &[du])?,
                post_norm: r.vec(&format!("{p}.post_attention_layernorm.weight"), &[du])?,
                attn_res,
                mlp_res,
                attn,
                ffn,
            });
        }
        Ok(Self {
            embed: r.mat("model.embed_tokens.weight", c.vocab_size, d)?,
            lm_head: r.mat("lm_head.weight", c.vocab_size, d)?,
            norm: r.vec("model.norm.weight", &[du])?,
            output_res: if c.attn_res_block_size.is_some() {
                Some(r.res(
                    "model.output_attn_res_norm.weight",
                    "model.output_attn_res_proj.weight",
                    d,
                )?)
            } else {
                None
            },
            layers,
        })
    }
}
