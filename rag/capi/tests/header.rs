//! The checked-in header is the one cbindgen generates from the sources.

#[test]
fn checked_in_header_is_up_to_date() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/rag.h"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/rag.h");
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        generated == checked_in,
        "{path} is out of date: copy {}/rag.h over it",
        env!("OUT_DIR")
    );
}
