//! Typed handles of the engine's objects.
//!
//! Every object the engine hands out is named by a 32-bit number, but the
//! numbers of different objects are not interchangeable: a CQ handle passed
//! where a PD is expected is a bug the compiler should catch. Each kind of
//! number therefore has its own `Copy` newtype:
//!
//! | type | names | comes from |
//! |---|---|---|
//! | [`PdHandle`] | a protection domain | [`crate::Engine::alloc_pd`] |
//! | [`CqHandle`] | a completion queue | [`crate::Engine::create_cq`] |
//! | [`SrqHandle`] | a shared receive queue | [`crate::Engine::create_srq`] |
//! | [`AhHandle`] | an address handle | [`crate::Engine::create_ah`] |
//! | [`Qpn`] | a queue pair (its 24-bit number, also a wire value) | [`crate::Engine::create_qp`], packets, peers |
//! | [`Lkey`] | a memory region, for local access | [`crate::Engine::reg_mr`] |
//! | [`Rkey`] | a memory region or window, for remote access (a wire value) | [`crate::Engine::reg_mr`], [`crate::Engine::alloc_mw`], peers |
//! | [`MwHandle`] | a memory window | [`crate::Engine::alloc_mw`] |
//!
//! There is no `From<u32>` for any of them, so a bare number cannot slip in
//! silently. A number that legitimately arrives from outside — in a packet,
//! through the C ABI, in a peer's connection message — becomes a handle
//! with the explicit `from_raw`; where the wire or the C ABI needs the
//! number, `raw()` (or `u32::from`) gives it back. `Display` and `{:x}`
//! print the bare number; `Debug` names the type. `Default` is 0, which the
//! engine never hands out for any of them.
//!
//! A CQ handle is not a PD handle:
//!
//! ```compile_fail,E0308
//! use softrdma_engine::{Engine, EngineConfig};
//! let mut e = Engine::new(EngineConfig::new(softrdma_engine::sim::node_addr(0)));
//! let cq = e.create_cq(4).unwrap();
//! e.dealloc_pd(cq).unwrap(); // expected `PdHandle`, found `CqHandle`
//! ```
//!
//! nor is a bare number:
//!
//! ```compile_fail,E0308
//! use softrdma_engine::{Engine, EngineConfig};
//! let mut e = Engine::new(EngineConfig::new(softrdma_engine::sim::node_addr(0)));
//! e.dealloc_pd(1).unwrap(); // expected `PdHandle`, found integer
//! ```
//!
//! while the typed call compiles:
//!
//! ```
//! use softrdma_engine::{Engine, EngineConfig};
//! let mut e = Engine::new(EngineConfig::new(softrdma_engine::sim::node_addr(0)));
//! let pd = e.alloc_pd();
//! e.dealloc_pd(pd).unwrap();
//! ```

use core::fmt;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(u32);

        impl $name {
            /// The handle for a number that arrived from outside (a packet,
            /// the C ABI, a peer's message). Whether it names an existing
            /// object is for the engine call that takes it to decide.
            pub const fn from_raw(raw: u32) -> Self {
                $name(raw)
            }

            /// The bare number, for the wire, the C ABI and messages to peers.
            pub const fn raw(self) -> u32 {
                self.0
            }
        }

        impl From<$name> for u32 {
            fn from(h: $name) -> u32 {
                h.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

handle!(
    /// A protection domain ([`crate::Engine::alloc_pd`]).
    PdHandle
);
handle!(
    /// A completion queue ([`crate::Engine::create_cq`]).
    CqHandle
);
handle!(
    /// A shared receive queue ([`crate::Engine::create_srq`]).
    SrqHandle
);
handle!(
    /// An XRC domain ([`crate::Engine::alloc_xrcd`]).
    XrcdHandle
);
handle!(
    /// An address handle ([`crate::Engine::create_ah`]).
    AhHandle
);
handle!(
    /// A queue pair number: 24 bits, the engine's name for a QP and the
    /// BTH's destination QP on the wire (so also a peer's QP, and a UD
    /// completion's source QP).
    Qpn
);
handle!(
    /// The local key of a memory region, as scatter/gather elements name it.
    Lkey
);
handle!(
    /// The remote key of a memory region or window, as RDMA requests from
    /// peers carry it.
    Rkey
);
handle!(
    /// A memory window ([`crate::Engine::alloc_mw`]): the 24-bit index its
    /// rkeys share (the rkey is `index << 8 | key`).
    MwHandle
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_round_trips() {
        for n in [0, 1, 0x00ff_ffff, 0xdead_beef, u32::MAX] {
            assert_eq!(PdHandle::from_raw(n).raw(), n);
            assert_eq!(CqHandle::from_raw(n).raw(), n);
            assert_eq!(SrqHandle::from_raw(n).raw(), n);
            assert_eq!(AhHandle::from_raw(n).raw(), n);
            assert_eq!(u32::from(Qpn::from_raw(n)), n);
            assert_eq!(u32::from(Lkey::from_raw(n)), n);
            assert_eq!(u32::from(Rkey::from_raw(n)), n);
        }
    }

    #[test]
    fn order_and_equality_follow_the_number() {
        assert!(Qpn::from_raw(2) < Qpn::from_raw(0x10));
        assert_eq!(Rkey::from_raw(7), Rkey::from_raw(7));
        assert_ne!(Lkey::from_raw(7), Lkey::from_raw(8));
        assert_eq!(Lkey::default().raw(), 0);
    }

    #[test]
    fn formatting() {
        let q = Qpn::from_raw(0x1234);
        assert_eq!(format!("{q}"), "4660");
        assert_eq!(format!("{q:x}"), "1234");
        assert_eq!(format!("{q:#08x}"), "0x001234");
        assert_eq!(format!("{q:?}"), "Qpn(0x1234)");
    }
}
