//! Planning: the order tensors are written in ([`order`]), how they are
//! packed into shards ([`pack`]), and what a load of the result will cost
//! ([`fit`]). A plan is plain serde data: `convert --dry-run` prints it and
//! `convert` executes it.

pub mod order;
