//! `SLUICE_ISA` parsing, refusal of tiers the CPU lacks, and the process-wide choice. One test
//! in its own binary, because it changes the process environment.

use sluice_kernels::isa::{isa, Isa, IsaError, ISA_ENV};

#[test]
fn env_forces_refuses_and_sticks() {
    std::env::set_var(ISA_ENV, "sse9");
    assert!(matches!(Isa::from_env(), Err(IsaError::Unknown { .. })));
    for tier in Isa::ALL {
        std::env::set_var(ISA_ENV, tier.name().to_uppercase());
        if tier.is_available() {
            assert_eq!(Isa::from_env(), Ok(Some(tier)));
        } else {
            assert_eq!(Isa::from_env(), Err(IsaError::Unsupported { isa: tier }));
        }
    }
    std::env::set_var(ISA_ENV, "");
    assert_eq!(Isa::from_env(), Ok(None));

    // The first call decides for the whole process; later changes have no effect.
    std::env::set_var(ISA_ENV, "scalar");
    assert_eq!(isa(), Isa::Scalar);
    std::env::set_var(ISA_ENV, Isa::detect().name());
    assert_eq!(isa(), Isa::Scalar);
}
