//! Host-side atomic access to flags in host-visible memory. (Being written.)
