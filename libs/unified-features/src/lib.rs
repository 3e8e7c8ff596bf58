//! `primus-unified-features`: no code. Its dependencies name the features that the services'
//! optional parts (the `kubernetes`, `hdfs`, `burn` and `cuda` features) turn on in
//! dependencies the services share, so that every build of the services resolves those
//! dependencies alike and cargo builds each of them once: the quickstart's build without the
//! optional parts, the workspace's with them, and the model's `cuda` tests.
