//! specdec
