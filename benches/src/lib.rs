//! End-to-end benchmarks live in `benches/` (`cargo bench -p primus-benches`); this crate
//! has no library code of its own.
