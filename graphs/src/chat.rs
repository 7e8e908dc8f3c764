//! chat
