//! Passing file descriptors between processes over Unix sockets. (Being written.)
