//! What the simulations share: the oracle that checks every returned value against the history.

pub mod oracle;
