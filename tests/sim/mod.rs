//! What the simulations share: the oracle that checks every returned value against the history.

#[allow(dead_code)] // each simulation uses its own subset
pub mod oracle;
