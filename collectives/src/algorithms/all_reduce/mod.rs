//! The allreduce algorithms: every rank gets the reduction of every rank's input.

pub mod nvls;
pub mod one_shot;
pub mod one_shot_ll128;
pub mod port_channel;
pub mod two_shot;
pub mod two_shot_push;
pub mod two_shot_zc;
