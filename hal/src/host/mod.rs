//! The host backend. (Being written.)
