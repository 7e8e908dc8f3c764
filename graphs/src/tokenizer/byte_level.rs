//! GPT-2 byte-level alphabet: every byte maps to a printable char so that BPE
//! vocabularies can be stored as strings.

/// The char standing for each byte (GPT-2 `bytes_to_unicode`).
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        table[b as usize] = char::from_u32(c).expect("all values are valid chars");
    }
    table
}

/// Inverse of `byte_to_char`, indexed by char code (all codes are < 324).
pub fn char_to_byte() -> Vec<Option<u8>> {
    let mut inv = vec![None; 324];
    for (b, c) in byte_to_char().iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

/// Appends the bytes of a byte-level token string to `out`; chars outside the alphabet (which a
/// well-formed vocabulary never has) are kept as their UTF-8 encoding.
pub fn decode_token_into(piece: &str, inv: &[Option<u8>], out: &mut Vec<u8>) {
    for c in piece.chars() {
        match inv.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}
