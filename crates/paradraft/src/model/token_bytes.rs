//! Each token's bytes, as constrained decoding needs them: the grammar is matched against the
//! bytes a token adds to the text, not against its decoded string (a byte-level BPE token may
//! hold half of a character). Special and control tokens have none.

use super::spm::Spm;
use std::collections::HashMap;
use tokenizers::Tokenizer as HfTokenizer;

/// GPT-2's byte ↔ character table, inverted: byte-level vocabularies spell byte b as the
/// printable character it maps to (33–126, 161–172 and 174–255 as themselves, the rest as
/// U+0100 onwards, in order).
fn byte_level_inverse() -> HashMap<char, u8> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut m = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        m.insert(char::from_u32(c).unwrap_or('\u{FFFD}'), b as u8);
    }
    m
}

/// The byte of a `<0xXX>` token.
fn byte_token(t: &str) -> Option<u8> {
    let h = t.strip_prefix("<0x")?.strip_suffix('>')?;
    (h.len() == 2).then(|| u8::from_str_radix(h, 16).ok())?
}

/// Bytes of every id of an HF tokenizer (byte-level BPE, or SentencePiece-style with `▁` and
/// `<0xXX>` byte tokens); `None` for special tokens.
pub(crate) fn hf(tok: &HfTokenizer) -> Vec<Option<Vec<u8>>> {
    let byte_level = tok
        .get_decoder()
        .and_then(|d| serde_json::to_string(d).ok())
        .is_some_and(|s| s.contains("\"ByteLevel\""));
    let inverse = byte_level_inverse();
    let added = tok.get_added_tokens_decoder();
    (0..tok.get_vocab_size(true) as u32)
        .map(|id| {
            if let Some(a) = added.get(&id) {
                return (!a.special).then(|| a.content.as_bytes().to_vec());
            }
            let t = tok.id_to_token(id)?;
            Some(if byte_level {
                t.chars()
                    .flat_map(|c| match inverse.get(&c) {
                        Some(&b) => vec![b],
                        None => c.to_string().into_bytes(),
                    })
                    .collect()
            } else if let Some(b) = byte_token(&t) {
                vec![b]
            } else {
                t.replace('▁', " ").into_bytes()
            })
        })
        .collect()
}

/// Bytes of every id of a GGUF SentencePiece vocabulary.
pub(crate) fn spm(m: &Spm) -> Vec<Option<Vec<u8>>> {
    (0..m.vocab_size() as u32)
        .map(|id| m.token_bytes(id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_table_is_a_bijection() {
        let m = byte_level_inverse();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
        let mut bytes: Vec<u8> = m.values().copied().collect();
        bytes.sort();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        assert_eq!(byte_token("<0x0A>"), Some(10));
        assert_eq!(byte_token("<0x0A0>"), None);
    }
}
