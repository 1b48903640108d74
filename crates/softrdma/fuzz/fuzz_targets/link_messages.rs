//! Everything a same-host peer sends over a link's socket, as the device
//! checks it (`softrdma::linkmsg::check_from_peer`): a message of any bytes,
//! and the size of the memfd that came with it. The first 8 input bytes are
//! the size, the rest the message. Never panics; whatever is accepted
//! encodes to itself, and an accepted grant lies inside its memfd.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma::linkmsg::{check_from_peer, LinkMsg, MAX_SEGMENT};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let size = u64::from_le_bytes(data[..8].try_into().unwrap());
    if let Ok(m) = check_from_peer(&data[8..], size) {
        assert_eq!(LinkMsg::parse(&m.to_bytes()), Ok(m));
        if let LinkMsg::Grant(g) = m {
            assert!(g.offset + g.len <= size && size <= MAX_SEGMENT);
        }
    }
});
