//! Byte views of element slices (with `capi.rs`, the only unsafe code of
//! the crate).

use crate::elem::Element;

/// The bytes of `s`.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `Element` is sealed and implemented only for primitive
    // integers, floats and half's f16/bf16 (repr(transparent) over u16):
    // no padding, so every byte is initialised; u8 has alignment 1 and the
    // length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of `s`, writable.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; in addition every bit pattern is a valid
    // value of each of those types, so any bytes written are a valid `T`,
    // and the borrow is exclusive for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}
