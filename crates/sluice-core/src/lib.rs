//! Shared vocabulary of sluice: element types as they appear in checkpoints, the memory
//! budget every large allocation is charged to, and small numeric helpers (bf16/f16 bit
//! conversion) that every other crate needs and that do no I/O and no math beyond a cast.

pub mod budget;
pub mod dtype;

pub use budget::{BudgetError, MemoryBudget};
pub use dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16_rne, DType};
