//! corpus-tools
